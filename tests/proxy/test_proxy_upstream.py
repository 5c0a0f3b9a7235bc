"""The proxy's own HTTP/1.1 upstream client: framing (chunked at every split, trailers,
Content-Length, until-close, 1xx, HEAD/204), keep-alive reuse, stale connections and
malformed responses — against raw TCP upstreams that write exact bytes."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from test_proxy_support import running_proxy

from llmtop.proxy.headers import upstream_field_lines
from llmtop.proxy.upstream import (
    BufferSink,
    MalformedResponse,
    ResponseHead,
    UpstreamClosed,
    UpstreamConnection,
    UpstreamPool,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_upstream(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server whose handler writes raw bytes; yields its URL and a list that counts
    accepted connections."""
    accepted: list[int] = []

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(r, w, len(accepted))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        server.close()
        await server.wait_closed()


async def read_request(r: asyncio.StreamReader) -> bytes:
    head = await r.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await r.readexactly(int(line.split(b":")[1]))
    return head


CHUNKED_BODY = (b"5;ext=1\r\nhello\r\n"
                b"7\r\n, world\r\n"
                b"1A\r\n" + b"z" * 26 + b"\r\n"
                b"0\r\nX-Trailer: yes\r\n\r\n")
CHUNKED_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
PAYLOAD = b"hello, world" + b"z" * 26


async def _conn_pair() -> tuple[UpstreamConnection, socket.socket, UpstreamPool]:
    """An UpstreamConnection on a real socket pair; the test plays the upstream by calling
    ``data_received`` with reads of its choosing (the path a network read takes)."""
    a, b = socket.socketpair()
    pool = UpstreamPool("http://upstream.test", 1.0)
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(lambda: UpstreamConnection(pool), sock=a)
    return conn, b, pool


async def test_chunked_body_split_at_every_byte_boundary() -> None:
    response = CHUNKED_HEAD + CHUNKED_BODY
    for cut in range(1, len(response)):
        for cut2 in (cut, min(len(response) - 1, cut + 7)):
            conn, peer, _ = await _conn_pair()
            try:
                fut = conn.send(b"GET / HTTP/1.1\r\n\r\n", False)
                pieces = [response[:cut], response[cut:cut2], response[cut2:]]
                sink = BufferSink(asyncio.get_running_loop())
                head: ResponseHead | None = None
                for piece in pieces:
                    if piece:
                        conn.data_received(piece)
                    if head is None and fut.done():
                        head = fut.result()
                        conn.attach(sink)
                assert head is not None and head.chunked and head.status == 200
                assert await asyncio.wait_for(sink.done, 1) == PAYLOAD, (cut, cut2)
                assert conn.reusable
            finally:
                conn.close()
                peer.close()


@pytest.mark.parametrize(
    ("body", "why"),
    [(b"zz\r\nhello\r\n0\r\n\r\n", "chunk size"),
     (b"5\r\nhelloXX0\r\n\r\n", "CRLF")],
)
async def test_malformed_chunked_is_an_error(body: bytes, why: str) -> None:
    conn, peer, _ = await _conn_pair()
    try:
        fut = conn.send(b"GET / HTTP/1.1\r\n\r\n", False)
        conn.data_received(CHUNKED_HEAD)
        await fut
        sink = BufferSink(asyncio.get_running_loop())
        conn.attach(sink)
        conn.data_received(body)
        with pytest.raises(MalformedResponse, match=why):
            await sink.done
        assert not conn.reusable
    finally:
        conn.close()
        peer.close()


@pytest.mark.parametrize(
    ("reads", "pooled"),
    [((b"5\r\nhello\r\n", b"0\r\n\r\n"), True),
     ((b"005;x=1\r\nhello\r\n0\r\n\r\n",), True),
     ((b"0x5\r\nhello\r\n", b"0\r\n\r\n"), False),  # a read of one whole chunk
     ((b"0x5\r\nhello\r\n0\r\n\r\n",), False),  # whole chunks and the end
     ((b"0x5\r\nhel", b"lo\r\n0\r\n\r\n"), False),  # a size line read alone
     ((b"+5\r\nhello\r\n0\r\n\r\n",), False),
     ((b"0_5\r\nhello\r\n0\r\n\r\n",), False),
     ((b" 5\r\nhello\r\n0\r\n\r\n",), False),
     ((b"5\nhello\r\n0\r\n\r\n",), False),
     ((b"5\r\nhello\r\n0\r\nX-T: 1\n\r\n",), False)],
)
async def test_chunk_framing_only_a_lenient_reader_reads_is_not_pooled_again(
        reads: tuple[bytes, ...], pooled: bool) -> None:
    """A chunk size that is not plain hex digits, or a chunk line ending in a bare LF: the
    body is relayed, but the connection is not reused (its server may frame otherwise)."""
    conn, peer, _ = await _conn_pair()
    try:
        fut = conn.send(b"GET / HTTP/1.1\r\n\r\n", False)
        conn.data_received(CHUNKED_HEAD)
        await fut
        sink = BufferSink(asyncio.get_running_loop())
        conn.attach(sink)
        for data in reads:
            conn.data_received(data)
        assert await asyncio.wait_for(sink.done, 1) == b"hello"
        assert conn.reusable is pooled
    finally:
        conn.close()
        peer.close()


async def test_bad_status_line_fails_the_head() -> None:
    conn, peer, _ = await _conn_pair()
    try:
        fut = conn.send(b"GET / HTTP/1.1\r\n\r\n", False)
        conn.data_received(b"SPDY/3 200 OK\r\n\r\n")
        with pytest.raises(MalformedResponse, match="status line"):
            await fut
    finally:
        peer.close()


async def test_request_bytes_keep_headers_and_rewrite_host() -> None:
    pool = UpstreamPool("http://10.0.0.1:8000/prefix/", 1.0)
    fields = upstream_field_lines([(b"X-Key", b"v\xe9"), (b"x-a", b"1")])
    raw = pool.request_bytes("POST", "/v1/x?a=%2F", fields, b"{}", True)
    assert raw == (b"POST /prefix/v1/x?a=%2F HTTP/1.1\r\nHost: 10.0.0.1:8000\r\n"
                   b"X-Key: v\xe9\r\nx-a: 1\r\nContent-Length: 2\r\n\r\n{}")
    assert UpstreamPool("https://api.example.com", 1.0).host_header == "api.example.com"


async def test_proxy_relays_chunked_trailers_and_odd_splits() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        await read_request(r)
        data = CHUNKED_HEAD + CHUNKED_BODY
        for i in range(0, len(data), 9):  # the framing split anywhere across writes
            w.write(data[i:i + 9])
            await w.drain()
            await asyncio.sleep(0.001)

    async with raw_upstream(handler) as (url, _), running_proxy(url) as (_, purl, recs), \
            aiohttp.ClientSession() as s:
        async with s.post(purl + "/x") as r:
            assert r.status == 200 and await r.read() == PAYLOAD
            assert "X-Trailer" not in r.headers
        (rec,) = await recs.wait(1)
    assert rec.outcome == "ok"


async def test_until_close_body_and_interim_responses() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n")
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart 1 ")
        await w.drain()
        await asyncio.sleep(0.01)
        w.write(b"part 2")
        await w.drain()

    async with raw_upstream(handler) as (url, accepted), running_proxy(url) as (_, purl, recs), \
            aiohttp.ClientSession() as s:
        for _ in range(2):
            async with s.post(purl + "/x") as r:
                assert r.status == 200 and await r.read() == b"part 1 part 2"
        recs_ = await recs.wait(2)
    assert [x.outcome for x in recs_] == ["ok", "ok"]
    assert len(accepted) == 2  # a body delimited by close cannot be followed by another


async def test_keep_alive_reuse_and_stale_connection_retry() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        for i in range(100):
            await read_request(r)
            if n == 1 and i == 2:
                return  # the upstream drops its keep-alive connection as the request comes
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()

    async with raw_upstream(handler) as (url, accepted), running_proxy(url) as (_, purl, recs), \
            aiohttp.ClientSession() as s:
        for _ in range(5):
            async with s.post(purl + "/x", data=b"{}") as r:
                assert r.status == 200 and await r.read() == b"ok"
        recs_ = await recs.wait(5)
    assert all(x.outcome == "ok" for x in recs_)
    assert len(accepted) == 2  # one reused connection, then one fresh after the stale one


async def test_idle_connection_closed_by_upstream_is_dropped() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await w.drain()
        await asyncio.sleep(0.05)  # then close the idle keep-alive connection

    async with raw_upstream(handler) as (url, accepted), running_proxy(url) as (_, purl, recs), \
            aiohttp.ClientSession() as s:
        for _ in range(3):
            async with s.post(purl + "/x") as r:
                assert await r.read() == b"ok"
            await asyncio.sleep(0.15)
        recs_ = await recs.wait(3)
    assert all(x.outcome == "ok" for x in recs_) and len(accepted) == 3


@pytest.mark.parametrize(
    ("response", "outcome", "status"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "error", 200),
        (CHUNKED_HEAD + b"5\r\nhello\r\n", "error", 200),
        (b"garbage\r\n\r\n", "error", 502),
        (b"", "error", 502),
    ],
)
async def test_broken_responses(response: bytes, outcome: str, status: int) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        await read_request(r)
        w.write(response)
        await w.drain()

    async with raw_upstream(handler) as (url, _), running_proxy(url) as (_, purl, recs), \
            aiohttp.ClientSession() as s:
        with contextlib.suppress(aiohttp.ClientPayloadError):
            async with s.post(purl + "/x") as r:
                assert r.status == status
                await r.read()
        (rec,) = await recs.wait(1)
    assert rec.outcome == outcome and rec.status == status


async def test_head_and_204_have_no_body() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        while True:
            head = await read_request(r)
            if head.startswith(b"HEAD"):
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")
            else:
                w.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            await w.drain()

    async with raw_upstream(handler) as (url, accepted), running_proxy(url) as (_, purl, _r), \
            aiohttp.ClientSession() as s:
        async with s.head(purl + "/a") as r:
            assert r.status == 200 and r.headers["Content-Length"] == "1234"
        async with s.delete(purl + "/a") as r:
            assert r.status == 204 and await r.read() == b""
        async with s.head(purl + "/a") as r:
            assert r.status == 200
    assert len(accepted) == 1


async def test_retry_is_only_for_reused_connections() -> None:
    pool = UpstreamPool("http://127.0.0.1:9", 1.0)
    conn, peer, _ = await _conn_pair()
    try:
        fut = conn.send(b"GET / HTTP/1.1\r\n\r\n", False)
        peer.close()
        with pytest.raises(UpstreamClosed) as info:
            await asyncio.wait_for(fut, 2)
        assert not info.value.retryable  # a fresh connection: the request may have run
    finally:
        conn.close()
        pool.close()
