"""``GET /metrics`` exports a GPU's readings (``llmtop_gpu_*{gpu,name}``) only while they
are current. NVML readings keep coming while a device is lost or stuck (with every value
None: absent), but the simulated GPU is read over HTTP from the simulator's ``/sim/gpu``,
and once that stopped answering its last reading was exported for good: 15 s after the
simulator was gone, ``llmtop_gpu_memory_used_bytes`` and ``llmtop_gpu_power_watts`` were
still there (the snapshot says ``age_s`` 15; Prometheus had nothing to tell). End to end:
the real simulator, a real ``llmtop run --gpu-source sim``, its ``/metrics`` parsed with
prometheus_client."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
from proc_support import start_headless
from prometheus_client.parser import text_string_to_metric_families

from llmtop.metrics.prometheus import gpu_current_for_s
from llmtop.sim.server import running_sim


async def gpu_samples(s: aiohttp.ClientSession, admin: str) -> list[str]:
    async with s.get(admin + "/metrics") as r:
        text = await r.text()
    return [x.name for f in text_string_to_metric_families(text) for x in f.samples
            if x.name.startswith("llmtop_gpu_")]


async def test_a_gpu_reading_no_longer_current_is_not_exported() -> None:
    sim_cm = running_sim("tiny")
    sim = await sim_cm.__aenter__()
    stopped = False
    proc, _, admin = await start_headless(
        "--upstream", sim.url, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
        "--gpu-source", "sim")
    try:
        async with aiohttp.ClientSession() as s:
            names: list[str] = []
            for _ in range(100):
                names = await gpu_samples(s, admin)
                if names:
                    break
                await asyncio.sleep(0.1)
            assert "llmtop_gpu_memory_used_bytes" in names and "llmtop_gpu_power_watts" in names
            await sim_cm.__aexit__(None, None, None)  # the simulator, /sim/gpu with it, goes
            stopped = True
            await asyncio.sleep(1)
            assert await gpu_samples(s, admin)  # a second of silence is not a lost GPU
            await asyncio.sleep(gpu_current_for_s(0.5) + 1)
            assert await gpu_samples(s, admin) == []
            async with s.get(admin + "/llmtop/v1/snapshot") as r:
                gpus = (await r.json())["gpus"]
            assert gpus and gpus[0]["age_s"] > gpu_current_for_s(0.5)  # the snapshot's view
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.communicate(), 60)
        if not stopped:
            await sim_cm.__aexit__(None, None, None)
