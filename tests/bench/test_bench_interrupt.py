"""Ctrl-C and a closed stdout: the finished levels are still shown, the recording keeps the
interrupted level's requests, and `llmtop bench --json | head` exits quietly."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from aiohttp import web
from net_support import chat_engine

from llmtop.recording.reader import iter_recording, read_header
from llmtop.sim.server import running_sim

LEVEL_S = "3"
"""``--duration`` of the runs interrupted during a level."""


async def bench_interrupted(*args: str, sig: int = signal.SIGINT,
                            at: str = "concurrency 2: starting"
                            ) -> tuple[int, str, str, float]:
    """Start bench, send SIGINT (or ``sig``) half a second into its second level (or the
    level whose progress line is ``at``). The levels that must be interrupted last
    :data:`LEVEL_S`: a signal meant for half a second into a level still lands in it when
    a loaded machine holds this process a while (with 1 s levels, a pause of half a second
    sent it after the level had finished)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", "bench", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None and proc.stdout is not None
    err_lines: list[str] = []
    while True:
        line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
        assert line, "bench ended before its second level: " + "".join(err_lines)
        err_lines.append(line)
        if line.startswith(at):
            break
    await asyncio.sleep(0.5)
    proc.send_signal(sig)
    t0 = time.monotonic()
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    took = time.monotonic() - t0
    assert proc.returncode is not None
    return proc.returncode, out.decode(), "".join(err_lines) + err.decode(), took


async def test_sigterm_keeps_the_finished_levels_and_the_recording(tmp_path: Path) -> None:
    """SIGTERM (timeout(1), a job scheduler) used to kill bench outright: exit 143 with no
    results printed for the levels that had finished, and a recording without the
    interrupted level's requests or a footer. It now ends the run as Ctrl-C does."""
    rec = tmp_path / "b.jsonl"
    async with running_sim("tiny") as sim:
        code, out, err, took = await bench_interrupted(
            sim.url, "--concurrency", "1,2,4", "--duration", LEVEL_S, "--warmup", "0",
            "--max-tokens", "64", "--json", "--record", str(rec), sig=signal.SIGTERM)
    assert code == 143, err
    assert took < 5
    data = json.loads(out)
    assert [s["level"] for s in data["steps"]] == [1.0]
    assert data["interrupted"] == "concurrency 2"
    assert "interrupted during concurrency 2" in err and "Traceback" not in err
    items = list(iter_recording(rec))
    reqs = [x for x in items if type(x).__name__ == "RequestRecord"]
    assert len(reqs) >= data["steps"][0]["requests"] + 2
    assert isinstance(items[-1], dict) and items[-1]["type"] == "footer"


async def test_ctrl_c_keeps_the_finished_levels_and_the_recording(tmp_path: Path) -> None:
    """SIGINT during level 2: exit 130 promptly; the JSON has level 1 and names the level it
    interrupted; the recording has level 1's requests, its summary line, and level 2's
    requests (finished ones and the stopped ones), and a header that says closed loop."""
    rec = tmp_path / "b.jsonl"
    async with running_sim("tiny") as sim:
        code, out, err, took = await bench_interrupted(
            sim.url, "--concurrency", "1,2,4", "--duration", LEVEL_S, "--warmup", "0",
            "--max-tokens", "16", "--json", "--record", str(rec),
            "--slo", "ttft=10,itl=10")  # (level 1 passes through a pause of the machine)
    assert code == 130, err
    assert took < 5
    data = json.loads(out)
    assert [s["level"] for s in data["steps"]] == [1.0]
    assert data["interrupted"] == "concurrency 2" and data["best"] == 1.0
    assert "interrupted during concurrency 2" in err and "Traceback" not in err
    lines = list(iter_recording(rec))
    reqs = [x for x in lines if type(x).__name__ == "RequestRecord"]
    level1 = data["steps"][0]["requests"]
    level2 = reqs[level1:]
    assert len(reqs) == level1 + len(level2) and len(level2) >= 2  # 2 workers were open
    assert {r.outcome for r in level2} <= {"ok", "cancelled"}
    assert any(r.outcome == "cancelled" for r in level2)
    header = read_header(rec)
    assert header["bench"]["arrivals"] == "closed-loop"


async def test_ctrl_c_prints_the_table_of_finished_levels() -> None:
    async with running_sim("tiny") as sim:
        code, out, err, _ = await bench_interrupted(
            sim.url, "--concurrency", "1,2", "--duration", LEVEL_S, "--warmup", "0",
            "--max-tokens", "16", "--slo", "ttft=10,itl=10")  # (room for a pause)
    assert code == 130, err
    rows = [ln for ln in out.splitlines() if ln.strip().lstrip("▶ ").startswith("1 ")]
    assert len(rows) == 1 and "max concurrency meeting" in out
    assert "interrupted during concurrency 2: the limit may be higher" in out


CTRL_C_TWICE = """
import asyncio, os, signal, sys
from llmtop.bench.runner import BenchPlan, run_plan
from llmtop.bench.workload import Length, Workload
from llmtop.config import load_config

class CtrlCTwice(Workload):
    # the keyboard: Ctrl-C as level 2 sends its first request, and again as the loop
    # goes on to stop the level (real SIGINTs, to this process)
    calls = 0

    def next(self):
        self.calls += 1
        if self.calls == 4:
            os.kill(os.getpid(), signal.SIGINT)
            asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGINT)
        return super().next()

plan = BenchPlan(url=sys.argv[1], mode="concurrency", levels=[1.0, 2.0], search=False,
                 duration_s=None, requests=3, warmup_s=0.0, as_json=True,
                 workload=CtrlCTwice(max_tokens=Length(4, 4)))
sys.exit(run_plan(plan, load_config(None, env={}, overrides={})))
"""


async def test_ctrl_c_twice_still_prints_the_finished_levels() -> None:
    """Ctrl-C pressed twice in quick succession, the second landing while the first is
    still stopping the level: asyncio.run's handler raised KeyboardInterrupt inside the
    loop, and bench said only "interrupted after 4 requests" — no table, no JSON for the
    level that had finished, though the help promises them on Ctrl-C (by hand: 3 times in
    5 with two SIGINTs back to back) — or, when the exception dropped a task's wake-up,
    hung for good in asyncio.run's clean-up (3 times in 10). Ctrl-C is now handled on the
    loop: a second press while stopping is taken as the first, and the results follow."""
    async with running_sim("tiny") as sim:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CTRL_C_TWICE, sim.url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out_b, err_b = await asyncio.wait_for(proc.communicate(), 60)
    out, err = out_b.decode(), err_b.decode()
    assert proc.returncode == 130, err
    data = json.loads(out)
    assert [s["level"] for s in data["steps"]] == [1.0] and data["steps"][0]["ok"] == 3
    assert data["interrupted"] == "concurrency 2"
    assert "results above for the 1 level that finished" in err
    assert "stopping (Ctrl-C again quits at once" in err
    assert "Traceback" not in err


async def test_sigint_ignored_at_start_stays_ignored() -> None:
    """Started with SIGINT ignored (a background job of a script, ``nohup``-style
    launchers), bench keeps ignoring it, as Python and asyncio.run do: the run is not
    stopped by a Ctrl-C meant for the shell that launched it."""
    async with running_sim("tiny") as sim:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llmtop", "bench", sim.url, "--concurrency", "1,2",
            "--duration", "1", "--warmup", "0", "--max-tokens", "16", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        assert proc.stderr is not None
        while not (await asyncio.wait_for(proc.stderr.readline(), 30)).startswith(
                b"concurrency 2: starting"):
            pass
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err
    data = json.loads(out)
    assert [s["level"] for s in data["steps"]] == [1.0, 2.0]
    assert data["interrupted"] is None


async def test_ctrl_c_mid_bisection_says_the_search_did_not_settle() -> None:
    """A search where 4 passes and 8 fails, interrupted while bisecting at 6: the verdict
    read "max concurrency …: 4 → … tok/s goodput", as if 5 to 7 had been tried and failed;
    only stderr said a level was interrupted. It now says the limit is only known to lie
    from 4 to below 8."""
    n = 0
    gate = asyncio.Event()  # set when bench has ended: level 6's requests then return
    sse = (b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
           b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":1}}\n\n'
           b"data: [DONE]\n\n")

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal n
        await request.read()
        n += 1
        # levels 1, 2, 4 (4 requests each) fast; 8 slow (TTFT 3 s); 6 never answers
        if n > 16:
            await gate.wait()
            return web.Response(status=503)
        await asyncio.sleep(0 if n <= 12 else 3)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse)
        await resp.write_eof()
        return resp

    async with chat_engine(handle) as url:
        code, out, err, _ = await bench_interrupted(
            url, "--search", "--requests", "4", "--slo", "ttft=2,itl=10",
            at="concurrency 6: starting")
        gate.set()
    assert code == 130, err
    assert [ln.split(":")[0] for ln in err.splitlines() if ln.endswith(": starting")] == [
        f"concurrency {c}" for c in (1, 2, 4, 8, 6)]
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("max concurrency meeting") and ": 4 → " in verdict, out
    assert ("(interrupted during concurrency 6, before the search settled: the limit is "
            "at least 4 and below 8)") in verdict


async def test_ctrl_c_in_the_first_level_points_to_no_results() -> None:
    """Interrupted before any level finished, bench printed no table yet said "results
    above for the 0 levels that finished"."""
    async with running_sim("tiny") as sim:
        code, out, err, _ = await bench_interrupted(
            sim.url, "--concurrency", "1", "--duration", "3", "--max-tokens", "64",
            at="concurrency 1: starting")
    assert code == 130, err
    assert out == ""
    assert err.rstrip().endswith("in all; no level had finished"), err


async def test_json_to_a_closed_pipe_exits_quietly() -> None:
    """`llmtop bench … --json | head -0`: no BrokenPipeError traceback, exit 0."""
    async with running_sim("tiny") as sim:
        def run() -> tuple[int, str]:
            p = subprocess.Popen(
                [sys.executable, "-m", "llmtop", "bench", sim.url, "--concurrency", "1",
                 "--requests", "2", "--max-tokens", "4", "--json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert p.stdout is not None and p.stderr is not None
            p.stdout.close()
            with p.stderr:
                err = p.stderr.read().decode()
            return p.wait(60), err

        code, err = await asyncio.to_thread(run)
    assert code == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err
