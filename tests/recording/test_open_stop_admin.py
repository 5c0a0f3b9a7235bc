"""Requests still open when a recording stops are never written (a record is written when
its request ends): the footer's ``open_at_stop`` counts them, and the admin API's stop
answer, the report and the exit line say so. A request open when a recording starts is
carried in (written when it ends), and ``llmtop run``'s own shutdown lets its streams
end or cuts them (recorded ``cancelled``) before the recording stops: 0 there.

Real sockets: the simulator behind llmtop's proxy, streams held open with the
simulator's ``X-Sim-Fault: stall`` (a pause after the first chunk).
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmtop.config import load_config
from llmtop.events import RequestRecord
from llmtop.recording.reader import RecordingReader
from llmtop.recording.report.analyse import analyse
from llmtop.recording.report.html import render_html
from llmtop.recording.report.jsonfmt import render_json
from llmtop.recording.report.text import render_text
from llmtop.server import LlmtopServer
from llmtop.sim.server import running_sim

pytestmark = pytest.mark.timeout(90)

SAID = "3 requests were still open when the recording stopped; they are not in it"


def body(max_tokens: int = 4) -> str:
    return json.dumps({"model": "sim-tiny", "max_tokens": max_tokens, "stream": True,
                       "messages": [{"role": "user", "content": "hello"}]})


async def chat(s: aiohttp.ClientSession, proxy: str, fault: str = "") -> bytes:
    headers = {"Content-Type": "application/json"}
    if fault:
        headers["X-Sim-Fault"] = fault
    async with s.post(proxy + "/v1/chat/completions", data=body(), headers=headers) as r:
        return await r.read()


async def wait_open(server: LlmtopServer, n: int) -> None:
    for _ in range(200):
        if len(server.active) == n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{len(server.active)} requests open, not {n}")


def make_server(sim_url: str, **more: Any) -> LlmtopServer:
    cfg = load_config(None, env={}, overrides={
        "upstream": sim_url, "listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
        "gpu.source": "none", "recording.flush_s": 0.1, **more})
    return LlmtopServer(cfg, out=io.StringIO())


async def test_admin_stop_mid_stream_counts_the_open_requests(tmp_path: Path) -> None:
    path = tmp_path / "open.jsonl"
    async with running_sim("tiny", seed=3) as sim:
        server = make_server(sim.url)
        await server.start()
        try:
            api = server.admin_url + "/llmtop/v1/recording"
            async with aiohttp.ClientSession() as s:
                # one open before the recording starts, ending inside it: carried in
                early = asyncio.create_task(chat(s, server.proxy_url, "stall:1200@1"))
                await wait_open(server, 1)
                async with s.post(api, json={"action": "start", "path": str(path)}) as r:
                    assert r.status == 200, await r.text()
                await chat(s, server.proxy_url)  # one whole request inside it
                await early
                held = [asyncio.create_task(chat(s, server.proxy_url, "stall:20000@1"))
                        for _ in range(3)]
                await wait_open(server, 3)
                async with s.post(api, json={"action": "stop"}) as r:
                    assert r.status == 200, await r.text()
                    done = await r.json()
                for t in held:
                    t.cancel()
                await asyncio.gather(*held, return_exceptions=True)
        finally:
            summary = await server.stop(0)
    assert done["open_at_stop"] == 3
    assert done["note"] == SAID
    with RecordingReader(path) as rd:
        recs = [e for e in rd if isinstance(e, RequestRecord)]
        footer = rd.footer
        started = float(rd.header["started_at"])
        assert rd.summary()["open_at_stop"] == 3
        assert rd.problems == []
    assert footer is not None and footer["open_at_stop"] == 3
    # the two that ended inside it are there, the one begun before it included
    assert len(recs) == 2 and all(r.outcome == "ok" for r in recs)
    assert min(r.t_start for r in recs) < started
    # the exit line (the recording was stopped already: no line for it)
    assert not any("still open" in n for n in summary.notes)

    rep = analyse(path)
    assert rep["source"]["open_at_stop"] == 3
    assert SAID in render_text(rep)
    assert SAID in render_html(rep)
    assert json.loads(render_json(rep))["source"]["open_at_stop"] == 3


async def test_a_stop_with_nothing_open_says_nothing(tmp_path: Path) -> None:
    path = tmp_path / "closed.jsonl"
    async with running_sim("tiny", seed=3) as sim:
        server = make_server(sim.url)
        await server.start()
        try:
            api = server.admin_url + "/llmtop/v1/recording"
            async with aiohttp.ClientSession() as s:
                async with s.post(api, json={"action": "start", "path": str(path)}) as r:
                    assert r.status == 200, await r.text()
                await chat(s, server.proxy_url)
                async with s.post(api, json={"action": "stop"}) as r:
                    done = await r.json()
        finally:
            await server.stop(0)
    assert done["open_at_stop"] == 0 and "note" not in done
    with RecordingReader(path) as rd:
        assert len([e for e in rd if isinstance(e, RequestRecord)]) == 1
        assert rd.footer is not None and rd.footer["open_at_stop"] == 0
    assert "still open" not in render_text(analyse(path))


async def test_runs_own_shutdown_cuts_the_streams_and_leaves_none_open(
        tmp_path: Path) -> None:
    """``llmtop run --record``'s shutdown: the grace, then the streams still open are cut
    and recorded ``cancelled`` before the recording stops — none is left out."""
    path = tmp_path / "run.jsonl"
    async with running_sim("tiny", seed=3) as sim:
        server = make_server(sim.url, **{"recording.path": str(path),
                                         "timeouts.shutdown_grace_s": 0.3})
        await server.start()
        async with aiohttp.ClientSession() as s:
            held = [asyncio.create_task(chat(s, server.proxy_url, "stall:20000@1"))
                    for _ in range(2)]
            try:
                await wait_open(server, 2)
                summary = await server.stop()
            finally:
                await asyncio.gather(*held, return_exceptions=True)
    with RecordingReader(path) as rd:
        recs = [e for e in rd if isinstance(e, RequestRecord)]
        assert rd.footer is not None and rd.footer["open_at_stop"] == 0
    assert sorted(r.outcome for r in recs) == ["cancelled", "cancelled"]
    line = next(n for n in summary.notes if n.startswith("llmtop: recording "))
    assert line.endswith(": 2 requests") and "still open" not in line
