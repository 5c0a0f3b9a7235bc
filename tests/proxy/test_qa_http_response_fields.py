"""Response fields at the socket level, compared with what the upstream itself sent: the
proxy passes the upstream's head on and adds only what it must (framing, ``Date``)."""

from __future__ import annotations

import asyncio

import pytest
from test_proxy_support import running_proxy
from test_qa_hostile import exchange, get, raw_upstream

_UNTYPED = {
    "length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("framing", sorted(_UNTYPED))
async def test_a_body_without_content_type_gets_none_added(framing: str) -> None:
    """RFC 9110 8.3: without ``Content-Type`` the recipient may sniff the content or take
    it as ``application/octet-stream`` — its choice. The proxy wrote ``Content-Type:
    application/octet-stream`` into every such answer (as aiohttp's response would), so a
    client saw a field the upstream never sent, and one that rules out sniffing (a
    browser downloads what it would have shown). Both ways in: cold (aiohttp's path) and
    warm (served directly)."""

    async def respond(_head: bytes, _n: int) -> bytes:
        return _UNTYPED[framing]

    async with raw_upstream(respond) as (url, _h, _c), \
            running_proxy(url) as (proxy, purl, _r):
        got = await exchange(purl, [get("/a"), get("/b")])
        assert proxy.direct_starts == 1
    for status, headers, body in got:
        assert (status, body) == (200, b"hello")
        assert "content-type" not in headers, headers
        assert "date" in headers  # (a proxy adds Date when the upstream sent none)


async def test_the_upstreams_content_type_passes_unchanged() -> None:
    """The other side: a Content-Type the upstream sent is the one the client gets."""

    async def respond(_head: bytes, _n: int) -> bytes:
        return (b"HTTP/1.1 200 OK\r\ncontent-type: Text/Plain; charset=latin-1\r\n"
                b"Content-Length: 2\r\n\r\nok")

    async with raw_upstream(respond) as (url, _h, _c), \
            running_proxy(url) as (_, purl, _r):
        got = await exchange(purl, [get("/a"), get("/b")])
    assert [h["content-type"] for _, h, _ in got] == ["Text/Plain; charset=latin-1"] * 2


def _sse(accel: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + accel
            + b"Transfer-Encoding: chunked\r\n\r\n7\r\ndata: 1\r\n0\r\n\r\n")


@pytest.mark.parametrize(
    ("upstream_field", "client_sees"),
    [
        (b"X-Accel-Buffering: no\r\n", ["no"]),
        (b"x-accel-buffering: yes\r\n", ["yes"]),
        (b"", ["no"]),
    ],
    ids=["upstream-no", "upstream-yes", "none"],
)
async def test_a_stream_has_one_x_accel_buffering(upstream_field: bytes,
                                                  client_sees: list[str]) -> None:
    """The proxy adds ``X-Accel-Buffering: no`` to a stream so that a buffering proxy in
    front of it does not batch the chunks — but only when the upstream has not said
    already: sse-starlette (llama-cpp-python, many OpenAI-compatible servers) sends the
    field on every stream, and the client got it twice; an upstream's own ``yes`` was
    contradicted by a second field."""

    async def respond(_head: bytes, _n: int) -> bytes:
        return _sse(upstream_field)

    async with raw_upstream(respond) as (url, _h, _c), \
            running_proxy(url) as (proxy, purl, _r):
        heads = []
        for _ in range(2):  # cold (aiohttp's path), then warm (served directly)
            host, port = purl.removeprefix("http://").split(":")
            r, w = await asyncio.open_connection(host, int(port))
            try:
                w.write(get("/stream"))
                async with asyncio.timeout(5):
                    heads.append(await r.readuntil(b"\r\n\r\n"))
            finally:
                w.close()
        assert proxy.direct_starts == 1
    for head in heads:
        values = [line.partition(b":")[2].strip().decode() for line in head.split(b"\r\n")
                  if line.lower().startswith(b"x-accel-buffering:")]
        assert values == client_sees, head
