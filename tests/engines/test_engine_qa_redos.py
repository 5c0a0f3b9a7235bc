"""QA: a malformed /metrics line with a long run of blanks made the exposition reader
backtrack quadratically (or worse): a name, 100,000 blanks and "x y z" took a minute of CPU
to refuse, in the worker thread that shares the interpreter lock with the forwarding path,
and asyncio.run's shutdown waited for it. Now such a line is refused in linear time: the
scrape fails at once with a clear status. Over a real socket (aiohttp on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from net_support import serving

from llmtop.engines.exposition import iter_samples
from llmtop.engines.scraper import EngineScraper, ScrapeError

N = 50_000
GOOD = "vllm:num_requests_running 3\n"
BAD_LINES = {
    "blanks then three words": "vllm:num_requests_waiting" + " " * N + "x y z",
    "blanks around labels": "vllm:num_requests_waiting" + " " * N + '{a="b"}' + " " * N
                            + "1 2 3",
    "blanks between value and timestamp": "vllm:num_requests_waiting 1" + " " * N + "2"
                                          + " " * N + "3",
    "blanks inside labels": 'vllm:num_requests_waiting{a="b"' + " " * N + "x} 1",
    "unclosed quote": 'vllm:num_requests_waiting{a="' + '\\"x' * N,
}


@contextlib.asynccontextmanager
async def serving_metrics(body: str) -> AsyncIterator[str]:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")

    async with serving(web.get("/metrics", metrics)) as url:
        yield url + "/metrics"

@pytest.mark.parametrize("line", BAD_LINES.values(), ids=list(BAD_LINES))
def test_reader_refuses_in_linear_time(line: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="line 2"):
        list(iter_samples(GOOD + line + "\n"))
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("line", BAD_LINES.values(), ids=list(BAD_LINES))
async def test_scrape_of_such_a_line_fails_at_once(line: str) -> None:
    async with serving_metrics(GOOD + line + "\n") as url, aiohttp.ClientSession() as session:
        sc = EngineScraper(url, session, lambda e: None)
        t0 = time.perf_counter()
        with pytest.raises(ScrapeError, match="is not Prometheus text") as info:
            await asyncio.wait_for(sc.scrape_once(session), 5.0)
        assert time.perf_counter() - t0 < 2.0
    assert len(str(info.value)) < 200  # the status quotes the line, cut short


def test_blanks_still_read_where_the_format_allows_them() -> None:
    text = ('a' + " " * N + "1\n" + 'b ' + " " * N + '{x="1"}' + " " * N + "2" + " " * N
            + "1700000000000" + " " * N + "\n")
    assert list(iter_samples(text)) == [("a", {}, 1.0), ("b", {"x": "1"}, 2.0)]
