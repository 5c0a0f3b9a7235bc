"""Malformed requests that aiohttp's parser refuses (a request line over 8 KiB, a bad
header) are one warning line, not a traceback each, at most one line per interval with a
count of the rest, never echoing the client's bytes; an exception in a handler of ours
keeps its traceback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

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


class Captured(logging.Handler):
    """What reaches the handlers of ``aiohttp.server`` (after its filters)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self) -> str:
        fmt = logging.Formatter()
        return "\n".join(fmt.format(r) for r in self.records)


async def test_parse_errors_are_one_line_at_most_once_per_interval() -> None:
    log = logging.getLogger(http_errors_log.LOGGER)
    filters, state = list(log.filters), vars(http_errors_log.bad_requests).copy()
    one = http_errors_log.install()
    assert http_errors_log.install() is one  # once per process
    clock = Clock()
    one.clock = clock
    http_errors_log.bad_requests.logged_at = clock.t - http_errors_log.BAD_REQUEST_LOG_S
    http_errors_log.bad_requests.unlogged = 0
    out = Captured()
    log.addHandler(out)
    secret = b"/v1/" + b"prompt-words-" * 700  # 9,100 bytes
    try:
        async with app_on_port_0() as port:
            got = await raw(port, b"GET " + secret + b" HTTP/1.1\r\nHost: x\r\n\r\n")
            assert got.startswith(b"HTTP/1.0 400")
            await asyncio.sleep(0.05)
            assert [r.getMessage() for r in out.records] == [
                "llmtop: malformed request from 127.0.0.1 answered 400 (LineTooLong)"]
            assert out.records[0].levelname == "WARNING" and out.records[0].exc_info is None
            long_header = b"GET / HTTP/1.1\r\nX-Note: " + b"n" * 9000 + b"\r\n\r\n"
            for _ in range(3):  # within the interval: counted, not written
                assert (await raw(port, long_header)).startswith(b"HTTP/1.0 400")
            await asyncio.sleep(0.05)
            assert len(out.records) == 1
            clock.t += http_errors_log.BAD_REQUEST_LOG_S
            await raw(port, long_header)
            await asyncio.sleep(0.05)
            last = out.records[-1].getMessage()
            assert last.endswith("answered 400 (LineTooLong); 3 more since the last such "
                                 "line"), last
            assert "prompt-words" not in out.text() and "Traceback" not in out.text()
            # a handler's own exception is a bug of ours: its traceback stays
            got = await raw(port, b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
            assert got.startswith(b"HTTP/1.1 500")
            await asyncio.sleep(0.05)
            assert "Traceback" in out.text() and "a bug of ours" in out.text()
    finally:
        log.removeHandler(out)
        log.filters[:] = filters
        vars(http_errors_log.bad_requests).update(state)
