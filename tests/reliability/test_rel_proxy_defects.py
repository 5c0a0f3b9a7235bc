"""Defects found by the reliability work in the proxy while it was still being rewritten
(llmtop/proxy/server.py, stamping.py). Each test failed when it was written; the
docstrings describe the defect and the fix, which landed in f2016ee.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from rel_support import (
    CHAT,
    FAULT,
    Conn,
    UpReq,
    hostile_upstream,
    raw_exchange,
    running_proxy,
    sse,
)

PROMPT = "PLANTED-PROMPT-quokka-7731"


async def echo_prompt_in_error_event(conn: Conn, req: UpReq) -> bool:
    """A 200 stream whose mid-stream error event quotes the request (as validation errors
    of pydantic/FastAPI-based servers do)."""
    await conn.head(200, [("Content-Type", "text/event-stream")])
    await conn.chunk(sse({"model": "m", "choices": [{"index": 0, "delta": {"content": "a"}}]}))
    await conn.chunk(sse({"error": {"message": f"invalid input: {PROMPT}",
                                    "type": "invalid_request_error"}}))
    await conn.chunk(sse({"detail": [{"msg": "bad", "input": {"messages": PROMPT}}]}))
    await conn.chunk(b"data: [DONE]\n\n")
    await conn.end()
    return True


async def never_answers(conn: Conn, req: UpReq) -> bool:
    await conn.hold()
    return False


BEHAVIOURS = {"echo": echo_prompt_in_error_event, "never": never_answers}


def request_bytes(length: int, body: bytes = b"") -> bytes:
    return (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode() + body


async def test_client_that_stops_sending_its_headers_is_dropped_after_the_idle_timeout(
        ) -> None:
    """Slowloris: a client that sends half its headers and then nothing holds a connection
    (and a file descriptor) for ever — aiohttp's server has no header timeout, and 1,000
    such clients exhaust the proxy's descriptors.

    Fix (llmtop/proxy/stamping.py, StampingRequestHandler): in ``connection_made`` and
    after each response, arm a ``loop.call_later(cfg.timeouts.idle_s, ...)`` that closes
    the transport when no complete request head has arrived since (``data_received``
    noting a finished head disarms it); ProxyServer passes the limit in through
    ``StampingServer(..., header_timeout_s=cfg.timeouts.idle_s)``."""
    async with hostile_upstream(BEHAVIOURS) as up, \
            running_proxy(up.url, timeouts__idle_s=0.5) as px:
        t = time.perf_counter()
        out = await raw_exchange(px.port, f"POST {CHAT} HTTP/1.1\r\nHost: x\r\n".encode(),
                                 read_s=5.0)
        took = time.perf_counter() - t
        # closed (a 408 is fine too) well before the 5 s the client would wait
        assert out == b"" or out.startswith(b"HTTP/1.1 408"), out[:200]
        assert took < 3.0, f"the half-sent request head was held {took:.1f} s"
        assert not up.requests
        await px.assert_healthy()


async def test_client_that_stops_sending_its_body_is_dropped_after_the_idle_timeout() -> None:
    """A client that declares a body and stops sending it keeps its handler, connection and
    buffered bytes for ever (``_read_body`` awaits ``readany()`` with no limit).

    Fix (llmtop/proxy/server.py, ``_serve``): read the body under the request's watchdog
    — ``wd.arm(cfg.timeouts.idle_s, "request body")`` before ``_read_body`` and
    ``wd.last_ns = perf_counter_ns()`` after each ``readany()`` (or the sweeper's
    equivalent) — and on expiry answer 408 in the API's error shape with the record
    ``status=408, outcome="timeout", error="client sent no body for N s"``."""
    async with hostile_upstream(BEHAVIOURS) as up, \
            running_proxy(up.url, timeouts__idle_s=0.5) as px:
        t = time.perf_counter()
        out = await raw_exchange(px.port, request_bytes(1000, b"0123456789"), read_s=5.0)
        took = time.perf_counter() - t
        assert out.startswith(b"HTTP/1.1 408"), out[:200]
        assert took < 3.0
        (rec,) = await px.records.wait(1)
        assert rec.status == 408 and rec.outcome == "timeout"
        assert not up.requests  # nothing half-read was sent upstream
        assert not px.server.active
        await px.assert_healthy()


async def test_upstream_error_text_quoting_the_prompt_is_not_recorded() -> None:
    """An upstream error event that quotes the prompt put the prompt into the record's
    ``error`` — and so into recordings, /llmtop/v1/requests and the TUI — although prompt
    text must never be stored unless ``recording.record_content`` is on
    (shared/docs/interfaces.md).

    Fix (llmtop/proxy/server.py, where ``parser.error`` becomes the record's error): keep
    llmtop's own parser messages ("malformed JSON ...", oversize), but for an error the
    *upstream* wrote record only ``upstream error event`` plus its ``type``/``code``
    when that is a short machine word (``[A-Za-z0-9_.:-]{1,64}``) — the message itself
    only when ``recording.record_content`` is on. (Parsers could expose the type/code as
    ``error_kind`` next to ``error`` so server.py need not re-parse.)"""
    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession() as s:
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
        async with s.post(px.url + CHAT, json=body, headers={FAULT: "echo"}) as r:
            assert r.status == 200
            assert PROMPT.encode() in await r.read()  # the client still sees it all
        (rec,) = await px.records.wait(1)
    assert rec.outcome == "error" and rec.error
    assert "quokka" not in json.dumps(rec.to_json_dict()), rec.error


async def test_an_internal_error_is_recorded_as_one() -> None:
    """When the handler fails unexpectedly aiohttp answers 500, but the record kept
    ``outcome="ok"`` and the status of whatever came before — so errors llmtop itself
    causes vanish from every figure (seen for real when the new upstream client failed
    under uvloop: clients got 500, records said ok).

    Fix (llmtop/proxy/server.py, ``_handle``): ``except Exception as exc:`` around
    ``self._serve(...)`` → ``if not ex.headers_sent: ex.status = 500``;
    ``ex.fail("error", f"llmtop internal error: {type(exc).__name__}")``; ``raise``."""
    from llmtop.proxy.server import ProxyServer

    class Broken(RuntimeError):
        pass

    async def fail(*_args: object, **_kw: object) -> object:
        raise Broken("injected")

    async with hostile_upstream(BEHAVIOURS) as up, running_proxy(up.url) as px, \
            aiohttp.ClientSession() as s:
        # the fault is injected into this one proxy object only: the next step after
        # reading the request raises
        assert isinstance(px.server, ProxyServer)
        px.server.forward = fail  # type: ignore[method-assign]
        async with s.post(px.url + CHAT, json={"model": "m"}) as r:
            assert r.status == 500
        (rec,) = await px.records.wait(1)
        assert rec.status == 500 and rec.outcome == "error", rec
        assert "Broken" in (rec.error or "")
        await asyncio.sleep(0)
