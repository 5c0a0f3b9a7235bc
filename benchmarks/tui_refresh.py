"""How long the TUI takes to refresh and to re-sort with many users and active requests.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/tui_refresh.py [--users 100 1000 3000]
        [--requests 100 1000] [--size 200x60] [--refreshes 8] [--sorts 7] [--profile FILE]

Runs the real app headless (Textual's ``App.run_test``) on an in-memory snapshot source
built on tests/tui/fixtures/saturated.json with N users and M active requests, and prints,
for each (N, M): ms per refresh (``refresh_now``: fetch, then every widget shown again)
when the figures are unchanged ("same"), when every figure moves but the order does not
("figures": 3,000 users whose figures all move), when the figures move and the order
changes ("reorder", what a live proxy does), and when the users stand still while 5
requests end and 5 start at each refresh, every other request's age and tokens moving
on ("churn"), then ms per ``s`` key press (pressed, handled, and the screen painted).
The median of each is printed (CPU ms, the process's own: a shared machine's other
load does not count), then the median wall-clock ms. ``--profile FILE`` writes cProfile stats
of the last case's refreshes of one kind (``--profile-what``, default reorder) or
its sort presses to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import cProfile
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmtop.tui.app import LlmtopApp  # noqa: E402

PROFILED = ["reorder"]
"""What ``--profile`` profiles (``--profile-what``)."""
FIXTURE = ROOT / "tests" / "tui" / "fixtures" / "saturated.json"


class SyntheticSource:
    """A SnapshotSource answering with ``users`` users and ``requests`` active requests.
    ``mode`` says what changes between fetches: "same" (nothing), "figures" (every figure,
    each user's rate kept in its rank), "reorder" (every figure, the order too) or
    "churn" (the users as they were; the 5 oldest requests end, 5 new ones start)."""

    def __init__(self, users: int, requests: int) -> None:
        data = json.loads(FIXTURE.read_text("utf-8"))
        self.base: dict[str, Any] = data["snapshot"]
        self.users, self.requests = users, requests
        self.mode = "same"
        self.step = 0

    def _users(self) -> list[dict[str, Any]]:
        k = self.step
        out = []
        for i in range(self.users):
            # "reorder": a rotating order, every rank moves
            rank = (i + k * 7) % self.users if self.mode == "reorder" else i
            moves = self.mode in ("figures", "reorder")
            bump = 0.1 * k if moves else 0.0
            out.append({
                "user": f"user-{i:05d}",
                "requests": 10 + (i * 37) % 500 + (k if moves else 0),
                "in_flight": (i * 13) % 40,
                "output_tps": round(5000.0 - rank * (4000.0 / max(1, self.users)) + bump, 1),
                "ttft_p95": round(0.05 + (i * 17 % 100) / 40 + bump / 100, 4),
                "itl_p95": round(0.01 + (i * 7 % 100) / 1000, 5),
                "slo_attainment": round(((i * 29) % 100) / 100, 2),
            })
        return out

    async def fetch(self, window_s: int | None) -> dict[str, Any]:
        snap = copy.copy(self.base)
        snap["window_s"] = window_s
        snap["users"] = self._users()
        snap["time"] = self.base["time"] + (self.step if self.mode != "same" else 0)
        return snap

    async def active_requests(self) -> list[dict[str, Any]]:
        k = self.step if self.mode != "same" else 0
        # churn: requests o.. are open, 5 more ended and started at each step; a
        # request's age grows with the steps (1.25 s each), the oldest's stays 600 s
        o = 5 * k if self.mode == "churn" else 0
        step_s = 1.25 if self.mode == "churn" else 0.25
        return [{
            "id": f"r-{i:06d}", "user": f"user-{i % max(1, self.users):05d}",
            "model": "sim-8b", "state": "waiting" if i % 5 == 0 else "streaming",
            "age_s": round(600.0 - i * 0.25 + k * step_s, 2),
            "ttft_s": None if i % 5 == 0 else 0.3 + (i % 7) / 10,
            "completion_tokens": 0 if i % 5 == 0 else i % 900 + k,
            "tps": None if i % 5 == 0 else 20.0 + (i + k) % 30,
        } for i in range(o, o + self.requests)]

    async def recording(self, action: str, path: str | None) -> dict[str, Any]:
        return {}

    def describe(self) -> str:
        return "synthetic"

    async def close(self) -> None:
        return None


def ms(xs: list[tuple[float, float]]) -> str:
    cpu, wall = statistics.median(c for c, _ in xs), statistics.median(w for _, w in xs)
    return f"{cpu * 1000:8.1f} ({wall * 1000:7.1f})"


async def measure(users: int, requests: int, size: tuple[int, int], refreshes: int,
                  sorts: int, prof: cProfile.Profile | None
                  ) -> dict[str, list[tuple[float, float]]]:
    source = SyntheticSource(users, requests)
    app = LlmtopApp(source, refresh_hz=0)  # refreshed here only, never behind our back
    out: dict[str, list[tuple[float, float]]] = {}
    async with app.run_test(size=size) as pilot:
        await app.refresh_now()
        await pilot.pause()
        for mode in ("same", "figures", "reorder", "churn"):
            source.mode = mode
            times: list[tuple[float, float]] = []
            for _ in range(refreshes):
                source.step += 1
                if prof is not None and mode == PROFILED[0]:
                    prof.enable()
                c, t = time.process_time(), time.perf_counter()
                await app.refresh_now()
                await pilot.pause()  # the repaint it asked for
                times.append((time.process_time() - c, time.perf_counter() - t))
                if prof is not None:
                    prof.disable()
            out[mode] = times
        times = []
        for _ in range(sorts):
            if prof is not None and PROFILED[0] == "sort":
                prof.enable()
            c, t = time.process_time(), time.perf_counter()
            await pilot.press("s")
            await pilot.pause()
            times.append((time.process_time() - c, time.perf_counter() - t))
            if prof is not None:
                prof.disable()
        out["sort"] = times
        rows = app.dashboard.users.row_count
        if users and rows == 0:
            raise RuntimeError(f"users table shows {rows} rows")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, nargs="+", default=[100, 1000, 3000])
    ap.add_argument("--requests", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--size", default="200x60")
    ap.add_argument("--refreshes", type=int, default=8)
    ap.add_argument("--sorts", type=int, default=7)
    ap.add_argument("--profile", metavar="FILE")
    ap.add_argument("--profile-what",
                    choices=("same", "figures", "reorder", "churn", "sort"),
                    default="reorder")
    args = ap.parse_args()
    PROFILED[0] = args.profile_what
    cols, rows = (int(x) for x in args.size.lower().split("x"))
    print(f"terminal {cols}x{rows}; ms per refresh / per 's' press: median CPU (median wall)")
    print(f"{'users':>6} {'reqs':>5}  {'same':>20} {'figures':>20} {'reorder':>20} "
          f"{'churn':>20} {'sort (s)':>20}")
    cases = [(u, r) for u in args.users for r in args.requests]
    for u, r in cases:
        prof = cProfile.Profile() if args.profile and (u, r) == cases[-1] else None
        got = asyncio.run(measure(u, r, (cols, rows), args.refreshes, args.sorts, prof))
        print(f"{u:>6} {r:>5}  {ms(got['same'])} {ms(got['figures'])} "
              f"{ms(got['reorder'])} {ms(got['churn'])} {ms(got['sort'])}", flush=True)
        if prof is not None:
            prof.dump_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
