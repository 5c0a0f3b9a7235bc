"""A chunked upstream's chunks go to a chunked client as the upstream framed them, when
the read held whole chunks only and nothing was removed from them (the relay writes the
read as it is instead of framing a copy anew); a size written as ``0x..`` — which
Python's ``int(…, 16)`` reads but HTTP does not allow — is framed anew, plainly."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from test_proxy_support import dechunk, openai_chunks, running_proxy

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")


@contextlib.asynccontextmanager
async def upstream(frames: list[bytes]) -> AsyncIterator[str]:
    """Answers one request with HEAD, then each of ``frames`` in a write of its own (a
    pause between them, so each is one read at the proxy; a frame may hold several
    chunks), then the last chunk."""

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = await r.readuntil(b"\r\n\r\n")
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                await r.readexactly(int(line.split(b":")[1]))
        w.write(HEAD)
        for f in frames:
            await w.drain()
            await asyncio.sleep(0.03)
            w.write(f)
        await asyncio.sleep(0.03)
        w.write(b"0\r\n\r\n")
        await w.drain()
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await r.read()  # until the proxy closes the connection
        w.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def _wire(url: str) -> bytes:
    """The response body as it came off the socket (chunk framing included)."""
    host, port = url.removeprefix("http://").split(":")
    r, w = await asyncio.open_connection(host, int(port))
    # the client asks for usage itself: nothing is injected, nothing removed
    body = b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}'
    w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b"application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
    await r.readuntil(b"\r\n\r\n")
    wire = b""
    async with asyncio.timeout(5):
        while not wire.endswith(b"\r\n0\r\n\r\n"):
            wire += await r.read(65536)
    w.close()
    return wire


async def test_chunks_keep_the_upstream_framing_and_a_0x_size_is_framed_anew() -> None:
    events = openai_chunks(["Hello", " world", "!"])
    frames = [
        b"%05X\r\n%b\r\n" % (len(events[0]), events[0]),  # leading zeros, upper case
        b"0x%x\r\n%b\r\n" % (len(events[1]), events[1]),  # int() reads it; HTTP does not
    ] + [b"%x\r\n%b\r\n" % (len(e), e) for e in events[2:]]
    async with upstream(frames) as up, running_proxy(up) as (_, url, recs):
        wire = await _wire(url)
        (rec,) = await recs.wait(1)
    assert wire.startswith(frames[0])  # as the upstream framed it, byte for byte
    anew = b"%x\r\n%b\r\n" % (len(events[1]), events[1])
    assert wire[len(frames[0]):].startswith(anew)
    assert b"0x" not in wire
    assert wire == frames[0] + anew + b"".join(frames[2:]) + b"0\r\n\r\n"
    assert rec.outcome == "ok" and rec.completion_tokens is not None



async def test_a_read_of_several_whole_chunks_goes_out_as_the_upstream_framed_them() -> None:
    events = openai_chunks(["a", "b", "c", "d", "e", "f"])
    one = [b"%X\r\n%b\r\n" % (len(e), e) for e in events]
    frames = [b"".join(one[:3]), b"".join(one[3:])]  # three chunks in each write
    async with upstream(frames) as up, running_proxy(up) as (_, url, recs):
        wire = await _wire(url)
        (rec,) = await recs.wait(1)
    assert wire == b"".join(frames) + b"0\r\n\r\n"  # upper-case sizes: not framed anew
    assert rec.outcome == "ok"
    assert len(rec.chunk_offsets_s) == 2  # two reads with content: two chunk times


async def test_several_chunks_one_with_a_0x_size_are_framed_anew_as_one() -> None:
    events = openai_chunks(["a", "b", "c"])
    frames = [b"%x\r\n%b\r\n" % (len(events[0]), events[0])
              + b"0x%x\r\n%b\r\n" % (len(events[1]), events[1])
              + b"%x\r\n%b\r\n" % (len(events[2]), events[2])]
    async with upstream(frames) as up, running_proxy(up) as (_, url, recs):
        wire = await _wire(url)
        await recs.wait(1)
    assert b"0x" not in wire
    payload = b"".join(events[:3])
    assert wire == b"%x\r\n%b\r\n0\r\n\r\n" % (len(payload), payload)
    assert dechunk(wire) == payload
