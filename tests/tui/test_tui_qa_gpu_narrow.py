"""QA: the GPU panel below 90 columns says how many GPUs it leaves out and which is lost.

Narrow, the panel shows two GPUs, the second line ending "+6 more": that line is cut at
its end like the others, so at 60 columns and less the "+6 more" was cut off and two
GPUs read as all there are ("GPU1 SIM mem ████████  97%  bw 90%  busy 86%  util 98%
671…"). And the GPU source's trouble ("GPU 3 lost: …"), shown in the wide panel's title,
was nowhere below 90 columns (the narrow panel has no title). Now a narrow GPU line
leaves out whole figures from its end (power, util, busy, bw) to fit, the count of GPUs
not shown is kept, and a lost GPU has a line of its own."""

from __future__ import annotations

import copy

import pytest
from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp

LOST = "8 simulated GPUs; GPU 3 lost: NVML_ERROR_GPU_IS_LOST"


def eight_gpus(status: str | None = LOST) -> FixtureSource:
    src = FixtureSource("saturated")
    two = src.snapshot["gpus"]
    src.snapshot["gpus"] = [dict(copy.deepcopy(two[i % 2]), index=i) for i in range(8)]
    src.snapshot["gpu_status"] = status
    return src


async def gpu_lines(src: FixtureSource, size: tuple[int, int]) -> list[str]:
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        region = app.dashboard.gpu.region
        lines = screen_text(app).splitlines()
        return [lines[y][region.x:region.right].strip()
                for y in range(region.y, region.bottom)]


@pytest.mark.parametrize("size", [(80, 40), (60, 30), (40, 30)])
async def test_the_gpus_left_out_and_the_lost_one_are_said(size: tuple[int, int]) -> None:
    lines = await gpu_lines(eight_gpus(), size)
    text = "\n".join(lines)
    assert "+6 more" in text, text
    assert "GPU 3 lost" in text, text
    assert lines[0].startswith("GPU0 SIM mem") and lines[1].startswith("GPU1 SIM mem"), text
    for line in lines[:2]:  # figures whole or not at all
        assert "…" not in line, text
    assert "97%" in lines[0], text  # the memory figure stays


async def test_all_well_takes_no_extra_line() -> None:
    """No trouble, two GPUs: the narrow panel is the two lines it was."""
    src = FixtureSource("saturated")
    src.snapshot["gpu_status"] = "2 simulated GPUs"
    lines = await gpu_lines(src, (80, 40))
    assert len([ln for ln in lines if ln]) == 2, lines
    assert lines[0] == "GPU0 SIM mem ████████  97%  bw 91%  busy 88%  util 99%  688 W", lines
