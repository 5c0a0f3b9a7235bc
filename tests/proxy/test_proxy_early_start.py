"""Early start (llmtop/proxy/stamping.py, quickhead.py): a request that arrives whole in
one read, on a connection with nothing else open, goes upstream from the protocol's
``data_received`` — and everything the client and the upstream see is what the ordinary
path gives: the same upstream bytes, the same records, the same order on a connection."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator

import pytest
from test_proxy_support import (
    Records,
    Script,
    ScriptedUpstream,
    openai_chunks,
    running_proxy,
    scripted_upstream,
)

from llmtop.proxy.quickhead import QuickRequest, read_request
from llmtop.proxy.server import ProxyServer
from llmtop.proxy.stamping import EarlyStart, StampingRequestHandler, StampingServer

BODY = b'{"model":"m1","user":"u1","stream":true,"messages":[{"role":"user","content":"hi"}]}'


def _request(body: bytes = BODY, extra: bytes = b"") -> bytes:
    return (b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: h\r\n"
            b"Content-Type: application/json\r\nAuthorization: Bearer sk-test\r\n" + extra
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


# -- the quick reading --------------------------------------------------------------------


def test_a_plain_request_is_read_whole() -> None:
    q = read_request(_request())
    assert q is not None
    assert (q.method, q.target, q.path, q.version) == (
        "POST", "/v1/chat/completions?x=1", "/v1/chat/completions", (1, 1))
    assert q.raw_headers[0] == (b"Host", b"h") and q.has_length and q.body == BODY
    assert q.headers()["authorization"] == "Bearer sk-test"
    get = read_request(b"GET /v1/models HTTP/1.0\r\nHost: h\r\n\r\n")
    assert get is not None and get.body == b"" and not get.has_length and get.version == (1, 0)


@pytest.mark.parametrize("raw", [
    _request()[:-1],  # body still to come
    _request() + b"G",  # something behind it
    _request() + _request(),  # pipelined
    _request().replace(b"\r\nHost", b"\nHost"),  # bare LF
    _request().replace(b"Host: h\r\n", b"Host: h\r\n folded\r\n"),  # obs-fold
    _request(extra=b"Transfer-Encoding: chunked\r\n"),
    _request(extra=b"Expect: 100-continue\r\n"),
    _request(extra=b"Upgrade: websocket\r\n"),
    _request(extra=b"Content-Length: 5\r\n"),  # two lengths
    _request().replace(b"Content-Length: ", b"Content-Length: +"),
    _request().replace(b"/v1/chat", b"/v1/%63hat"),  # escapes: the path would differ
    _request().replace(b"/v1/chat", b"/v1/../chat"),  # dot segments
    _request().replace(b"POST /v1", b"POST //v1"),
    _request().replace(b"POST /v1", b"POST http://h/v1"),  # absolute form
    _request().replace(b"HTTP/1.1", b"HTTP/2.0"),
    _request().replace(b"POST ", b"PO(ST "),
    _request().replace(b"Host: h", b"Ho st: h"),
    _request().replace(b"Host: h", b"Host: h\x01"),
    _request().replace(b"Host: h", b"Host h"),
    _request().replace(b"Host: h", b": h"),  # no name
    _request().replace(b"Host: h", b"Host: h\rX"),  # a bare CR inside a value
    _request().replace(b"Host: h", b"Host: h\x7f"),
    _request().replace(b"POST /v1", b"POST\t/v1"),
    _request().replace(b"HTTP/1.1", b"http/1.1"),
    b"POST / HTTP/1.1\r\nHost: h\r\n",  # head not ended
])
def test_anything_unusual_is_left_to_the_ordinary_path(raw: bytes) -> None:
    assert read_request(raw) is None


# -- through the proxy ----------------------------------------------------------------------


async def _read_response(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    body = b""
    while not body.endswith(b"0\r\n\r\n"):
        body += await reader.read(65536)
    return body


async def test_early_and_ordinary_paths_send_the_same_bytes_and_records() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=openai_chunks(["a", "b"]),
                           headers={"Content-Type": "text/event-stream"})
        async with running_proxy(up.url) as (proxy, url, recs):
            host, port = url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                # 1: no upstream connection is idle yet (ordinary); 2: whole in one write,
                # an idle connection waiting (early); 3: head and body in two reads
                writer.write(_request())
                first = await _read_response(reader)
                writer.write(_request())
                second = await _read_response(reader)
                assert proxy.early_starts == 1
                raw = _request()
                split = raw.index(b"\r\n\r\n") + 4
                writer.write(raw[:split])
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.write(raw[split:])
                third = await _read_response(reader)
            finally:
                writer.close()
            got = await recs.wait(3)
    assert proxy.early_starts == 1 and proxy.early_undone == 0
    assert first == second == third
    seen = up.seen
    assert len(seen) == 3
    assert (seen[1].method, seen[1].path_qs, seen[1].headers, seen[1].body) == (
        seen[2].method, seen[2].path_qs, seen[2].headers, seen[2].body)
    assert b'"include_usage":true' in seen[1].body  # usage injected on the early path too
    assert [r.outcome for r in got] == ["ok"] * 3
    for r in got:
        assert (r.user, r.model, r.path, r.stream, r.status) == (
            "u1", "m1", "/v1/chat/completions", True, 200)
        assert r.completion_tokens == 2 and r.ttft_s is not None and r.ttft_s > 0
    assert not proxy.active


async def test_a_request_sent_before_the_last_response_ended_keeps_its_order() -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=openai_chunks(["a", "b", "c"]), gap_s=0.05,
                           headers={"Content-Type": "text/event-stream"})
        async with running_proxy(up.url) as (proxy, url, recs):
            host, port = url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write(_request())  # warms an upstream connection
                await _read_response(reader)
                writer.write(_request())
                await writer.drain()
                await asyncio.sleep(0.03)  # the second response is streaming now
                writer.write(_request())  # pipelined behind it: must wait its turn
                await _read_response(reader)
                await _read_response(reader)
            finally:
                writer.close()
            got = await recs.wait(3)
            ends = [r.t_start + r.e2e_s for r in got]
    assert [r.outcome for r in got] == ["ok"] * 3
    assert proxy.early_starts == 1  # the second only: the third had a request ahead of it
    # the third reached the upstream only after the second's response had ended
    assert up.seen[2].t_recv - up.seen[1].t_recv >= 0.1
    assert ends[1] <= got[2].t_start + got[2].e2e_s


@contextlib.asynccontextmanager
async def _proxy_with_an_idle_upstream_connection(
) -> AsyncIterator[tuple[ScriptedUpstream, ProxyServer, str, Records]]:
    """A proxy whose upstream waits 5 s before answering a stream, after one request on a
    connection of its own has left an upstream connection idle (so the next can start
    early)."""
    async with scripted_upstream() as up:
        up.script = Script(chunks=openai_chunks(["a"]), first_delay_s=5.0,
                           headers={"Content-Type": "text/event-stream"})
        up.by_path["/warm"] = Script(chunks=[b"{}"])
        async with running_proxy(up.url) as (proxy, url, recs):
            host, port = url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /warm HTTP/1.1\r\nHost: h\r\n\r\n")
            await reader.readuntil(b"{}")
            writer.close()
            await recs.wait(1)
            yield up, proxy, url, recs


async def test_a_client_that_resets_at_once_is_recorded_once_and_cancelled() -> None:
    async with _proxy_with_an_idle_upstream_connection() as (up, proxy, url, recs):
        host, port = url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        await asyncio.sleep(0.05)  # the proxy has accepted it
        # request and reset wait together for the proxy's next poll (no await between)
        sock.sendall(_request())
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        got = await recs.wait(2)
        await up.wait_disconnect()
        await asyncio.sleep(0.05)
        assert len(recs.items) == 2
    r = got[1]
    assert proxy.early_starts == 1
    assert (r.outcome, r.status, r.user, r.model) == ("cancelled", 499, "u1", "m1")
    assert not proxy.active


async def test_a_connection_lost_before_the_handler_claims_its_request_abandons_it() -> None:
    """The connection drops in the very callback that started the request early (its
    handler is then never run): the protocol abandons the early start — the upstream sees
    the disconnect, the record says cancelled, nothing stays open."""
    async with _proxy_with_an_idle_upstream_connection() as (up, proxy, url, recs):
        server = proxy._runner.server if proxy._runner is not None else None
        assert isinstance(server, StampingServer) and server.early_start is not None
        start = server.early_start

        def start_then_drop(quick: QuickRequest, protocol: StampingRequestHandler,
                            t0_ns: int) -> EarlyStart | None:
            early = start(quick, protocol, t0_ns)
            assert protocol.transport is not None
            protocol.transport.abort()  # connection_lost runs before the handler can
            return early

        server.early_start = start_then_drop
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(_request())
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, no response
        writer.close()
        got = await recs.wait(2)
        await up.wait_disconnect()
        await asyncio.sleep(0.05)
        assert len(recs.items) == 2
    r = got[1]
    assert proxy.early_starts == 1 and proxy.early_undone == 0
    assert (r.outcome, r.status, r.user, r.model) == ("cancelled", 499, "u1", "m1")
    assert r.error == "client disconnected" and r.ttft_s is None
    assert not proxy.active
