"""An open request's row (``/llmtop/v1/requests?state=active``, "fields so far") mid-stream:
what is known is shown, with one proxy process and with ``--workers N`` alike.

QA saw ``status`` and ``prompt_tokens`` null on a streaming request's row under
``--workers 2`` although the head (200) had gone to the client and the stream had given
the prompt's size (Anthropic's ``message_start``, OpenAI's continuous usage). One process
showed the same nulls: the row never carried either field. Both now come from the request
itself — the status once its head has gone out, the prompt size from the stream's parser
when a reader asks — and a worker ships them with its other open-request fields.
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

import aiohttp
from engine_ids import seen_id
from test_workers import start_run

from llmtop.sim.server import running_sim
from llmtop.tui.source import AdminSource

STALL_MS = 8000
"""How long the simulator holds each stream after its second content chunk: the rows are
read during that pause (a worker reports every 0.5 s; the poll gives up after 7 s)."""

SAME_ANYWHERE = ("type", "user", "model", "dialect", "path", "stream", "status", "outcome",
                 "state", "e2e_s", "prompt_tokens", "chunks", "completion_tokens",
                 "token_source", "error")
"""Row fields that do not depend on when or in which proxy the request ran."""
AS_RECORDED = ("id", "user", "model", "dialect", "path", "stream", "status", "t_start",
               "ttft_s", "prompt_tokens", "concurrency_at_start", "upstream_id")
"""Row fields already final mid-stream: equal to the finished record's."""


def bodies() -> dict[str, tuple[str, dict[str, Any]]]:
    """Per dialect: a path and a streamed request whose stream gives the prompt's size
    before its content ends."""
    messages = [{"role": "user", "content": "hello there"}]
    return {
        "anthropic": ("/v1/messages", {"model": "claude-x", "max_tokens": 4, "stream": True,
                                       "messages": messages}),
        "openai": ("/v1/chat/completions", {
            "model": "m", "max_tokens": 4, "stream": True, "messages": messages,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
    }


async def rows_mid_stream(s: aiohttp.ClientSession, admin: str) -> list[dict[str, Any]]:
    """The active rows once both streams are held after their second chunk."""
    rows: list[dict[str, Any]] = []
    for _ in range(70):
        async with s.get(admin + "/llmtop/v1/requests?state=active") as r:
            rows = await r.json()
        if len(rows) == 2 and all(x["chunks"] == 2 for x in rows):
            return rows
        await asyncio.sleep(0.1)
    raise AssertionError(f"never saw both streams held after 2 chunks: {rows}")


async def recorded(s: aiohttp.ClientSession, admin: str, ids: set[str]
                   ) -> dict[str, dict[str, Any]]:
    """The finished records of ``ids`` (workers forward every 0.5 s)."""
    got: dict[str, dict[str, Any]] = {}
    for _ in range(100):
        async with s.get(admin + "/llmtop/v1/requests?state=recent") as r:
            got = {x["id"]: x for x in await r.json() if x["id"] in ids}
        if len(got) == len(ids):
            break
        await asyncio.sleep(0.1)
    return got


async def one_proxy(sim_url: str, workers: int) -> dict[str, Any]:
    """Both streams through ``llmtop run --workers N``: the rows mid-stream (by dialect),
    what the TUI's source read then, and the finished records."""
    proc, proxy, admin = await start_run(
        "--upstream", sim_url, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
        "--workers", str(workers), "--gpu-source", "none")
    try:
        conn = aiohttp.TCPConnector(force_close=True)  # new connections: any worker
        async with aiohttp.ClientSession(connector=conn) as s:

            async def stream(path: str, body: dict[str, Any]) -> tuple[int, str]:
                async with s.post(proxy + path, data=json.dumps(body), headers={
                        "Content-Type": "application/json", "X-LLMTOP-User": "ann",
                        "X-Sim-Fault": f"stall:{STALL_MS}@2"}) as r:
                    return r.status, seen_id(await r.read())

            held = [asyncio.create_task(stream(p, b)) for p, b in bodies().values()]
            rows = await rows_mid_stream(s, admin)
            # the TUI's requests screen reads these; each read is asserted, so 5 s rather
            # than the TUI's 2 s (a loaded machine), well inside the streams' 8 s hold
            source = AdminSource([admin], timeout_s=5.0)
            try:
                tui = await source.active_requests()
                snap = await source.fetch(60)  # (the dashboard asks with the snapshot)
                tui_snap = await source.active_requests()
            finally:
                await source.close()
            answers = await asyncio.gather(*held)
            assert [status for status, _ in answers] == [200, 200]
            records = await recorded(s, admin, {r["id"] for r in rows})
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode()
    assert snap.get("system", {}).get("in_flight") == 2
    return {"rows": {r["dialect"]: r for r in rows}, "tui": tui, "tui_snap": tui_snap,
            "records": {r["dialect"]: r for r in records.values()},
            "seen_ids": {d: rid for d, (_, rid) in zip(bodies(), answers, strict=True)}}


def settled(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` less what changes from one read to the next (age and rate)."""
    return {k: v for k, v in row.items() if k not in ("age_s", "tps")}


async def test_an_open_streams_row_shows_what_is_known_with_one_process_or_two() -> None:
    # decode steps 0.1 s apart: a stream's first two content chunks reach the proxy in two
    # reads (at tiny's ~15 ms a loaded CI machine once gave both to one read: one chunk of
    # 2 tokens, which is right, but not the row this test reads)
    async with running_sim("tiny", max_num_seqs=16, base_step_s=0.1) as sim:
        single, fleet = await asyncio.gather(one_proxy(sim.url, 1), one_proxy(sim.url, 2))
    for got in (single, fleet):
        assert set(got["rows"]) == set(got["records"]) == {"anthropic", "openai"}
        for dialect, row in got["rows"].items():
            rec = got["records"][dialect]
            assert rec["outcome"] == "ok" and rec["prompt_tokens"], rec
            # the head (200) has gone out; the stream has given the prompt's size
            assert row["status"] == 200, row
            assert row["prompt_tokens"] == rec["prompt_tokens"], row
            assert {k: row[k] for k in AS_RECORDED} == {k: rec[k] for k in AS_RECORDED}
            assert (row["state"], row["chunks"], row["completion_tokens"]) == (
                "streaming", 2, 2)
            assert (row["outcome"], row["e2e_s"], row["error"]) == (None, None, None)
            # the engine's id the client read, mid-stream and in the record (with N
            # workers, both crossed the workers' wire)
            assert row["upstream_id"] == rec["upstream_id"] == got["seen_ids"][dialect], row
        # the TUI reads the same rows (its own GET, and with the dashboard's snapshot)
        api = sorted((settled(r) for r in got["rows"].values()), key=lambda r: r["id"])
        for tui in (got["tui"], got["tui_snap"]):
            assert sorted((settled(r) for r in tui), key=lambda r: r["id"]) == api
    # N workers show every field one process shows, the same where it does not depend on
    # when the request ran
    for dialect, one in single["rows"].items():
        two = fleet["rows"][dialect]
        assert set(two) == set(one)
        assert {k for k, v in two.items() if v is None} == {
            k for k, v in one.items() if v is None}, (one, two)
        assert {k: two[k] for k in SAME_ANYWHERE} == {k: one[k] for k in SAME_ANYWHERE}
