"""The response head and the end of the body, as the proxy writes them itself
(llmtop/proxy/response.py): what a raw client reads off the socket, keep-alive after a
relayed stream, HTTP/1.0 clients, and an upstream head that would inject a header."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from test_proxy_support import Script, dechunk, openai_chunks, running_proxy, scripted_upstream


async def _read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One chunked or Content-Length response: (head, body as sent on the wire)."""
    head = await reader.readuntil(b"\r\n\r\n")
    low = head.lower()
    if b"transfer-encoding: chunked" in low:
        body = b""
        while not body.endswith(b"\r\n0\r\n\r\n") and body != b"0\r\n\r\n":
            body += await reader.read(65536)
        return head, body
    length = int(low.split(b"content-length: ")[1].split(b"\r\n")[0])
    return head, await reader.readexactly(length)


def _request(path: str, body: bytes, version: str = "1.1", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body

async def _until_close(url: str, request: bytes) -> bytes:
    """Send ``request`` on a new connection to ``url``; everything the proxy sends back
    until it closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    raw = await asyncio.wait_for(reader.read(-1), 5)
    writer.close()
    return raw


async def test_stream_head_then_body_and_the_connection_is_reused() -> None:
    chunks = openai_chunks(["a", "b"])
    async with scripted_upstream() as up:
        up.script = Script(chunks=chunks, gap_s=0.01,
                           headers={"Content-Type": "text/event-stream", "X-Up": "1",
                                    "Date": "Tue, 01 Dec 2026 10:00:00 GMT"})
        async with running_proxy(up.url) as (_, url, recs):
            host, port = url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                body = b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}'
                heads, bodies = [], []
                for _ in range(2):  # the same connection carries a second request
                    writer.write(_request("/v1/chat/completions", body))
                    head, wire = await _read_response(reader)
                    heads.append(head)
                    bodies.append(wire)
            finally:
                writer.close()
            got = await recs.wait(2)
    for head, wire in zip(heads, bodies, strict=True):
        lines = head.decode().split("\r\n")
        assert lines[0] == "HTTP/1.1 200 OK"
        fields = [tuple(line.split(": ", 1)) for line in lines[1:] if line]
        names = [f[0].lower() for f in fields]
        assert ("X-Up", "1") in fields and ("X-Accel-Buffering", "no") in fields
        assert ("Transfer-Encoding", "chunked") in fields
        assert ("Date", "Tue, 01 Dec 2026 10:00:00 GMT") in fields  # the upstream's own
        assert "content-length" not in names and "connection" not in names
        assert names.count("date") == 1 and names.count("server") == 1
        assert dechunk(wire) == b"".join(chunks)
    assert [r.outcome for r in got] == ["ok", "ok"]
    assert all(r.e2e_s >= r.chunk_offsets_s[-1] for r in got)


async def test_client_connection_close_gets_connection_close() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=[b'{"x": 1}'], content_length=True)
        async with running_proxy(up.url) as (_, url, _recs):
            host, port = url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(_request("/other", b"{}", extra="Connection: close\r\n"))
            head, body = await _read_response(reader)
            assert await asyncio.wait_for(reader.read(), 5) == b""  # then closed
            writer.close()
    assert b"\r\nConnection: close\r\n" in head and b"\r\nContent-Length: 8\r\n" in head
    assert body == b'{"x": 1}'


async def test_http10_keepalive_client_gets_a_stream_ended_by_close() -> None:
    """No chunked encoding for HTTP/1.0: the body of unknown length ends when the
    connection does (aiohttp kept such a connection open, so the client never saw the
    end)."""
    chunks = [b"data: 1\n\n", b"data: 2\n\n"]
    async with scripted_upstream() as up:
        up.script = Script(chunks=chunks, gap_s=0.01,
                           headers={"Content-Type": "text/event-stream"})
        async with running_proxy(up.url) as (_, url, recs):
            raw = await _until_close(
                url, _request("/stream", b"{}", "1.0", "Connection: keep-alive\r\n"))
            (rec,) = await recs.wait(1)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK\r\n")
    assert b"Transfer-Encoding" not in head and b"Connection: keep-alive" not in head
    assert body == b"".join(chunks)
    assert rec.outcome == "ok"


@contextlib.asynccontextmanager
async def raw_upstream(writes: Sequence[bytes]) -> AsyncIterator[str]:
    """An upstream that reads one request head and answers with ``writes`` verbatim."""

    tasks: set[asyncio.Task[object]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            for data in writes:
                writer.write(data)
                await writer.drain()
                await asyncio.sleep(0.01)
            await reader.read()  # until the proxy closes its pooled connection
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            tasks.discard(task)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.sleep(0.05)
        await server.wait_closed()


async def test_bare_lf_in_an_upstream_header_is_a_502_not_an_injected_header() -> None:
    evil = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
            b"X-Note: a\nSet-Cookie: injected=1\r\nContent-Length: 2\r\n\r\nok")
    async with raw_upstream([evil]) as up, running_proxy(up) as (_, url, recs):
        raw = await _until_close(url, _request("/x", b"{}", extra="Connection: close\r\n"))
        (rec,) = await recs.wait(1)
    assert raw.startswith(b"HTTP/1.1 502 ")
    assert b"injected" not in raw
    assert rec.status == 502 and rec.outcome == "error"


async def test_last_bytes_and_the_end_of_the_body_in_one_upstream_write() -> None:
    """The upstream's last chunk and its terminator in one read: both reach the client, the
    connection stays usable, the record is complete."""
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    one, two = b"data: 1\n\n", b"data: [DONE]\n\n"
    writes = [head, b"%x\r\n%b\r\n" % (len(one), one),
              b"%x\r\n%b\r\n0\r\n\r\n" % (len(two), two)]
    async with raw_upstream(writes) as up, running_proxy(up) as (_, url, recs):
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(_request("/x", b"{}"))
        got_head, wire = await asyncio.wait_for(_read_response(reader), 5)
        writer.close()
        (rec,) = await recs.wait(1)
    assert got_head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert dechunk(wire) == one + two
    assert rec.outcome == "ok" and rec.status == 200


async def test_header_bytes_pass_unchanged_and_folding_is_joined() -> None:
    """Header values are not decoded and re-encoded (a byte that is not UTF-8 stays that
    byte); an obsolete folded line is joined with one space (RFC 9112 §5.2)."""
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Raw: caf\xe9 \x80\r\n"
            b"X-Fold: a\r\n  b\r\nContent-Length: 2\r\n\r\nok")
    async with raw_upstream([head]) as up, running_proxy(up) as (_, url, recs):
        raw = await _until_close(url, _request("/x", b"{}", extra="Connection: close\r\n"))
        (rec,) = await recs.wait(1)
    got_head, _, body = raw.partition(b"\r\n\r\n")
    assert b"\r\nX-Raw: caf\xe9 \x80\r\n" in got_head
    assert b"\r\nX-Fold: a b\r\n" in got_head
    assert body == b"ok" and rec.outcome == "ok"


async def test_fields_the_upstream_connection_header_names_are_dropped() -> None:
    head = (b"HTTP/1.1 200 OK\r\nX-Hop: before\r\nContent-Type: text/plain\r\n"
            b"Connection: keep-alive, X-Hop\r\nX-Keep: 1\r\nX-Hop: after\r\n"
            b"Keep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\nok")
    async with raw_upstream([head]) as up, running_proxy(up) as (_, url, _recs):
        raw = await _until_close(url, _request("/x", b"{}", extra="Connection: close\r\n"))
    got_head = raw.partition(b"\r\n\r\n")[0]
    assert b"X-Hop" not in got_head and b"Keep-Alive" not in got_head
    assert b"\r\nX-Keep: 1\r\n" in got_head and b"\r\nContent-Type: text/plain\r\n" in got_head
    assert got_head.count(b"Connection:") == 1  # the proxy's own "close" for this client
