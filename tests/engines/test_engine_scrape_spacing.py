"""An exposition slow to parse is scraped less often: parsing holds the interpreter the
proxy forwards tokens with, so it may take at most ``PARSE_SHARE`` of a core on average
(16 MB of vLLM text takes ~0.5 s of CPU: once a second, half a core). Over real sockets;
only the parse's CPU clock is given, to say how long the parse "took"."""

from __future__ import annotations

import asyncio
import itertools
import math
from pathlib import Path

import aiohttp
from test_engine_scraper import Server, running, serve, until

from llmtop.engines import EngineScraper
from llmtop.engines.scraper import INLINE_PARSE_CHARS, PARSE_SHARE

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
TEXT = (FIXTURES / "vllm_v1_metrics.txt").read_text()


def parse_taking(cpu_s: float) -> itertools.count[float]:
    """A CPU clock on which each parse (read before and after) takes ``cpu_s``."""
    return itertools.count(0.0, cpu_s)


async def test_a_slow_parse_spaces_the_scrapes_on_the_grid_and_says_so() -> None:
    srv = Server(TEXT)
    async with serve(srv), aiohttp.ClientSession() as session:
        sc = EngineScraper(srv.base + "/metrics", session, lambda e: None, interval_s=1.0,
                           parse_clock=parse_taking(0.25).__next__)
        await sc.scrape_once(session)
    assert sc.parse_s == 0.25
    assert math.isclose(sc.spacing_s, 0.25 / PARSE_SHARE)  # 5 s
    for now in (100.0, 100.3, 100.999):
        delay = sc._delay(now)
        assert delay >= sc.spacing_s
        assert delay < sc.spacing_s + 1.0
        assert math.isclose((now + delay) % 1.0, 0.0, abs_tol=1e-6) or math.isclose(
            (now + delay) % 1.0, 1.0, abs_tol=1e-6)  # on the interval's grid
    status = sc.describe(sc.latest) if sc.latest else ""
    assert status.startswith(f"vllm engine at {srv.base}/metrics; scraped every 5 s, not 1 s")
    assert "takes 250 ms of CPU" in status


async def test_a_fast_parse_keeps_the_interval() -> None:
    srv = Server(TEXT)
    async with serve(srv), aiohttp.ClientSession() as session:
        sc = EngineScraper(srv.base + "/metrics", session, lambda e: None, interval_s=1.0,
                           parse_clock=parse_taking(0.01).__next__)
        await sc.scrape_once(session)
    assert sc.spacing_s == 1.0
    assert math.isclose(sc._delay(100.25), 0.75)
    assert sc.latest is not None
    assert sc.describe(sc.latest) == f"vllm engine at {srv.base}/metrics"


async def test_the_running_loop_waits_the_spacing() -> None:
    """Every 0.1 s asked, each parse "taking" 0.1 s of CPU: the next scrape waits 2 s,
    so in the first 1.5 s the engine is asked once (at the interval: ~15 times)."""
    srv = Server(TEXT)
    async with serve(srv):
        sc = EngineScraper(srv.base + "/metrics", None, lambda e: None, interval_s=0.1,
                           parse_clock=parse_taking(0.1).__next__)
        async with running(sc):
            await until(lambda: sc.scrapes >= 1)
            await asyncio.sleep(1.5)
            assert srv.hits == 1
            assert "scraped every 2 s, not 0.1 s" in sc.status


async def test_the_real_cpu_clock_measures_a_big_parse() -> None:
    """Without a given clock the parse's own thread CPU time is read: a big exposition
    (parsed in a thread) reads a positive time, and the spacing follows from it."""
    big = "".join(TEXT.replace('model_name="', f'model_name="m{i}-') for i in range(40))
    assert len(big) > INLINE_PARSE_CHARS
    srv = Server(big)
    async with serve(srv), aiohttp.ClientSession() as session:
        sc = EngineScraper(srv.base + "/metrics", session, lambda e: None, interval_s=1.0)
        await sc.scrape_once(session)
    assert 0.0 < sc.parse_s < 5.0
    assert sc.parse_chars == len(big)
    assert sc.spacing_s == max(1.0, sc.parse_s / PARSE_SHARE)

