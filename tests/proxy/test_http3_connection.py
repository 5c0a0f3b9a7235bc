"""``Connection: close`` wins over ``keep-alive`` in the same request (RFC 9112 9.3, 9.6).

A client that sends both tokens (in one field or two) asks for the connection to close
after the response; HTTP/1.0 clients and gateways that add ``close`` to a field already
holding ``keep-alive`` do so. The proxy kept such an HTTP/1.0 connection open and said
``Connection: keep-alive`` — aiohttp's C parser (llhttp) keeps an HTTP/1.0 connection
whenever ``keep-alive`` is among the tokens, and the direct path read it the same way —
so the client waited for a close that never came. Checked cold (aiohttp's parser) and
warm (served directly), against a raw upstream, with raw client sockets.
"""

from __future__ import annotations

import asyncio

import pytest
from test_proxy_support import running_proxy
from test_qa_hostile import OK, exchange, get, raw_upstream


async def _answer_and_close(url: str, request: bytes) -> tuple[bytes, bool]:
    """Send ``request`` on a fresh connection; returns what came back within 1.5 s and
    whether the proxy closed the connection after it."""
    host, port = url.removeprefix("http://").split(":")
    r, w = await asyncio.open_connection(host, int(port))
    w.write(request)
    got = b""
    try:
        async with asyncio.timeout(1.5):
            while True:
                data = await r.read(65536)
                if not data:
                    return got, True
                got += data
    except TimeoutError:
        return got, False
    finally:
        w.close()


CLOSING = [
    (b"1.0", [b"keep-alive, close"]),
    (b"1.0", [b"close, keep-alive"]),
    (b"1.0", [b"keep-alive", b"close"]),
    (b"1.0", [b"Keep-Alive,CLOSE"]),
    (b"1.1", [b"close, keep-alive"]),
    (b"1.1", [b"keep-alive, close"]),
    (b"1.1", [b"keep-alive", b"close"]),
]


def _request(version: bytes, fields: list[bytes]) -> bytes:
    return (b"GET /x HTTP/" + version + b"\r\nHost: x\r\n"
            + b"".join(b"Connection: " + f + b"\r\n" for f in fields) + b"\r\n")


async def _served(request: bytes, warm: bool) -> tuple[bytes, bool]:
    async def respond(_head: bytes, _n: int) -> bytes:
        return OK

    async with raw_upstream(respond) as (url, _heads, _conns), \
            running_proxy(url) as (proxy, purl, _recs):
        if warm:
            assert (await exchange(purl, [get("/prime")]))[0][0] == 200
        starts = proxy.direct_starts
        got, closed = await _answer_and_close(purl, request)
        assert (proxy.direct_starts > starts) == warm  # the path the case names was taken
    return got, closed


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize(("version", "fields"), CLOSING,
                         ids=[v.decode() + ":" + "|".join(f.decode() for f in fs)
                              for v, fs in CLOSING])
async def test_close_wins_over_keep_alive(version: bytes, fields: list[bytes],
                                          warm: bool) -> None:
    got, closed = await _served(_request(version, fields), warm)
    head = got.partition(b"\r\n\r\n")[0].lower()
    assert got.startswith(b"HTTP/" + version + b" 200") and got.endswith(b"\r\n\r\nok"), got
    assert b"connection: keep-alive" not in head
    assert closed, "the connection was kept open"


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize(("version", "fields"), [(b"1.0", [b"keep-alive"]), (b"1.1", [])],
                         ids=["1.0:keep-alive", "1.1:none"])
async def test_keep_alive_alone_still_keeps_the_connection(
        version: bytes, fields: list[bytes], warm: bool) -> None:
    got, closed = await _served(_request(version, fields), warm)
    assert got.startswith(b"HTTP/" + version + b" 200") and got.endswith(b"\r\n\r\nok"), got
    assert not closed
