"""The workers' shared table of open requests (``llmtop.fleet_counts``): a real mapped
file, several mappings of it as the coordinator and its workers hold them."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import aiohttp
import pytest

from llmtop.fleet_counts import FleetCounts
from llmtop.sim.server import running_sim

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proxy"))
from test_proxy_support import running_proxy


def test_each_worker_sees_the_others_exactly_and_the_name_can_go() -> None:
    coord, path = FleetCounts.create(3)
    try:
        w0, w1, w2 = (FleetCounts.attach(path, i) for i in range(3))
    finally:
        os.unlink(path)  # as the coordinator does once every worker is up
    assert not os.path.exists(path)
    try:
        assert (w0.others(), w1.others(), coord.others()) == (0, 0, 0)
        w0.set_mine(5)
        w1.set_mine(7)
        w2.set_mine(1)
        assert (w0.others(), w1.others(), w2.others()) == (8, 6, 12)
        assert coord.others() == 13 and coord.count(1) == 7
        w1.set_mine(0)  # its requests ended
        assert w0.others() == 1
        w0.set_mine(0)  # a worker that stops leaves a zero behind
        assert w2.others() == 0
    finally:
        for t in (w0, w1, w2, coord):
            t.close()


def test_a_slot_outside_the_table_or_a_missing_file_is_refused() -> None:
    coord, path = FleetCounts.create(2)
    try:
        with pytest.raises(ValueError, match="slot 2"):
            FleetCounts.attach(path, 2)
    finally:
        os.unlink(path)
        coord.close()
    with pytest.raises(OSError):
        FleetCounts.attach(path, 0)


async def test_two_proxies_sharing_the_table_count_each_others_open_requests() -> None:
    """Two ProxyServers (as two workers) over one table: requests held open on one count
    in the ``concurrency_at_start`` of a request on the other at once, with no report in
    between; ended, they count no more."""
    body = json.dumps({"model": "m", "max_tokens": 3, "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]})
    coord, path = FleetCounts.create(2)
    try:
        async with running_sim("tiny", max_num_seqs=16) as sim, \
                running_proxy(sim.url) as (a, a_url, a_recs), \
                running_proxy(sim.url) as (b, b_url, b_recs):
            a.fleet = FleetCounts.attach(path, 0)
            b.fleet = FleetCounts.attach(path, 1)
            async with aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0)) as s:

                async def one(url: str, fault: str = "") -> bytes:
                    headers = {"X-Sim-Fault": fault} if fault else {}
                    async with s.post(url + "/v1/chat/completions", data=body,
                                      headers=headers) as r:
                        return await r.read()

                held = [asyncio.create_task(one(a_url, "stall:3000@1")) for _ in range(5)]
                for _ in range(500):
                    if len(a.active) == 5:
                        break
                    await asyncio.sleep(0.01)
                assert coord.count(0) == 5 and b.fleet.others() == 5
                assert await one(b_url)
                (rec,) = await b_recs.wait(1)
                assert rec.concurrency_at_start == 6  # 5 on the other worker + itself
                assert coord.count(1) == 0  # it ended
                for t in held:
                    t.cancel()
                await asyncio.gather(*held, return_exceptions=True)
                await a_recs.wait(5)
                assert coord.count(0) == 0
                assert await one(b_url)
                recs = await b_recs.wait(2)
                assert recs[-1].concurrency_at_start == 1
            for p in (a, b):
                assert p.fleet is not None
                p.fleet.close()
                p.fleet = None
    finally:
        os.unlink(path)
        coord.close()

