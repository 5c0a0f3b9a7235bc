"""Malformed requests that aiohttp's parser refuses (a request line over 8 KiB, a bad
method) are one line on the proxy's output, not a traceback each, at most one line per
interval with a count of the rest, never echoing the client's bytes; an exception in a
handler of ours keeps its traceback."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from llmtop import http_errors_log


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@asynccontextmanager
async def app_on_port_0() -> AsyncIterator[int]:
    async def boom(request: web.Request) -> web.Response:
        raise RuntimeError("a bug of ours")

    app = web.Application()
    app.router.add_get("/boom", boom)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    got = await asyncio.wait_for(reader.read(200), 5)
    writer.close()
    return got


@pytest.fixture
def out() -> io.StringIO:
    return io.StringIO()


async def test_parse_errors_are_one_line_at_most_once_per_interval(out: io.StringIO) -> None:
    log = logging.getLogger(http_errors_log.LOGGER)
    before = (list(log.handlers), log.propagate)
    handler = http_errors_log.install(out)
    clock = Clock()
    handler.clock = clock
    secret = b"/v1/" + b"prompt-words-" * 700  # 9,100 bytes
    try:
        async with app_on_port_0() as port:
            got = await raw(port, b"GET " + secret + b" HTTP/1.1\r\nHost: x\r\n\r\n")
            assert got.startswith(b"HTTP/1.0 400")
            await asyncio.sleep(0.05)
            lines = out.getvalue().splitlines()
            assert lines == ["llmtop: refused a malformed HTTP request from 127.0.0.1 "
                             "(LineTooLong, answered 400)"]
            long_header = b"GET / HTTP/1.1\r\nX-Note: " + b"n" * 9000 + b"\r\n\r\n"
            for _ in range(3):  # within the interval: counted, not written
                assert (await raw(port, long_header)).startswith(b"HTTP/1.0 400")
            await asyncio.sleep(0.05)
            assert len(out.getvalue().splitlines()) == 1
            clock.t += 10.0
            await raw(port, long_header)
            await asyncio.sleep(0.05)
            last = out.getvalue().splitlines()[-1]
            assert last.endswith("answered 400); 3 more since"), last
            assert "prompt-words" not in out.getvalue() and "Traceback" not in out.getvalue()
            # a handler's own exception is a bug of ours: its traceback stays
            got = await raw(port, b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
            assert got.startswith(b"HTTP/1.1 500")
            await asyncio.sleep(0.05)
            assert "Traceback" in out.getvalue() and "a bug of ours" in out.getvalue()
    finally:
        log.handlers[:], log.propagate = before
