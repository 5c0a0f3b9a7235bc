"""``Expect`` with an expectation other than ``100-continue`` goes upstream as it came.

RFC 9110 10.1.1: a server that receives an expectation it does not support may answer
417. Whether it does is the upstream's call — Go's net/http (Ollama) and aiohttp's router
answer 417, uvicorn (vLLM, SGLang) serves the request — so the proxy, which has nothing
to meet, forwards the field and relays whatever the upstream answers: the client sees
what it would see reaching the upstream directly. It used to drop the field, and the
upstream served the request as if nothing had been expected. ``100-continue`` is still
the proxy's own (answered by it, never forwarded). Raw sockets on both sides.
"""

from __future__ import annotations

import asyncio

import pytest
from test_proxy_support import running_proxy
from test_qa_hostile import OK, exchange, raw_upstream

EXPECTATION_FAILED = (b"HTTP/1.1 417 Expectation Failed\r\nContent-Type: text/plain\r\n"
                      b"Content-Length: 6\r\n\r\nno way")


def _post(fields: bytes, version: bytes = b"1.1") -> bytes:
    return (b"POST /v1/x HTTP/" + version + b"\r\nHost: x\r\n" + fields
            + b"Content-Length: 2\r\n\r\nhi")


async def _like_an_engine(head: bytes, _n: int) -> bytes:
    """417 for an expectation it does not know (as Go's net/http does), 200 otherwise."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"expect" and value.strip().lower() != b"100-continue":
            return EXPECTATION_FAILED
    return OK


def _expect_lines(head: bytes) -> list[bytes]:
    return [line for line in head.split(b"\r\n") if line.lower().startswith(b"expect:")]


@pytest.mark.parametrize("value", [b"foo", b"foo=bar; baz", b"100-continue, foo",
                                   b"200-ok"])
async def test_an_unknown_expectation_is_forwarded_and_the_upstreams_417_relayed(
        value: bytes) -> None:
    async with raw_upstream(_like_an_engine) as (url, heads, _conns), \
            running_proxy(url) as (_proxy, purl, _recs):
        ((status, headers, body),) = await exchange(purl, [_post(b"Expect: " + value + b"\r\n")])
    assert _expect_lines(heads[0]) == [b"Expect: " + value]
    assert (status, body) == (417, b"no way")
    assert headers["content-type"] == "text/plain"


async def test_an_unknown_expectation_an_upstream_ignores_is_served() -> None:
    async def ignores(_head: bytes, _n: int) -> bytes:
        return OK

    async with raw_upstream(ignores) as (url, heads, _conns), \
            running_proxy(url) as (_proxy, purl, _recs):
        ((status, _headers, body),) = await exchange(purl, [_post(b"Expect: foo\r\n")])
    assert _expect_lines(heads[0]) == [b"Expect: foo"]
    assert (status, body) == (200, b"ok")


async def test_an_expect_field_that_connection_lists_is_hop_by_hop_and_dropped() -> None:
    async with raw_upstream(_like_an_engine) as (url, heads, _conns), \
            running_proxy(url) as (_proxy, purl, _recs):
        ((status, _h, _b),) = await exchange(
            purl, [_post(b"Connection: expect\r\nExpect: foo\r\n")])
    assert status == 200 and _expect_lines(heads[0]) == []


@pytest.mark.parametrize("value", [b"100-continue", b"100-Continue", b" 100-CONTINUE "])
async def test_100_continue_is_still_the_proxys_own(value: bytes) -> None:
    """The proxy answers 100 Continue itself (the client waits for it before sending its
    body) and does not forward the field."""
    async with raw_upstream(_like_an_engine) as (url, heads, _conns), \
            running_proxy(url) as (_proxy, purl, _recs):
        host, port = purl.removeprefix("http://").split(":")
        r, w = await asyncio.open_connection(host, int(port))
        try:
            w.write(b"POST /v1/x HTTP/1.1\r\nHost: x\r\nExpect: " + value
                    + b"\r\nContent-Length: 2\r\n\r\n")
            async with asyncio.timeout(5):
                interim = await r.readuntil(b"\r\n\r\n")
                w.write(b"hi")
                final = await r.readuntil(b"\r\n\r\n")
                body = await r.readexactly(2)
        finally:
            w.close()
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert final.startswith(b"HTTP/1.1 200") and body == b"ok"
    assert _expect_lines(heads[0]) == []
