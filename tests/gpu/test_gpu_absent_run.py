"""On a machine without an NVIDIA GPU (this one, and CI), `llmtop run` says so once and
everything else works."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import aiohttp
import pytest

from llmtop.sim.server import running_sim


async def test_run_without_a_gpu_says_so_once_and_serves() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LLMTOP_GPU_SOURCE"}  # auto
    async with running_sim("tiny") as sim:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llmtop", "run", "--headless", "--upstream", sim.url,
            "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        assert proc.stdout is not None
        lines: list[str] = []
        while not any(ln.startswith("llmtop: admin listening on") for ln in lines):
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            assert line, "\n".join(lines)
            lines.append(line.strip())
        proxy = next(ln for ln in lines if "proxy listening" in ln).rsplit(" ", 1)[1]
        admin = next(ln for ln in lines if "admin listening" in ln).rsplit(" ", 1)[1]
        body = json.dumps({"model": "m", "max_tokens": 4,
                           "messages": [{"role": "user", "content": "hi"}]})
        async with aiohttp.ClientSession() as s:
            for _ in range(3):
                async with s.post(proxy + "/v1/chat/completions", data=body,
                                  headers={"Content-Type": "application/json"}) as r:
                    assert r.status == 200
            await asyncio.sleep(1.5)
            async with s.get(admin + "/llmtop/v1/snapshot") as r:
                snap = await r.json()
        proc.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(proc.communicate(), 60)
    out = lines + rest.decode().splitlines()
    gpu_lines = [ln for ln in out if "GPU" in ln]
    assert len(gpu_lines) == 1, out
    assert "no NVIDIA GPU found" in gpu_lines[0] and "Traceback" not in "\n".join(out)
    assert snap["gpus"] == [] and snap["system"]["requests"] == 3
    assert proc.returncode == 0


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["1 process", "2 workers"])
def test_gpu_source_nvml_without_nvml_refuses_before_listening(workers: list[str]) -> None:
    """``--gpu-source nvml`` on a machine without NVML is a usage error before any address
    is bound or announced: scripts wait for the listen lines, and once they are printed
    nothing may refuse (it printed both, then exited 2)."""
    proc = subprocess.run(
        [sys.executable, "-m", "llmtop", "run", "--headless", "--upstream",
         "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
         "--gpu-source", "nvml", *workers],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "listening" not in proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "NVML is unavailable" in err[0], proc.stderr
