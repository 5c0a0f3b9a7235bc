"""Request targets at the socket level: what goes upstream for a target in a form other
than the usual ``/path?query`` (RFC 9112 3.2), compared with what the upstream reached
directly would be asked."""

from __future__ import annotations

import pytest
from test_proxy_support import running_proxy
from test_qa_hostile import OK, exchange, raw_upstream


async def _ok(_head: bytes, _n: int) -> bytes:
    return OK


@pytest.mark.parametrize(
    ("target", "upstream_target"),
    [
        (b"http://engine", b"/"),
        (b"http://engine?x=1", b"/?x=1"),
        (b"http://engine/v1/models?x=%2F", b"/v1/models?x=%2F"),
    ],
    ids=["empty-path", "empty-path-query", "path"],
)
async def test_absolute_form_with_an_empty_path_asks_the_upstream_for_slash(
        target: bytes, upstream_target: bytes) -> None:
    """RFC 9112 3.2.1/3.3: an absolute-form target with an empty path names ``/`` (a server
    reached directly serves it as ``/``). The proxy sent the empty path on as it was:
    ``GET  HTTP/1.1`` (no target at all, a request line the upstream refuses) and
    ``GET ?x=1 HTTP/1.1``."""
    async with raw_upstream(_ok) as (url, heads, _c), \
            running_proxy(url) as (_, purl, _r):
        got = await exchange(purl, [b"GET " + target + b" HTTP/1.1\r\nHost: engine\r\n\r\n"])
    assert [(s, b) for s, _, b in got] == [(200, b"ok")]
    assert heads[0].startswith(b"GET " + upstream_target + b" HTTP/1.1\r\n"), heads[0]


async def test_absolute_form_with_an_empty_path_keeps_the_path_prefix() -> None:
    """Under an upstream URL with a path, the empty path is the prefix's ``/``."""
    async with raw_upstream(_ok) as (url, heads, _c), \
            running_proxy(url + "/v1") as (_, purl, _r):
        got = await exchange(purl, [b"GET http://engine?x HTTP/1.1\r\nHost: engine\r\n\r\n"])
    assert got[0][0] == 200
    assert heads[0].startswith(b"GET /v1/?x HTTP/1.1\r\n"), heads[0]


async def test_absolute_form_with_an_empty_path_is_recorded_as_slash() -> None:
    """The record's path is the path asked for, ``/``, not an empty string."""
    async with raw_upstream(_ok) as (url, heads, _c), \
            running_proxy(url) as (_, purl, records):
        got = await exchange(purl, [b"POST http://engine HTTP/1.1\r\nHost: engine\r\n"
                                    b"Content-Length: 2\r\n\r\n{}"])
        (record,) = await records.wait(1)
    assert got[0][0] == 200
    assert heads[0].startswith(b"POST / HTTP/1.1\r\n"), heads[0]
    assert record.path == "/" and record.outcome == "ok"


async def test_a_target_with_a_fragment_is_measured_alike_cold_and_warm() -> None:
    """A ``#`` in a request target (no client should send one: a fragment is not part of
    it) is read by aiohttp's path as the path before it, so ``POST
    /v1/chat/completions#x`` was measured as OpenAI; served directly (a warm pool), the
    whole target was the path, and the same request was recorded as dialect ``other``,
    without its tokens. Such a target is now left to aiohttp's path; it goes upstream as
    sent either way."""

    async def respond(_head: bytes, _n: int) -> bytes:
        body = b'{"id":"x","model":"m","usage":{"prompt_tokens":3,"completion_tokens":4}}'
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    body = b'{"model":"m","messages":[]}'
    request = (b"POST /v1/chat/completions#x HTTP/1.1\r\nHost: engine\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    async with raw_upstream(respond) as (url, heads, _c), \
            running_proxy(url) as (_, purl, records):
        await exchange(purl, [request])  # cold: aiohttp's path
        await exchange(purl, [b"GET /prime HTTP/1.1\r\nHost: engine\r\n\r\n"])
        await exchange(purl, [request])  # warm: an upstream connection is idle
        cold, warm = await records.wait(2)
    for record in (cold, warm):
        assert (record.path, record.dialect) == ("/v1/chat/completions", "openai"), record
        assert (record.prompt_tokens, record.completion_tokens) == (3, 4)
    assert heads[0] == heads[2] and heads[0].startswith(b"POST /v1/chat/completions#x ")
