"""``trusted_proxies`` over real sockets: behind a balancer the records' ``user`` is the
client it forwards, on the direct path (a request whole in one read on a warm keep-alive
connection) and aiohttp's (a chunked body), streamed or not; from any other peer the
forwarded fields are not believed; and they reach the upstream as the client sent them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import aiohttp
import openai
import pytest
from net_support import loopback_v6
from test_proxy_support import Records, Script, running_proxy, scripted_upstream

from llmtop.proxy.server import ProxyServer
from llmtop.sim.server import running_sim


def _body(stream: bool) -> bytes:
    return json.dumps({"model": "m", "max_tokens": 3, "stream": stream,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()


def _whole(fields: bytes, body: bytes) -> bytes:
    """Head and body in one write, with a length: served directly on a warm connection."""
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Type: application/json"
            b"\r\n" + fields + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def _chunked(fields: bytes, body: bytes) -> bytes:
    """A chunked body: never served directly (aiohttp's path)."""
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Type: application/json"
            b"\r\nTransfer-Encoding: chunked\r\n" + fields + b"\r\n"
            + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")


async def _response(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200"), head
    if b"transfer-encoding: chunked" in head.lower():
        body = b""
        while True:
            size = int(await asyncio.wait_for(reader.readuntil(b"\r\n"), 10), 16)
            body += await reader.readexactly(size + 2)
            if size == 0:
                return body
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return await reader.readexactly(length)


CASES: list[tuple[bytes, str]] = [
    (b"X-Forwarded-For: 203.0.113.1, 127.0.0.1\r\n", "203.0.113.1"),
    (b'Forwarded: for="[2001:db8::2]:4711";proto=https\r\n', "2001:db8::2"),
    (b"X-Real-IP: 203.0.113.3\r\n", "203.0.113.3"),
    (b"X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-For: 203.0.113.4:5555\r\n", "203.0.113.4"),
    (b"Forwarded: for=_hidden\r\nX-Forwarded-For: 6.6.6.6\r\n", "127.0.0.1"),
    (b"X-Forwarded-For: \xff garbage\r\n", "127.0.0.1"),
    (b"", "127.0.0.1"),
    # the earlier steps still win
    (b"X-LLMTOP-User: alice\r\nX-Forwarded-For: 203.0.113.5\r\n", "alice"),
]
"""Forwarded fields a balancer at 127.0.0.1 sends, and the user they name."""


async def _send_all(proxy: ProxyServer, url: str, recs: Records,
                    cases: Sequence[tuple[bytes, str]]) -> list[tuple[str, str]]:
    """Every case streamed and not, on the direct path (a keep-alive connection already
    used once, which leaves an upstream connection idle), then on aiohttp's (a connection
    of its own: after a chunked request the next is not known to start a read, and goes
    to aiohttp too): the (user, path) of each record, in order."""
    host, port = url.removeprefix("http://").split(":")
    got: list[tuple[str, str]] = []
    n = 0
    for frame, path in ((_whole, "direct"), (_chunked, "aiohttp")):
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            if path == "direct":
                writer.write(_whole(b"", _body(False)))
                await _response(reader)
                n += 1
                await recs.wait(n)
            for fields, _ in cases:
                for stream in (True, False):
                    before = proxy.direct_starts
                    writer.write(frame(fields, _body(stream)))
                    await _response(reader)
                    n += 1
                    user = (await recs.wait(n))[-1].user
                    got.append((user, "direct" if proxy.direct_starts > before else "aiohttp"))
        finally:
            writer.close()
    return got


def _want(cases: Sequence[tuple[bytes, str]]) -> list[tuple[str, str]]:
    return [(user, path) for path in ("direct", "aiohttp") for _, user in cases
            for _ in (True, False)]


async def test_behind_a_trusted_balancer_the_user_is_the_forwarded_client() -> None:
    async with running_sim("tiny") as sim, running_proxy(
            sim.url, trusted_proxies=["127.0.0.1"]) as (proxy, url, recs):
        got = await _send_all(proxy, url, recs, CASES)
    assert got == _want(CASES)


@pytest.mark.parametrize("trusted", [[], ["10.0.0.0/8", "::1"]])
async def test_from_a_peer_not_trusted_the_forwarded_fields_are_not_believed(
        trusted: list[str]) -> None:
    """Spoofing refused: by default (``[]``), and when the peer is not a listed one."""
    async with running_sim("tiny") as sim, running_proxy(
            sim.url, trusted_proxies=trusted) as (proxy, url, recs):
        got = await _send_all(proxy, url, recs, CASES)
    assert got == _want([(fields, "alice" if user == "alice" else "127.0.0.1")
                         for fields, user in CASES])


async def test_the_openai_sdk_behind_a_balancer() -> None:
    # (no Authorization: an API key would name the user before the address does)
    keyless = {"Authorization": openai.Omit()}
    async with running_sim("tiny") as sim, running_proxy(
            sim.url, trusted_proxies=["127.0.0.0/8"]) as (_, url, recs):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused",
                                    default_headers={"X-Forwarded-For": "198.51.100.7"})
        try:
            stream = await client.chat.completions.create(
                model="m", max_tokens=3, stream=True, extra_headers=keyless,
                messages=[{"role": "user", "content": "hi"}])
            async for _ in stream:
                pass
            await client.chat.completions.create(
                model="m", max_tokens=3, messages=[{"role": "user", "content": "hi"}],
                extra_headers={**keyless, "X-Forwarded-For": "198.51.100.8, 127.0.0.2"})
        finally:
            await client.close()
        got = await recs.wait(2)
    assert [(r.user, r.stream, r.outcome) for r in got] == [
        ("198.51.100.7", True, "ok"), ("198.51.100.8", False, "ok")]


async def test_the_forwarded_fields_reach_the_upstream_as_sent() -> None:
    """llmtop is transparent: the fields go upstream unchanged, line by line, and it adds
    none of its own (no X-Forwarded-For of the balancer's address)."""
    fields = (b"Forwarded: for=203.0.113.1\r\nX-Forwarded-For: 6.6.6.6\r\n"
              b"x-forwarded-for: 203.0.113.2, 127.0.0.1\r\nX-Real-IP: 203.0.113.3\r\n")
    async with scripted_upstream() as up:
        up.script = Script(chunks=[b"{}"], content_length=True)
        async with running_proxy(up.url, trusted_proxies=["127.0.0.1"]) as (
                proxy, url, recs):
            got = await _send_all(proxy, url, recs, [(fields, "203.0.113.1"), (b"", "")])
    assert got == _want([(fields, "203.0.113.1"), (b"", "127.0.0.1")])
    sent = [[(k.lower(), v) for k, v in s.headers
             if k.lower() in ("forwarded", "x-forwarded-for", "x-real-ip")] for s in up.seen]
    assert len(sent) == 9
    as_sent = [("forwarded", "for=203.0.113.1"), ("x-forwarded-for", "6.6.6.6"),
               ("x-forwarded-for", "203.0.113.2, 127.0.0.1"), ("x-real-ip", "203.0.113.3")]
    # the warm-up; direct: 2 with the fields, 2 without; aiohttp's path: the same
    assert sent == [[], as_sent, as_sent, [], [], as_sent, as_sent, [], []]


@pytest.mark.skipif(not loopback_v6(), reason="no ::1 on this machine")
async def test_a_dual_stack_listener_trusts_ipv4_and_ipv6_balancers() -> None:
    """On ``[::]`` an IPv4 balancer's connection comes from ``::ffff:127.0.0.1``: trusted
    as the ``127.0.0.1`` listed; an IPv6 one from ``::1``."""
    async with running_sim("tiny") as sim:
        for listed, host in ((["127.0.0.1"], "127.0.0.1"), (["::1/128"], "[::1]")):
            async with running_proxy(sim.url, listen="[::]:0", trusted_proxies=listed) as (
                    _, url, recs), aiohttp.ClientSession() as s:
                port = url.rsplit(":", 1)[1]
                async with s.post(f"http://{host}:{port}/v1/chat/completions",
                                  data=_body(True), headers={
                                      "X-Forwarded-For": "203.0.113.9"}) as r:
                    assert r.status == 200
                    await r.read()
                got = await recs.wait(1)
            assert got[0].user == "203.0.113.9", listed
