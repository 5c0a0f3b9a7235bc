"""An open request's ``tps`` is its rate up to now (QA: measured to its last chunk, a
stream stalled for 20 s kept showing 40 tok/s in the TUI's requests table)."""

from __future__ import annotations

import time

import aiohttp
import pytest
from aiohttp import web

from llmtop.admin.routes import AdminContext, make_admin_app
from llmtop.config import Config
from llmtop.events import ActiveRequest
from llmtop.metrics.aggregator import Aggregator

S = 1_000_000_000  # ns a second


def _streaming(first_ns: int, last_ns: int | None, tokens: int) -> ActiveRequest:
    return ActiveRequest("r1", "alice", "m", "openai", "/v1/chat/completions", True,
                         t_start=1.7e9, t0_ns=0, first_token_ns=first_ns,
                         last_chunk_ns=last_ns, chunks=tokens, tokens=tokens)


def test_a_stalled_stream_shows_a_falling_rate() -> None:
    a = _streaming(1 * S, 2 * S, 41)  # 40 tokens after the first, in 1 s: 40 tok/s
    assert a.to_json_dict(2 * S)["tps"] == pytest.approx(40.0)
    during = [a.to_json_dict(t * S)["tps"] for t in (3, 6, 12, 22)]
    assert during == pytest.approx([40 / 2, 40 / 5, 40 / 11, 40 / 21])  # falling, not 40
    a.tokens, a.last_chunk_ns = 81, 23 * S  # it resumes: the rate climbs again
    assert a.to_json_dict(23 * S)["tps"] == pytest.approx(80 / 22)


def test_a_chunk_written_after_now_was_read_is_not_a_negative_span() -> None:
    a = _streaming(1 * S, 3 * S, 21)  # the relay's thread wrote at 3 s; "now" read at 2 s
    assert a.to_json_dict(2 * S)["tps"] == pytest.approx(10.0)


def test_no_rate_before_a_second_token_or_over_no_time() -> None:
    waiting = ActiveRequest("r2", "bob", None, "openai", "/v1", True, 0.0, 0)
    assert waiting.to_json_dict(5 * S)["tps"] is None
    assert _streaming(1 * S, 1 * S, 1).to_json_dict(9 * S)["tps"] is None
    assert _streaming(1 * S, 1 * S, 5).to_json_dict(1 * S)["tps"] is None  # 0 s so far
    assert _streaming(1 * S, None, 3).to_json_dict(2 * S)["tps"] == pytest.approx(2.0)


async def test_the_admin_api_lists_the_stalled_rate() -> None:
    now = time.perf_counter_ns()
    active = {"r1": _streaming(now - 21 * S, now - 20 * S, 41)}
    active["r1"].t0_ns = now - 22 * S
    ctx = AdminContext(aggregator=Aggregator(Config(), active), active=active)
    runner = web.AppRunner(make_admin_app(ctx), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/llmtop/v1/requests?state=active"
    try:
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            rows = await r.json()
    finally:
        await runner.cleanup()
    assert [x["state"] for x in rows] == ["streaming"]
    assert 1.5 < rows[0]["tps"] < 40 / 21 + 0.01  # 20 s without a chunk: ~1.9, not 40


class _FirstTokenMidRow(ActiveRequest):
    """The relay's thread writes the first token while a row is being built: the first
    read of ``first_token_ns`` sees None, every later one the time."""

    __slots__ = ("_ft", "_ft_reads")

    @property  # type: ignore[override]
    def first_token_ns(self) -> int | None:
        self._ft_reads = getattr(self, "_ft_reads", 0) + 1
        return None if self._ft_reads == 1 else self._ft

    @first_token_ns.setter
    def first_token_ns(self, value: int | None) -> None:
        self._ft = 1 * S if value is None else value


def test_a_row_is_consistent_when_the_first_token_lands_while_it_is_built() -> None:
    a = _FirstTokenMidRow("r1", "alice", "m", "openai", "/v1", True, t_start=1.7e9, t0_ns=0,
                          chunks=1, tokens=1)
    row = a.to_json_dict(2 * S)
    # one reading of first_token_ns for the whole row: waiting and no TTFT (it was: state
    # "streaming" beside ttft_s None, read before and after the relay's write)
    assert (row["state"], row["ttft_s"]) == ("waiting", None)
    row = a.to_json_dict(2 * S)
    assert (row["state"], row["ttft_s"]) == ("streaming", 1.0)
