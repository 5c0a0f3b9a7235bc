"""The usage stripper's held bytes reach the client however the stream ends.

For a streaming request that did not ask for usage the proxy asks the upstream for it and
removes the usage-only event (openai_usage.UsageChunkStripper); to do so it holds back the
start of an event until its end shows what it is. When the upstream's stream ends in the
middle of such an event — its connection closed or reset, or the body ending without the
event's blank line — the client must still get every byte the upstream sent, in order,
and then the end it gets today (a truncated response, or the end of the body).

Real sockets throughout: a raw TCP upstream writing exact bytes, the proxy, a raw client.
Each case runs cold (aiohttp's path) and warm (served directly from a pooled connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator

import pytest
from test_proxy_support import Records, running_proxy

from llmtop.events import RequestRecord

CHAT = "/v1/chat/completions"
BODY = json.dumps({"model": "m1", "stream": True,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
BASE = b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m1",'
CONTENT = b"data: " + BASE + (b'"choices":[{"index":0,"delta":{"content":"one"},'
                              b'"finish_reason":null}]}\n\n')
FINISH = b"data: " + BASE + (b'"choices":[{"index":0,"delta":{},'
                             b'"finish_reason":"stop"}]}\n\n')
USAGE_EVENT = b"data: " + BASE + (b'"choices":[],"usage":{"prompt_tokens":4,'
                                  b'"completion_tokens":2,"total_tokens":6}}\n\n')
PARTIAL = b"data: " + BASE + b'"cho'
"""The start of an event whose bytes do not yet show what it is: the stripper holds it."""

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
CHUNKED_HEAD = SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
PRIME = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


Plan = list[bytes | str]
"""What the upstream does for the stream request: bytes are written (each a read of its
own), then ``"close"`` (FIN), ``"reset"`` (RST), ``"hang"`` (stays open) or ``"end"``
(nothing more; for a body the upstream has ended itself)."""


@contextlib.asynccontextmanager
async def raw_upstream(plan: Plan) -> AsyncIterator[tuple[str, list[bytes], asyncio.Event]]:
    """An upstream answering ``GET /prime`` with a small keep-alive 200 and the stream
    request (POST) by ``plan``; yields its URL, the POST bodies it got and an event set when
    the proxy closed a stream connection."""
    bodies: list[bytes] = []
    gone = asyncio.Event()

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await r.readexactly(length)
                if head.startswith(b"GET"):
                    w.write(PRIME)
                    await w.drain()
                    continue
                bodies.append(body)
                for step in plan:
                    if isinstance(step, bytes):
                        w.write(step)
                        await w.drain()
                        await asyncio.sleep(0.05)  # a read of its own at the proxy
                    elif step == "reset":
                        sock = w.get_extra_info("socket")
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                        struct.pack("ii", 1, 0))
                        w.transport.abort()
                        return
                    elif step == "close":
                        w.close()
                        return
                    elif step == "hang":
                        await r.read()  # until the proxy lets go
                        gone.set()
                        return
                    # "end": the response ended as its framing says; next request
        except (ConnectionError, asyncio.IncompleteReadError):
            gone.set()
        finally:
            w.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", bodies, gone
    finally:
        server.close()
        await server.wait_closed()


def _request(path: str, body: bytes, version: str = "1.1") -> bytes:
    return (f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def _open(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def _prime(url: str) -> None:
    """Leave one idle pooled upstream connection, so the next whole request goes direct."""
    r, w = await _open(url)
    try:
        w.write(b"GET /prime HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(5):
            head = await r.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            await r.readexactly(2)
    finally:
        w.close()


async def _read_all(r: asyncio.StreamReader, within_s: float = 5.0) -> bytes:
    """Everything the proxy sent until it closed the connection or ended a chunked body
    (the connection is kept alive then)."""
    got = b""
    async with asyncio.timeout(within_s):
        while not got.endswith(b"\r\n0\r\n\r\n"):
            data = await r.read(65536)
            if not data:
                break
            got += data
    return got


async def _stream_record(recs: Records) -> RequestRecord:
    """The record of the stream request (the priming GET is not one of them)."""
    for _ in range(50):
        found = [rec for rec in await recs.wait(1) if rec.path == CHAT]
        if found:
            return found[0]
        await asyncio.sleep(0.05)
    raise AssertionError("no record of the stream request")


def _payload(wire: bytes) -> tuple[bytes, bytes, bool]:
    """The response head, the body's payload (dechunked when chunked, as far as it came)
    and whether the body ended properly (a chunked terminator; for a body delimited by
    the close there is no telling, and the result says False)."""
    head, _, rest = wire.partition(b"\r\n\r\n")
    if b"\r\ntransfer-encoding: chunked" not in head.lower():
        return head, rest, False
    out, pos = b"", 0
    while True:
        nl = rest.find(b"\r\n", pos)
        if nl < 0:
            return head, out, False
        size = int(rest[pos:nl], 16)
        if size == 0:
            return head, out, rest[nl:] == b"\r\n\r\n"
        data = rest[nl + 2:nl + 2 + size]
        out += data
        if len(data) < size or rest[nl + 2 + size:nl + 4 + size] != b"\r\n":
            return head, out, False
        pos = nl + 4 + size


async def _stream(plan: Plan, warm: bool, version: str = "1.1", **overrides: object
                  ) -> tuple[bytes, bytes, bool, list[bytes], str | None, str | None]:
    """Run one stream request through the proxy; returns the client's head, payload,
    whether its body ended properly, what the upstream got, and the record's outcome and
    error."""
    async with raw_upstream(plan) as (url, bodies, _gone), \
            running_proxy(url, **overrides) as (proxy, purl, recs):
        if warm:
            await _prime(purl)
        starts = proxy.direct_starts
        r, w = await _open(purl)
        try:
            w.write(_request(CHAT, BODY, version))
            wire = await _read_all(r)
        finally:
            w.close()
        rec = await _stream_record(recs)
        assert (proxy.direct_starts > starts) == warm  # the path the case names was taken
    head, payload, ended = _payload(wire)
    return head, payload, ended, bodies, rec.outcome, rec.error


def _injected(bodies: list[bytes]) -> None:
    assert len(bodies) == 1
    assert json.loads(bodies[0])["stream_options"] == {"include_usage": True}


WARMTH = pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])


@WARMTH
@pytest.mark.parametrize("how", ["close", "reset"])
async def test_upstream_broken_mid_event_sends_the_held_bytes_first(
        warm: bool, how: str) -> None:
    """Chunked upstream: a whole event, then the start of one, then the connection closed
    or reset. The client gets both (before: the held start never went out), then a
    truncated body as before (no chunked terminator), and the record says the stream
    broke."""
    plan: Plan = [CHUNKED_HEAD + chunk(CONTENT), chunk(PARTIAL), how]
    head, payload, ended, bodies, outcome, error = await _stream(plan, warm)
    _injected(bodies)
    assert head.startswith(b"HTTP/1.1 200")
    assert payload == CONTENT + PARTIAL
    assert not ended
    assert outcome == "error" and error is not None and "upstream" in error


@WARMTH
async def test_an_http10_client_gets_the_held_bytes_before_the_close(warm: bool) -> None:
    """An HTTP/1.0 client's body ends with the connection (no chunks): the held start of
    the event goes out as it is before the proxy closes."""
    plan: Plan = [CHUNKED_HEAD + chunk(CONTENT), chunk(PARTIAL), "close"]
    head, payload, _ended, bodies, outcome, _error = await _stream(plan, warm, "1.0")
    _injected(bodies)
    assert head.startswith(b"HTTP/1.0 200") and b"transfer-encoding" not in head.lower()
    assert payload == CONTENT + PARTIAL
    assert outcome == "error"


@WARMTH
async def test_upstream_broken_mid_chunk_sends_every_byte_it_sent(warm: bool) -> None:
    """The connection closes inside an upstream chunk that holds the start of an event:
    the bytes of that chunk which came are the client's too."""
    plan: Plan = [CHUNKED_HEAD + chunk(CONTENT),
                  b"%x\r\n" % (len(PARTIAL) + 40) + PARTIAL, "close"]
    _head, payload, ended, bodies, outcome, _error = await _stream(plan, warm)
    _injected(bodies)
    assert payload == CONTENT + PARTIAL and not ended
    assert outcome == "error"


@WARMTH
async def test_content_length_body_cut_short_mid_event(warm: bool) -> None:
    """An upstream that announced a Content-Length and closed before it: the client
    (chunked, the stripper may shorten the body) gets every byte that came."""
    full = CONTENT + FINISH + USAGE_EVENT + b"data: [DONE]\n\n"
    plan: Plan = [SSE_HEAD + b"Content-Length: %d\r\n\r\n" % len(full) + CONTENT,
                  PARTIAL, "close"]
    _head, payload, ended, bodies, outcome, _error = await _stream(plan, warm)
    _injected(bodies)
    assert payload == CONTENT + PARTIAL and not ended
    assert outcome == "error"


@WARMTH
async def test_idle_upstream_cut_mid_event_sends_the_held_bytes(warm: bool) -> None:
    """The upstream sends the start of an event and goes silent: cut at idle_s, the
    client's truncated response still holds every byte the upstream sent."""
    plan: Plan = [CHUNKED_HEAD + chunk(CONTENT), chunk(PARTIAL), "hang"]
    _head, payload, ended, bodies, outcome, error = await _stream(
        plan, warm, timeouts__idle_s=1)
    _injected(bodies)
    assert payload == CONTENT + PARTIAL and not ended
    assert outcome == "timeout" and error is not None and "idle" in error


@WARMTH
@pytest.mark.parametrize("framing", ["chunked", "close-delimited"])
async def test_clean_end_with_a_partial_final_event(warm: bool, framing: str) -> None:
    """The body ends cleanly (chunked terminator, or the close of a body with no length)
    with a last event that has no blank line after it: it goes out whole, and a usage
    event before it is still removed."""
    last = b"data: [DONE]"
    body_parts = [CONTENT, FINISH + USAGE_EVENT, last]
    if framing == "chunked":
        plan: Plan = [CHUNKED_HEAD + chunk(body_parts[0]), chunk(body_parts[1]),
                      chunk(last), b"0\r\n\r\n", "end"]
    else:
        plan = [SSE_HEAD + b"Connection: close\r\n\r\n" + body_parts[0], body_parts[1],
                last, "close"]
    _head, payload, ended, bodies, outcome, _error = await _stream(plan, warm)
    _injected(bodies)
    assert payload == CONTENT + FINISH + last
    assert ended  # the client's body ends properly either way
    assert outcome == "ok"


@WARMTH
async def test_client_leaving_mid_event_is_cancelled_and_the_upstream_let_go(
        warm: bool) -> None:
    """The client leaves while an event's start is held: the request is recorded
    cancelled, the upstream connection is closed, and nothing is written after."""
    plan: Plan = [CHUNKED_HEAD + chunk(CONTENT), chunk(PARTIAL), "hang"]
    async with raw_upstream(plan) as (url, bodies, gone), \
            running_proxy(url) as (proxy, purl, recs):
        if warm:
            await _prime(purl)
        starts = proxy.direct_starts
        r, w = await _open(purl)
        w.write(_request(CHAT, BODY))
        got = b""
        async with asyncio.timeout(5):
            while CONTENT not in got:
                got += await r.read(65536)
        await asyncio.sleep(0.2)  # the partial event reached the proxy and is held
        w.close()
        rec = await _stream_record(recs)
        async with asyncio.timeout(5):
            await gone.wait()
        assert (proxy.direct_starts > starts) == warm
    _injected(bodies)
    assert rec.outcome == "cancelled", (rec.outcome, rec.error)
    assert _payload(got)[1] == CONTENT  # (nothing of the held start: the client left)


@WARMTH
async def test_llamacpp_finish_event_held_for_its_timings_goes_out_when_broken(
        warm: bool) -> None:
    """For llama.cpp (``Server: llama.cpp``) a whole finish event is held until the next
    event shows whether it must get its timings back: when the connection breaks instead,
    the finish event still reaches the client, as llama.cpp sent it."""
    head = SSE_HEAD + b"Server: llama.cpp\r\nTransfer-Encoding: chunked\r\n\r\n"
    plan: Plan = [head + chunk(CONTENT), chunk(FINISH), "close"]
    _head, payload, ended, bodies, outcome, _error = await _stream(plan, warm)
    _injected(bodies)
    assert payload == CONTENT + FINISH and not ended
    assert outcome == "error"
