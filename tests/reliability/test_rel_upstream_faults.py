"""Fault matrix, upstream side: each hostile upstream behaviour through a real proxy.

Every case asserts three things: what the client saw, that the proxy still serves a
normal stream afterwards (``Proxy.assert_healthy``), and the request record's
outcome/status/error. The hostile upstream is raw asyncio (rel_support.HostileUpstream),
chosen per request by the ``X-Fault`` header, which the proxy forwards.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import socket
import time
import zlib

import aiohttp
import pytest
from rel_support import (
    CHAT,
    FAULT,
    Conn,
    UpReq,
    chat_chunk,
    free_port,
    hostile_upstream,
    running_proxy,
)

SSE = ("Content-Type", "text/event-stream")
STREAM_REQ = {"model": "m", "stream": True}


def fault(name: str) -> dict[str, str]:
    return {FAULT: name}


# -- behaviours ---------------------------------------------------------------------------


async def never_answers(conn: Conn, req: UpReq) -> bool:
    await conn.hold()
    return False


async def two_chunks_then_silence(conn: Conn, req: UpReq) -> bool:
    await conn.head(200, [SSE])
    await conn.chunk(chat_chunk("a"))
    await conn.chunk(chat_chunk("b"))
    await conn.hold()
    return False


async def reset_mid_stream(conn: Conn, req: UpReq) -> bool:
    await conn.head(200, [SSE])
    await conn.chunk(chat_chunk("a"))
    await conn.chunk(chat_chunk("b"))
    await asyncio.sleep(0.05)
    conn.reset()
    return False


MALFORMED_SSE = (chat_chunk("a"), b'data: {"choices":[{"delta":{"content":"x"\n\n',
                 b"data: not json at all\n\n", chat_chunk("b"), b"data: [DONE]\n\n")


async def malformed_sse(conn: Conn, req: UpReq) -> bool:
    await conn.head(200, [SSE])
    for c in MALFORMED_SSE:
        await conn.chunk(c)
    await conn.end()
    return True


MALFORMED_NDJSON = (b'{"model":"m","message":{"role":"assistant","content":"a"},"done":false}\n',
                    b'{"model":"m","message":{"content":\n', b"\x00\x01garbage\n",
                    b'{"model":"m","message":{"role":"assistant","content":""},"done":true,'
                    b'"eval_count":2,"prompt_eval_count":3}\n')


async def malformed_ndjson(conn: Conn, req: UpReq) -> bool:
    await conn.head(200, [("Content-Type", "application/x-ndjson")])
    for c in MALFORMED_NDJSON:
        await conn.chunk(c)
    await conn.end()
    return True


INVALID_UTF8 = (b'data: {"choices":[{"delta":{"content":"\xff\xfe\xc3("}}],"model":"m"}\n\n',
                b"data: \xed\xa0\x80\x80\n\n", chat_chunk("ok"), b"data: [DONE]\n\n")


async def invalid_utf8(conn: Conn, req: UpReq) -> bool:
    await conn.head(200, [SSE])
    for c in INVALID_UTF8:
        await conn.chunk(c)
    await conn.end()
    return True


BIG_LINE = b"data: " + b"A" * (10 * 1024 * 1024) + b"\n\n"


async def ten_mb_line(conn: Conn, req: UpReq) -> bool:
    await conn.head(200, [SSE])
    await conn.chunk(chat_chunk("a"))
    for i in range(0, len(BIG_LINE), 256 * 1024):
        await conn.chunk(BIG_LINE[i:i + 256 * 1024])
    await conn.chunk(chat_chunk("b"))
    await conn.chunk(b"data: [DONE]\n\n")
    await conn.end()
    return True


async def endless_no_newline(conn: Conn, req: UpReq) -> bool:
    await conn.head(200, [SSE])
    block = b"x" * 65536
    try:
        while True:
            await conn.chunk(block)
    except ConnectionError:
        conn.up.note_closed()
    return False


async def short_content_length(conn: Conn, req: UpReq) -> bool:
    await conn.head(200, [("Content-Type", "application/json"), ("Content-Length", "1000")],
                    chunked=False)
    await conn.send(b'{"choices": [' + b" " * 90)
    await asyncio.sleep(0.05)
    return False  # close: 100 of the promised 1,000 bytes


async def long_content_length(conn: Conn, req: UpReq) -> bool:
    # 11 bytes after promising 5, in the same segment as the headers
    await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 5\r\n\r\n" b'{"ok":true}')
    await asyncio.sleep(0.05)
    return False


GZ_EVENTS = [chat_chunk(f"tok{i}") for i in range(20)] + [b"data: [DONE]\n\n"]


def gzip_pieces() -> list[bytes]:
    """A gzip stream sync-flushed after every event (how a compressing server streams)."""
    comp = zlib.compressobj(6, zlib.DEFLATED, 31)
    out = [comp.compress(ev) + comp.flush(zlib.Z_SYNC_FLUSH) for ev in GZ_EVENTS]
    out.append(comp.flush())
    return out


async def gzip_stream(conn: Conn, req: UpReq) -> bool:
    await conn.head(200, [SSE, ("Content-Encoding", "gzip")])
    for piece in gzip_pieces():
        await conn.chunk(piece)
        await asyncio.sleep(0.005)
    await conn.end()
    return True


def error_behaviour(status: int, body: bytes | None) -> object:
    async def answer(conn: Conn, req: UpReq) -> bool:
        headers = [("Content-Length", str(len(body or b"")))]
        if body:
            headers.append(("Content-Type", "application/json"))
        if status in (429, 503):
            headers.append(("Retry-After", "2"))
        await conn.head(status, headers, chunked=False)
        if body:
            await conn.send(body)
        return True
    return answer


BEHAVIOURS = {
    "never": never_answers, "idle": two_chunks_then_silence, "reset": reset_mid_stream,
    "malformed-sse": malformed_sse, "malformed-ndjson": malformed_ndjson,
    "utf8": invalid_utf8, "10mb": ten_mb_line, "endless": endless_no_newline,
    "short-cl": short_content_length, "long-cl": long_content_length, "gzip": gzip_stream,
}


# -- the cases ----------------------------------------------------------------------------


async def test_upstream_refusing_connections_gives_502_then_recovers() -> None:
    port = free_port()
    async with running_proxy(f"http://127.0.0.1:{port}") as px, aiohttp.ClientSession() as s:
        async with s.post(px.url + CHAT, json=STREAM_REQ) as r:
            assert r.status == 502
            err = await r.json()
        assert err["error"]["code"] == "upstream_unreachable"
        (rec,) = await px.records.wait(1)
        assert rec.outcome == "error" and rec.status == 502 and "unreachable" in (rec.error or "")
        assert px.server.upstream_down
        async with hostile_upstream(port=port):
            await px.assert_healthy()
        assert not px.server.upstream_down


async def test_upstream_connect_timeout_gives_504() -> None:
    # A listener whose accept queue is full and never drained: SYNs are dropped and the
    # connect hangs exactly as towards an unroutable host.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(0)
    port = lsock.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            try:
                c.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fillers.append(c)
        async with running_proxy(f"http://127.0.0.1:{port}", timeouts__connect_s=0.3) as px, \
                aiohttp.ClientSession() as s:
            t = time.perf_counter()
            async with s.post(px.url + CHAT, json=STREAM_REQ) as r:
                assert r.status == 504
                err = await r.json()
            took = time.perf_counter() - t
            (rec,) = await px.records.wait(1)
            assert not px.server.active
    finally:
        for c in fillers:
            c.close()
        lsock.close()
    assert 0.25 < took < 3.0
    assert "connect" in err["error"]["message"]
    assert rec.outcome == "timeout" and rec.status == 504


async def test_upstream_never_answering_hits_first_byte_timeout_and_is_closed() -> None:
    async with hostile_upstream(BEHAVIOURS) as up, \
            running_proxy(up.url, timeouts__first_byte_s=0.4) as px, \
            aiohttp.ClientSession() as s:
        t = time.perf_counter()
        async with s.post(px.url + CHAT, json=STREAM_REQ, headers=fault("never")) as r:
            assert r.status == 504
            err = await r.json()
        took = time.perf_counter() - t
        closed = await up.wait_closed()
        (rec,) = await px.records.wait(1)
        assert 0.35 < took < 3.0
        assert closed - t < 3.0  # the upstream connection was dropped, not left to linger
        assert "first byte" in err["error"]["message"]
        assert rec.outcome == "timeout" and rec.status == 504
        assert "first byte" in (rec.error or "")
        await px.assert_healthy()


async def test_upstream_going_silent_mid_stream_hits_idle_timeout() -> None:
    async with hostile_upstream(BEHAVIOURS) as up, \
            running_proxy(up.url, timeouts__idle_s=0.4) as px, \
            aiohttp.ClientSession() as s:
        got = b""
        async with s.post(px.url + CHAT, json=STREAM_REQ, headers=fault("idle")) as r:
            assert r.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                async for data in r.content.iter_any():
                    got += data
        assert got == chat_chunk("a") + chat_chunk("b")  # what came, then a cut-off body
        await up.wait_closed()
        (rec,) = await px.records.wait(1)
        assert rec.outcome == "timeout" and rec.status == 200 and "idle" in (rec.error or "")
        assert sum(rec.chunk_tokens) == 2 and rec.ttft_s is not None
        await px.assert_healthy()


async def test_upstream_reset_mid_stream_truncates_the_client_stream() -> None:
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession() as s:
        got = b""
        async with s.post(px.url + CHAT, json=STREAM_REQ, headers=fault("reset")) as r:
            assert r.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                async for data in r.content.iter_any():
                    got += data
        assert got == chat_chunk("a") + chat_chunk("b")
        (rec,) = await px.records.wait(1)
        assert rec.outcome == "error" and rec.status == 200
        assert "broke" in (rec.error or ""), rec.error
        await px.assert_healthy()


@pytest.mark.parametrize(
    ("name", "path", "expected"),
    [("malformed-sse", CHAT, MALFORMED_SSE), ("malformed-ndjson", "/api/chat",
                                              MALFORMED_NDJSON),
     ("utf8", CHAT, INVALID_UTF8)],
)
async def test_malformed_streams_pass_byte_exact_and_are_recorded_as_errors(
        name: str, path: str, expected: tuple[bytes, ...]) -> None:
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession(auto_decompress=False) as s:
        async with s.post(px.url + path, json=STREAM_REQ, headers=fault(name)) as r:
            assert r.status == 200
            body = await r.read()
        assert body == b"".join(expected)
        (rec,) = await px.records.wait(1)
        assert rec.status == 200 and rec.outcome == "error"
        assert "malformed" in (rec.error or ""), rec.error
        assert rec.ttft_s is not None  # the good chunks around the bad ones were still timed
        await px.assert_healthy()


async def test_ten_megabyte_line_passes_through_whole() -> None:
    expected = hashlib.sha256(chat_chunk("a") + BIG_LINE + chat_chunk("b")
                              + b"data: [DONE]\n\n").hexdigest()
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession() as s:
        h = hashlib.sha256()
        async with s.post(px.url + CHAT, json=STREAM_REQ, headers=fault("10mb")) as r:
            assert r.status == 200
            async for data in r.content.iter_any():
                h.update(data)
        assert h.hexdigest() == expected
        (rec,) = await px.records.wait(1)
        # the 10 MB event is not JSON: recorded as malformed, the real chunks still counted
        assert rec.status == 200 and rec.outcome == "error" and len(rec.chunk_offsets_s) == 2
        await px.assert_healthy()


async def test_endless_line_without_newline_is_relayed_until_the_client_leaves() -> None:
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession() as s:
        r = await s.post(px.url + CHAT, json=STREAM_REQ, headers=fault("endless"))
        assert r.status == 200
        n = 0
        while n < 32 * 1024 * 1024:  # 32 MB without a newline: more than the 16 MB bound
            data = await r.content.readany()
            assert data
            n += len(data)
        r.close()
        await up.wait_closed(5.0)
        (rec,) = await px.records.wait(1)
        # the stream had failed (a line past the parser's bound) before the client left:
        # that failure explains the request, not the client's leaving (401532f)
        assert rec.outcome == "error" and rec.status == 200
        assert rec.error == "malformed stream: line longer than 16777216 bytes discarded"
        await px.assert_healthy()


async def test_content_length_longer_than_the_body_truncates_for_the_client() -> None:
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession() as s:
        async with s.post(px.url + CHAT, json={"model": "m"}, headers=fault("short-cl")) as r:
            assert r.status == 200 and r.content_length == 1000
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
        (rec,) = await px.records.wait(1)
        assert rec.outcome == "error" and rec.status == 200 and "broke" in (rec.error or "")
        await px.assert_healthy()


async def test_body_longer_than_its_content_length_is_cut_at_the_length() -> None:
    # The bytes after the declared length are not passed on, and the connection they
    # arrived on is not used again (assert_healthy would read them as its response).
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession() as s:
        async with s.post(px.url + CHAT, json={"model": "m"}, headers=fault("long-cl")) as r:
            assert r.status == 200 and r.content_length == 5
            assert await r.read() == b'{"ok"'
        (rec,) = await px.records.wait(1)
        assert rec.status == 200 and rec.outcome == "error" and "malformed" in (rec.error or "")
        await px.assert_healthy()


async def test_gzip_stream_passes_byte_exact_and_still_decodes() -> None:
    pieces = gzip_pieces()
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession(auto_decompress=False) as s:
        async with s.post(px.url + CHAT, json=STREAM_REQ, headers=fault("gzip")) as r:
            assert r.status == 200 and r.headers["Content-Encoding"] == "gzip"
            body = await r.read()
        assert body == b"".join(pieces)
        assert gzip.decompress(body) == b"".join(GZ_EVENTS)
        (rec,) = await px.records.wait(1)
        assert rec.outcome == "ok" and rec.status == 200 and rec.error is None
        assert rec.ttft_s is not None  # timed as 'other': first byte
        await px.assert_healthy()


ERROR_BODY = json.dumps({"error": {"message": "slow down", "type": "rate_limit"}}).encode()


@pytest.mark.parametrize("status", [429, 500, 503])
@pytest.mark.parametrize("with_body", [True, False], ids=["body", "empty"])
async def test_upstream_error_statuses_pass_through(status: int, with_body: bool) -> None:
    body = ERROR_BODY if with_body else b""
    behaviours = {"err": error_behaviour(status, body if with_body else None)}
    async with hostile_upstream(behaviours) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession() as s:
        async with s.post(px.url + CHAT, json=STREAM_REQ, headers=fault("err")) as r:
            assert r.status == status
            assert await r.read() == body
            if status in (429, 503):
                assert r.headers["Retry-After"] == "2"
        (rec,) = await px.records.wait(1)
        assert rec.status == status and rec.outcome == "error"
        assert f"HTTP {status}" in (rec.error or "") or "slow down" in (rec.error or "")
        await px.assert_healthy()
    assert len(up.requests) == 2  # no retries behind the client's back

