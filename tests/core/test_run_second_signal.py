"""A second SIGINT/SIGTERM while ``llmtop run --headless`` waits out its shutdown grace
stops it now: the streams still open are cancelled and counted, as at the end of the grace
(QA: a second Ctrl-C was ignored for the full 10 s)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time

import aiohttp
import pytest

from llmtop.sim.server import running_sim


async def _line(proc: asyncio.subprocess.Process, prefix: str, within_s: float = 30) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        raw = await asyncio.wait_for(proc.stdout.readline(), deadline - time.monotonic())
        line = raw.decode().strip()
        if line.startswith(prefix) or not raw:
            return line
    raise AssertionError(f"no line starting {prefix!r}")


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["1 process", "2 workers"])
async def test_a_second_signal_ends_the_grace_at_once(workers: list[str]) -> None:
    async with running_sim("tiny", time_scale=1.0) as sim:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llmtop", "run", "--headless", "--upstream", sim.url,
            "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--gpu-source", "none",
            *workers, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            url = (await _line(proc, "llmtop: proxy listening on ")).rsplit(" ", 1)[1]
            async with aiohttp.ClientSession() as s:
                resp = await s.post(url + "/v1/chat/completions", json={
                    "model": "m", "stream": True, "max_tokens": 1000,
                    "messages": [{"role": "user", "content": "hi"}]})
                assert resp.status == 200
                await resp.content.readline()  # streaming now
                proc.send_signal(signal.SIGTERM)
                # the single process and the workers' coordinator say what they wait for
                said = await _line(proc, "llmtop: stopping:")
                assert "1 request(s) in flight may finish within 10 s" in said
                assert "signal again to stop now" in said
                await asyncio.sleep(0.5)
                t = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                rc = await asyncio.wait_for(proc.wait(), 8)
                took = time.monotonic() - t
                resp.close()
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        assert proc.stdout is not None
        rest = (await proc.stdout.read()).decode()
    assert rc == 0 and took < 5, (took, rest)
    assert "1 in-flight stream was cancelled at the shutdown deadline" in rest
    assert "stopping now" in rest and "Traceback" not in rest
    assert "served 1 request" in rest
