"""A level's GPU figures are the means of the readings taken while it ran (its measured
part), not one reading taken once it had ended — in its drain, when the load was already
going (against the simulator, concurrency 64 read 37 % DRAM bandwidth and 16 read 66 %)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

from llmtop.bench.gpu_level import over_level
from llmtop.sim.server import running_sim


def reading(t: float, bw: float | None, used: int, index: int = 0, **more: Any) -> dict[str, Any]:
    return {"t": t, "index": index, "name": "H200", "simulated": False,
            "mem_used_bytes": used, "mem_total_bytes": 100, "dram_bw_util": bw,
            "mem_busy": 10.0, "power_w": None, **more}


def test_the_readings_inside_the_level_are_averaged_per_gpu() -> None:
    got = over_level([
        reading(9.0, 99.0, 90),  # warm-up: before the level's measured part
        reading(10.0, 60.0, 40), reading(10.5, 80.0, 70, name="H200 NVL"),
        reading(10.5, 20.0, 5, index=1), reading(11.0, None, 50),
        reading(12.5, 1.0, 95),  # the drain: after it
    ], started=10.0, ended=12.0)
    assert got == [
        {"t": 11.0, "index": 0, "name": "H200", "simulated": False, "mem_total_bytes": 100,
         "mem_used_bytes": 70, "dram_bw_util": 70.0, "mem_busy": 10.0, "power_w": None,
         "dram_bw_util_max": 80.0, "samples": 3},
        {"t": 10.5, "index": 1, "name": "H200", "simulated": False, "mem_total_bytes": 100,
         "mem_used_bytes": 5, "dram_bw_util": 20.0, "mem_busy": 10.0, "power_w": None,
         "dram_bw_util_max": 20.0, "samples": 1},
    ]


@pytest.mark.parametrize("readings", [[], [reading(1.0, 5.0, 1), reading(30.0, 5.0, 1)],
                                      [{"index": 0, "dram_bw_util": 5.0}],  # no time
                                      [reading(float("nan"), 5.0, 1)]])
def test_no_reading_inside_the_level_gives_none(readings: list[dict[str, Any]]) -> None:
    assert over_level(readings, started=10.0, ended=12.0) == []


def test_flags_and_text_are_not_averaged() -> None:
    got = over_level([reading(10.0, 1.0, 1, simulated=True, note="a"),
                      reading(11.0, 3.0, 1, simulated=True, note="b")], 10.0, 12.0)
    assert got[0]["simulated"] is True and got[0]["dram_bw_util"] == 2.0
    assert got[0]["note"] == "b"  # no number in any reading: the latest's


async def test_a_level_through_a_proxy_reads_its_gpus_while_it_runs() -> None:
    """Two seconds at concurrency 4 through an llmtop proxy whose GPU source is the
    simulator's (a reading every 0.2 s): the level's figures come from several readings
    inside it, each GPU's once."""
    from llmtop.config import load_config
    from llmtop.server import LlmtopServer

    async with running_sim("tiny") as sim:
        cfg = load_config(None, env={}, overrides={
            "upstream": sim.url, "listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
            "gpu.source": "sim", "gpu.interval_s": 0.2})
        server = LlmtopServer(cfg)
        await server.start()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "llmtop", "bench", server.proxy_url, "--concurrency",
                "4", "--duration", "2", "--warmup", "0.5", "--max-tokens", "16", "--json",
                "--admin", server.admin_url,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 90)
        finally:
            await server.stop(1.0)
    assert proc.returncode == 0, err.decode()
    step = json.loads(out)["steps"][0]
    gpus = step["gpus"]
    assert [g["index"] for g in gpus] == sorted({g["index"] for g in gpus}) and gpus
    for g in gpus:
        assert g["simulated"] is True
        assert g["samples"] >= 2, g
        assert g["dram_bw_util"] is not None and g["dram_bw_util_max"] >= g["dram_bw_util"]
