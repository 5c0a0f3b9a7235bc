"""One line per GPU: memory bar, memory busy % (time, not bandwidth), DRAM bandwidth %
(GPM), GPU utilisation and power. Simulated readings are marked as such, loudly."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from llmtop.textsafe import printable
from llmtop.tui import fmt
from llmtop.tui.palette import Palette
from llmtop.tui.snapview import SnapView, as_num, as_str
from llmtop.tui.widgets.base import ViewPanel

MAX_NARROW = 2


def bar(fraction: float | None, width: int, style: str, empty_style: str) -> Text:
    """A fill bar ``████░░░░`` of ``width`` cells; ``None`` draws an empty, dim bar."""
    t = Text()
    f = 0.0 if fraction is None else max(0.0, min(1.0, fraction))
    full = round(f * width)
    t.append("█" * full, style)
    t.append("░" * (width - full), empty_style)
    return t


_PLAIN_STATUS = re.compile(r"\d+ (simulated )?GPUs?")
"""A GPU source's line when all is well ("2 GPUs", "1 simulated GPU")."""


def no_gpu_reason(view: SnapView) -> str:
    """Why there are no GPU readings: the source's line (no NVIDIA GPU found, NVML's
    error, …) when the snapshot has it."""
    status = view.text("gpu_status")
    return printable(status) if status else "no GPU readings"


def gpu_trouble(view: SnapView) -> str | None:
    """The source's line when it says more than how many GPUs it reads ("GPU 1 lost")."""
    status = view.text("gpu_status")
    if not status or status == "starting" or _PLAIN_STATUS.fullmatch(status):
        return None
    return printable(status)


def is_simulated(view: SnapView, gpu: Mapping[str, Any]) -> bool:
    if gpu.get("simulated") is True:
        return True
    return (view.text("gpu_source") or "").lower() in ("sim", "simulated")


def mem_percent(gpu: Mapping[str, Any]) -> float | None:
    used, total = as_num(gpu.get("mem_used_bytes")), as_num(gpu.get("mem_total_bytes"))
    if used is None or not total:
        return None
    return 100.0 * used / total


def gpu_line(view: SnapView, gpu: Mapping[str, Any], pal: Palette, width: int,
             suffix: Text | None = None) -> Text:
    """The line for one GPU, with fewer details as the width shrinks. Narrow (below 90
    cells), figures are left out whole from the end (power, util, busy, bw: never the
    memory) until the line and ``suffix`` ("+6 more") fit: a cut "bus…" or "688…" says
    nothing, and a cut suffix hid the GPUs not shown."""
    idx = as_num(gpu.get("index"))
    name = printable(as_str(gpu.get("name")) or "GPU").removeprefix("NVIDIA ")
    used, total = as_num(gpu.get("mem_used_bytes")), as_num(gpu.get("mem_total_bytes"))
    mem = mem_percent(gpu)
    busy, bw = as_num(gpu.get("mem_busy")), as_num(gpu.get("dram_bw_util"))
    util, power = as_num(gpu.get("util_gpu")), as_num(gpu.get("power_w"))
    t = Text(no_wrap=True, overflow="ellipsis")
    label = fmt.count(idx) if idx is not None else "?"
    t.append(f"{label} " if width >= 90 else f"GPU{label} ", "bold")
    if is_simulated(view, gpu):
        t.append("SIM ", f"bold reverse {pal.warn}")
    if width >= 90:
        n = 28 if width >= 140 else 14
        t.append(f"{fmt.clip(name, n):<{n}} ")
    bar_w = 16 if width >= 90 else 8
    t.append("mem ", pal.dim)
    t.append_text(bar(None if mem is None else mem / 100, bar_w, pal.usage(mem), pal.dim))
    t.append(f" {fmt.pct(mem):>4}", pal.usage(mem))
    if width >= 90:
        t.append(f" {fmt.size_bytes(used)}/{fmt.size_bytes(total)}", pal.dim)
    figures: list[Text] = []
    for words, value, style in (
            ("  bw ", fmt.pct(bw), pal.usage(bw)),
            ("  busy ", fmt.pct(busy), pal.usage(busy) if busy is not None else pal.dim),
            ("  util ", fmt.pct(util), "" if util is not None else pal.dim),
            ("  ", fmt.watts(power), "" if power is not None else pal.dim)):
        part = Text()
        part.append(words, pal.dim)
        part.append(value, style)
        figures.append(part)
    room = width - (suffix.cell_len if suffix is not None else 0)
    if width < 90:
        while figures and t.cell_len + sum(f.cell_len for f in figures) > room:
            figures.pop()
    for part in figures:
        t.append_text(part)
    if suffix is not None:
        t.append_text(suffix)
    return t


class GpuPanel(ViewPanel):
    """GPU readings; at narrow widths only the first two GPUs and a "+N more" line."""

    READS = ("gpus", "gpu_source", "gpu_status")  # the status: why no readings, a GPU lost

    def layout_key(self, view: SnapView) -> object:
        # narrow, the source's trouble takes a line of its own
        return len(view.items("gpus")), gpu_trouble(view) is not None

    DEFAULT_CSS = """
    GpuPanel { height: auto; }
    """

    def build(self, width: int) -> RenderableType:
        v, pal = self.view, self.palette
        gpus = v.items("gpus")
        if width < 90:
            return self._compact(gpus, width)
        title = Text(no_wrap=True, overflow="ellipsis")
        title.append("GPU", "bold")
        if any(is_simulated(v, g) for g in gpus):
            title.append(" ")
            title.append(" SIMULATED ", f"bold reverse {pal.warn}")
            title.append(" readings from the simulator, not hardware", pal.dim)
        elif gpus:
            title.append("  bw = DRAM bandwidth % of peak · busy = % of time memory was busy",
                         pal.dim)
        if not gpus:
            title.append(f"  n/a ({no_gpu_reason(v)})" if v.raw else "  n/a", pal.dim)
            return title
        trouble = gpu_trouble(v)
        if trouble:
            title.append(f"  {trouble}", f"bold {pal.warn}")
        lines: list[RenderableType] = [title]
        lines.extend(gpu_line(v, g, pal, width) for g in gpus)
        return Group(*lines)

    def _compact(self, gpus: list[Mapping[str, Any]], width: int) -> RenderableType:
        """No title line: "GPU0 SIM mem ███ 97% bw 91% …"; two GPUs, the second saying
        "+N more"; then the source's trouble ("GPU 3 lost: …"), which the wide panel
        has in its title, on a line of its own."""
        v, pal = self.view, self.palette
        if not gpus:
            why = f"n/a ({no_gpu_reason(v)})" if v.raw else fmt.NA
            return Text.assemble(("GPU ", "bold"), (why, pal.dim))
        shown = gpus[:MAX_NARROW]
        more = len(gpus) - len(shown)
        suffix = Text(f"  +{more} more", pal.dim) if more else None
        lines: list[RenderableType] = [
            gpu_line(v, g, pal, width, suffix if i == len(shown) - 1 else None)
            for i, g in enumerate(shown)]
        trouble = gpu_trouble(v)
        if trouble:
            lines.append(Text(trouble, f"bold {pal.warn}", no_wrap=True, overflow="ellipsis"))
        return Group(*lines)
