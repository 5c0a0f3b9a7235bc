"""SVG screenshots of the TUI with Textual's own export (``make screenshots``).

    .venv/bin/python tools/screenshots.py [--out screenshots] [--size 160x48]

Writes ``tui-low-load.svg`` and ``tui-saturated.svg`` from the fixtures in
tests/tui/fixtures/, then (unless ``--fixtures-only``) runs the real demo — simulated
engine, proxy recording the session, ramping traffic — and captures it live at low load
(``demo-low-load.svg``) and once the ``QUEUEING`` warning is up (``demo-saturated.svg``),
then replays that recording (``replay.svg``). ``capture(source, path, size, wait_s)``
takes any SnapshotSource, so other captures are one call.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmtop.tui.app import LlmtopApp  # noqa: E402
from llmtop.tui.source import SnapshotSource  # noqa: E402

FIXTURES = ROOT / "tests" / "tui" / "fixtures"
DEFAULT_SIZE = (160, 48)


async def capture_async(
    source: SnapshotSource,
    path: str | Path,
    size: tuple[int, int] = DEFAULT_SIZE,
    wait_s: float = 0.0,
    *,
    title: str = "llmtop",
    keys: tuple[str, ...] = (),
    refresh_hz: float = 4.0,
    proxy: str | None = None,
    admin: str | None = None,
) -> Path:
    """Run the app on ``source`` headless at ``size`` (columns, rows), wait for its
    first snapshot and then ``wait_s`` seconds more (plots fill up from a live source),
    press ``keys``, and save the screen as SVG at ``path``. Returns the path.
    Raises ``RuntimeError`` when no snapshot arrived within ``wait_s`` + 30 s."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    app = LlmtopApp(source, refresh_hz=refresh_hz, title=title, proxy=proxy, admin=admin)
    async with app.run_test(size=size) as pilot:
        deadline = time.monotonic() + wait_s + 30.0
        while app.refreshes == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no snapshot from {source.describe()}: {app.error}")
            await pilot.pause(0.1)
        if wait_s > 0:
            await pilot.pause(wait_s)
        if keys:
            await pilot.press(*keys)
        await app.refresh_now()
        await pilot.pause()
        svg = app.export_screenshot(title=title)
    await asyncio.to_thread(out.write_text, svg, encoding="utf-8")
    return out


def capture(
    source: SnapshotSource,
    path: str | Path,
    size: tuple[int, int] = DEFAULT_SIZE,
    wait_s: float = 0.0,
    **kw: Any,
) -> Path:
    """Synchronous :func:`capture_async` (runs its own event loop)."""
    return asyncio.run(capture_async(source, path, size, wait_s, **kw))


class FixtureSource:
    """A SnapshotSource answering from a fixture file (the tests' fixtures)."""

    def __init__(self, path: Path) -> None:
        data = json.loads(path.read_text("utf-8"))
        self.snapshot: dict[str, Any] = data["snapshot"]
        self.requests: list[dict[str, Any]] = data.get("requests", [])

    async def fetch(self, window_s: int | None) -> dict[str, Any]:
        snap = copy.deepcopy(self.snapshot)
        snap["window_s"] = window_s
        return snap

    async def active_requests(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.requests)

    async def recording(self, action: str, path: str | None) -> dict[str, Any]:
        return {}

    def describe(self) -> str:
        return ""

    async def close(self) -> None:
        return None


def parse_size(text: str) -> tuple[int, int]:
    try:
        cols, rows = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size '{text}' must be COLSxROWS, e.g. 160x48") from None
    return cols, rows


def _admin_snapshot(admin: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(admin + "/llmtop/v1/snapshot?window=10", timeout=5) as r:
        data: dict[str, Any] = json.load(r)
    return data


def live(out: Path, size: tuple[int, int]) -> list[Path]:
    """Capture the live demo at low load and at saturation, then its replay."""
    import tempfile

    from llmtop.cli.common import Child, llmtop_cmd
    from llmtop.cli.replay import tui_source
    from llmtop.tui.source import AdminSource

    paths: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        rec = Path(tmp) / "demo.jsonl.gz"
        demo = Child(llmtop_cmd("demo", "--headless", "--period", "90", "--record", str(rec)),
                     ("llmtop: proxy listening on ", "llmtop: admin listening on "))
        try:
            if not demo.ready:
                raise RuntimeError(f"the demo did not start: {demo.failure()}")
            admin = demo.found["llmtop: admin listening on "]
            proxy = demo.found["llmtop: proxy listening on "]
            time.sleep(12)
            paths.append(capture(AdminSource([admin]), out / "demo-low-load.svg", size,
                                 wait_s=2, title="llmtop demo", proxy=proxy,
                                 admin=admin))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                snap = _admin_snapshot(admin)
                if any(w.get("code") == "QUEUEING" for w in snap.get("warnings", [])):
                    break
                time.sleep(2)
            else:
                raise RuntimeError("the demo never raised QUEUEING within 120 s")
            time.sleep(5)
            paths.append(capture(AdminSource([admin]), out / "demo-saturated.svg", size,
                                 wait_s=2, title="llmtop demo", proxy=proxy,
                                 admin=admin))
        finally:
            demo.stop(30)
        paths.append(capture(tui_source(rec, speed=20.0), out / "replay.svg", size,
                             wait_s=4, title="llmtop replay"))
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "screenshots"), help="output folder")
    parser.add_argument("--size", type=parse_size, default=DEFAULT_SIZE, help="COLSxROWS")
    parser.add_argument("--fixtures-only", action="store_true",
                        help="only the two fixture screenshots (no live demo)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    for fixture, name in (("low_load", "tui-low-load.svg"), ("saturated", "tui-saturated.svg")):
        path = capture(FixtureSource(FIXTURES / f"{fixture}.json"), out / name, args.size,
                       refresh_hz=0)
        print(path)
    if not args.fixtures_only:
        for path in live(out, args.size):
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
