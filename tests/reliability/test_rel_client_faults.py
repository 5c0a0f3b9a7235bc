"""Fault matrix, client side: clients that leave, trickle, overflow or send garbage.

Each case asserts what the client saw, that the proxy still serves a normal stream
afterwards, and the request record (where the request got far enough to have one). When
the client leaves, the upstream must see its connection closed promptly, so the engine
stops generating for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time

import aiohttp
import pytest
from loop_ticks import LoopTicks
from rel_support import (
    CHAT,
    FAULT,
    Conn,
    UpReq,
    chat_chunk,
    hostile_upstream,
    raw_exchange,
    running_proxy,
)

SSE = ("Content-Type", "text/event-stream")
STREAM_REQ = {"model": "m", "stream": True}


async def never_answers(conn: Conn, req: UpReq) -> bool:
    await conn.hold()
    return False


async def slow_forever(conn: Conn, req: UpReq) -> bool:
    """A stream that never ends, one chunk every 20 ms, until the proxy hangs up."""
    await conn.head(200, [SSE])
    watcher = asyncio.ensure_future(conn.hold())
    try:
        i = 0
        while not watcher.done():
            await conn.chunk(chat_chunk(f"t{i}"))
            i += 1
            await asyncio.wait([watcher], timeout=0.02)
    except ConnectionError:
        conn.up.note_closed()
    finally:
        watcher.cancel()
    return False


async def one_chunk_then_stall(conn: Conn, req: UpReq) -> bool:
    await conn.head(200, [SSE])
    await conn.chunk(chat_chunk("a"))
    await conn.hold()
    return False


async def echo_body(conn: Conn, req: UpReq) -> bool:
    """JSON with the request body's length and hex, so the client can check it."""
    body = json.dumps({"len": len(req.body), "hex": req.body.hex()}).encode()
    await conn.head(200, [("Content-Type", "application/json"),
                          ("Content-Length", str(len(body)))], chunked=False)
    await conn.send(body)
    return True


BEHAVIOURS = {"never": never_answers, "slow": slow_forever, "stall": one_chunk_then_stall,
              "echo": echo_body}


# "Promptly", in 20 ms wake-ups of the loop that test, proxy and upstream share (see
# loop_ticks), not within 0.5 s: a freeze of the test process after the client left counted
# against the proxy in seconds. Unstalled 0; a proxy that saw the client go 0.6 s late
# (connection_lost put off by call_later) ~30.
PROMPT_TICKS = 20


def request_bytes(body: bytes, *, extra: str = "", path: str = CHAT) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def test_client_leaving_before_headers_closes_the_upstream() -> None:
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px:
        _reader, writer = await asyncio.open_connection("127.0.0.1", px.port)
        writer.write(request_bytes(json.dumps(STREAM_REQ).encode(), extra=f"{FAULT}: never\r\n"))
        await writer.drain()
        await up.received.wait()
        async with LoopTicks() as ticks:
            left = time.perf_counter()
            writer.close()
            seen = await up.wait_closed()
            took = ticks.n
        (rec,) = await px.records.wait(1)
        print(f"upstream closed {1e3 * (seen - left):.1f} ms, {took} ticks after the client "
              "left")
        assert took <= PROMPT_TICKS
        assert rec.outcome == "cancelled" and rec.status == 499 and rec.ttft_s is None
        assert rec.error == "client disconnected"
        await px.assert_healthy()


@pytest.mark.parametrize("behaviour", ["slow", "stall"])
async def test_client_leaving_mid_stream_closes_the_upstream(behaviour: str) -> None:
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession() as s:
        r = await s.post(px.url + CHAT, json=STREAM_REQ, headers={FAULT: behaviour})
        assert r.status == 200
        got = b""
        while got.count(b"\n\n") < (3 if behaviour == "slow" else 1):
            got += await r.content.readany()
        async with LoopTicks() as ticks:
            left = time.perf_counter()
            r.close()
            seen = await up.wait_closed()
            took = ticks.n
        (rec,) = await px.records.wait(1)
        print(f"{behaviour}: upstream closed {1e3 * (seen - left):.1f} ms, {took} ticks after "
              "the client left")
        assert took <= PROMPT_TICKS
        assert rec.outcome == "cancelled" and rec.status == 200 and rec.ttft_s is not None
        assert rec.error == "client disconnected"
        await px.assert_healthy()


async def test_slowloris_body_does_not_hold_up_other_clients() -> None:
    body = json.dumps({"model": "m", "pad": "x" * 20}).encode()
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px:
        reader, writer = await asyncio.open_connection("127.0.0.1", px.port)
        writer.write(request_bytes(b"", extra=f"{FAULT}: echo\r\n").replace(
            b"Content-Length: 0", b"Content-Length: %d" % len(body)))
        await writer.drain()

        async def trickle() -> None:
            for i in range(len(body)):
                writer.write(body[i:i + 1])
                await writer.drain()
                await asyncio.sleep(0.04)

        feeder = asyncio.create_task(trickle())
        t = time.perf_counter()
        served = 0
        while not feeder.done():  # the proxy keeps serving while the body trickles in
            await px.assert_healthy(idle=False)
            served += 1
        await feeder
        took = time.perf_counter() - t
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            answer = json.loads(await reader.readexactly(length))
        writer.close()
        assert head.startswith(b"HTTP/1.1 200")
        assert bytes.fromhex(answer["hex"]) == body  # the trickled body arrived whole
        assert served >= 5, (served, took)
        recs = await px.records.wait(served + 1)
        slow = [r for r in recs if not r.user.startswith("health-check")]
        assert len(slow) == 1 and slow[0].outcome == "ok" and slow[0].e2e_s >= 1.0


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_body_over_the_limit_is_413_without_contacting_upstream(chunked: bool) -> None:
    big = b"x" * (2 * 1024 * 1024)
    async with hostile_upstream(BEHAVIOURS) as up, \
            running_proxy(up.url, max_body_bytes=1024 * 1024) as px, \
            aiohttp.ClientSession() as s:

        async def gen() -> object:
            for i in range(0, len(big), 65536):
                yield big[i:i + 65536]

        data = gen() if chunked else io.BytesIO(big)
        async with s.post(px.url + CHAT, data=data,  # type: ignore[arg-type]
                          headers={"Content-Type": "application/json"}) as r:
            assert r.status == 413
            err = await r.json()
        assert err["error"]["code"] == "request_too_large"
        (rec,) = await px.records.wait(1)
        assert rec.status == 413 and rec.outcome == "error" and "max_body_bytes" in (
            rec.error or "")
        assert not up.requests
        await px.assert_healthy()


@pytest.mark.parametrize(
    "garbage",
    [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)),  # a TLS hello
     b"GARBAGE\r\n\r\n",
     b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"zz\r\nnot hex\r\n"],
    ids=["tls", "garbage", "negative-length", "bad-chunk"],
)
async def test_malformed_http_is_refused_and_the_proxy_carries_on(garbage: bytes) -> None:
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px:
        out = await raw_exchange(px.port, garbage)
        assert out.startswith(b"HTTP/1.0 400 Bad Request"), out[:200]
        px.records.bus.drain()
        for rec in px.records.items:  # whatever got far enough to be a request is an error
            assert rec.outcome != "ok" or rec.status >= 400, rec
        assert not [r for r in up.requests if r.body == b"not hex"]
        await px.assert_healthy()


@pytest.mark.parametrize(
    "body",
    [b'{"model": "m", "stream": tru', b'\xff\xfe{"model": "\xc3\x28"}', b"[1, 2, 3]",
     b'{"model": {"nested": [1]}, "stream": "yes", "user": 42}', b"\x00" * 100],
    ids=["invalid-json", "non-utf8", "json-array", "wrong-types", "nul-bytes"],
)
async def test_odd_bodies_are_forwarded_unchanged_for_the_upstream_to_judge(
        body: bytes) -> None:
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession() as s:
        async with s.post(px.url + CHAT, data=body, headers={
                FAULT: "echo", "Content-Type": "application/json"}) as r:
            assert r.status == 200
            answer = await r.json()
        assert bytes.fromhex(answer["hex"]) == body
        (rec,) = await px.records.wait(1)
        assert rec.status == 200 and rec.model is None and not rec.stream
        assert rec.user == "127.0.0.1"
        await px.assert_healthy()


async def test_thousand_headers_are_refused_cleanly() -> None:
    headers = "".join(f"X-H-{i}: {i}\r\n" for i in range(1000))
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px:
        out = await raw_exchange(px.port, request_bytes(b"{}", extra=headers))
        assert out.startswith(b"HTTP/1.0 400"), out[:200]
        head, _, body = out.partition(b"\r\n\r\n")
        assert b"Content-Type: application/json" in head  # the proxy's own error shape
        error = json.loads(body)["error"]
        assert error["code"] == "bad_request"
        assert error["message"] == "llmtop: bad request: Too many headers received"
        assert not up.requests
        await px.assert_healthy()


async def test_hundred_headers_pass_through() -> None:
    names = [f"X-H-{i}" for i in range(100)]
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession() as s:
        async with s.post(px.url + CHAT, data=b"{}", headers={
                FAULT: "echo", **{n: str(i) for i, n in enumerate(names)}}) as r:
            assert r.status == 200
        (seen,) = up.requests
        assert all(seen.headers[n.lower()] == str(i) for i, n in enumerate(names))
        await px.assert_healthy()


@pytest.mark.parametrize(
    "extra",
    ["X-LLMTOP-User: \xff\xfe\xc3(\r\n", "Authorization: Bearer \xe9\xff\r\n",
     "X-Custom: \xc0\xaf\r\n"],
    ids=["user-header", "authorization", "other-header"],
)
async def test_non_utf8_header_values_do_not_break_the_request(extra: str) -> None:
    raw = request_bytes(b'{"model":"m"}', extra=f"{FAULT}: echo\r\n").replace(
        b"\r\n\r\n", b"\r\n" + extra.encode("latin-1") + b"Connection: close\r\n\r\n", 1)
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px:
        out = await raw_exchange(px.port, raw)
        assert out.startswith(b"HTTP/1.1 200"), out[:300]
        (rec,) = await px.records.wait(1)
        assert rec.status == 200 and rec.outcome == "ok"
        # the user name is text every output can carry (JSON, Prometheus, the terminal)
        rec.user.encode("utf-8")
        json.dumps(rec.to_json_dict(), ensure_ascii=False).encode("utf-8")
        (seen,) = up.requests
        name, _, value = extra[:-2].partition(": ")
        assert seen.headers[name.lower()].encode("latin-1") == value.encode("latin-1")
        await px.assert_healthy()


async def test_non_utf8_path_is_refused_with_400() -> None:
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px:
        out = await raw_exchange(px.port, (b"GET /v1/models/\xff\xfe?q=\xc3( HTTP/1.1\r\n"
                                           b"Host: x\r\nConnection: close\r\n\r\n"))
        # aiohttp's request parser refuses raw non-ASCII bytes in the target
        assert out.startswith(b"HTTP/1.0 400") and b"Invalid char in url path" in out, out
        assert not up.requests
        await px.assert_healthy()


async def test_many_clients_leaving_at_once_leave_nothing_open() -> None:
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession() as s:
        resps = await asyncio.gather(*[
            s.post(px.url + CHAT, json=STREAM_REQ, headers={FAULT: "slow"}) for _ in range(50)])
        for r in resps:
            await r.content.readany()
        assert len(px.server.active) == 50
        for r in resps:
            r.close()
        recs = await px.records.wait(50)
        await up.wait_closed_count(50)
        assert {r.outcome for r in recs} == {"cancelled"}
        assert not px.server.active
        await px.assert_healthy()
        with contextlib.suppress(Exception):
            await s.close()


async def test_lone_surrogates_in_body_user_and_model_become_text() -> None:
    """JSON may spell lone surrogates (``"\\udcff"``); they must not reach the record as
    such, or every UTF-8 output (/metrics, recordings with ensure_ascii off, the
    terminal) fails on them."""
    from prometheus_client import generate_latest

    from llmtop.config import Config
    from llmtop.metrics.aggregator import Aggregator
    from llmtop.metrics.prometheus import make_registry

    body = b'{"model": "m\\udcff\\ud800", "user": "u\\udcfe", "stream": true}'
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession() as s:
        async with s.post(px.url + CHAT, data=body, headers={
                FAULT: "echo", "Content-Type": "application/json"}) as r:
            assert r.status == 200
            await r.read()
        (rec,) = await px.records.wait(1)
    assert rec.user.startswith("u") and rec.model is not None and rec.model.startswith("m")
    rec.user.encode("utf-8")
    rec.model.encode("utf-8")
    agg = Aggregator(Config(), {})
    agg.on_events([rec])
    text = generate_latest(make_registry(agg)).decode("utf-8")
    assert "llmtop_requests_total" in text
