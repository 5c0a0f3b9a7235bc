"""QA with hostile upstreams and clients at the socket level: what the proxy must refuse
(a response head with control bytes or a bad field name, a status below 100, body framing
broken before the head went out, CONNECT) and what it must not reuse (an upstream
connection whose response had both Content-Length and Transfer-Encoding)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from test_proxy_support import running_proxy

Respond = Callable[[bytes, int], Awaitable[bytes]]
"""(request head, the connection's request number) → the raw response bytes."""


@contextlib.asynccontextmanager
async def raw_upstream(respond: Respond) -> AsyncIterator[tuple[str, list[bytes], list[int]]]:
    """A keep-alive TCP upstream answering each request with exact bytes; yields its URL,
    the request heads it got and a list counting its connections."""
    heads: list[bytes] = []
    conns: list[int] = []

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conns.append(1)
        n = 0
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        await r.readexactly(int(line.split(b":")[1]))
                heads.append(head)
                n += 1
                w.write(await respond(head, n))
                await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", heads, conns
    finally:
        server.close()
        await server.wait_closed()


async def exchange(url: str, requests: list[bytes], wait_s: float = 2.0
                   ) -> list[tuple[int, dict[str, str], bytes]]:
    """Send ``requests`` one after another on one raw connection to the proxy (each after
    the previous response was read); returns status, headers and body of each response
    (status 0: the connection closed with no response)."""
    host, port = url.removeprefix("http://").split(":")
    r, w = await asyncio.open_connection(host, int(port))
    out: list[tuple[int, dict[str, str], bytes]] = []
    try:
        for req in requests:
            w.write(req)
            await w.drain()
            async with asyncio.timeout(wait_s):
                try:
                    head = await r.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    out.append((0, {}, b""))
                    break
                lines = head.decode("latin-1").split("\r\n")
                status = int(lines[0].split(" ")[1])
                headers = {k.lower(): v.strip() for k, _, v in
                           (line.partition(":") for line in lines[1:] if line)}
                if "content-length" in headers:
                    body = await r.readexactly(int(headers["content-length"]))
                elif headers.get("transfer-encoding") == "chunked":
                    body = b""
                    while True:
                        size = int((await r.readuntil(b"\r\n"))[:-2], 16)
                        body += (await r.readexactly(size + 2))[:-2]
                        if size == 0:
                            break
                else:
                    body = b""
                out.append((status, headers, body))
    finally:
        w.close()
    return out


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


def proxy_error(resp: tuple[int, dict[str, str], bytes]) -> str:
    """The proxy's own JSON error message in ``resp``."""
    status, headers, body = resp
    assert headers["content-type"].startswith("application/json"), (status, headers, body)
    message = json.loads(body)["error"]["message"]
    assert isinstance(message, str)
    return message


@pytest.mark.parametrize(
    ("head", "why"),
    [
        (b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 2", "control byte"),
        (b"HTTP/1.1 200 OK\r\nX-A: a\x7fb\x01\r\nContent-Length: 2", "control byte"),
        (b"HTTP/1.1 200 OK\r\nX A: b\r\nContent-Length: 2", "bad header name"),
        (b"HTTP/1.1 200 OK\r\nX(A): b\r\nContent-Length: 2", "bad header name"),
        (b"HTTP/1.1 200 O\x00K\r\nContent-Length: 2", "control byte in the status line"),
        (b"HTTP/1.1 099 X\r\nContent-Length: 2", "bad status line"),
    ],
)
async def test_upstream_head_with_control_bytes_or_bad_names_is_502(head: bytes, why: str
                                                                      ) -> None:
    async def respond(_head: bytes, _n: int) -> bytes:
        return head + b"\r\n\r\nok"

    async with raw_upstream(respond) as (url, _, _c), running_proxy(url) as (_, purl, _r):
        (resp,) = await exchange(purl, [get("/x")])
        assert resp[0] == 502
        assert why in proxy_error(resp)
        # the proxy still serves
        assert (await exchange(purl, [get("/x")]))[0][0] == 502


async def test_upstream_head_that_is_unusual_but_valid_still_passes() -> None:
    heads = [
        b"HTTP/1.1 200\r\nContent-Length: 2",  # no reason phrase
        b"HTTP/1.1 200 \xc3\xa9t\xc3\xa9\r\nX-T: a\tb \xff\r\nX-F: one\r\n  two\r\n"
        b"Content-Length: 2",  # obs-text, a tab, obsolete line folding
        b"HTTP/1.1 599 Weird\r\nX-!#$%&'*+-.^_`|~: v\r\nContent-Length: 2",
    ]

    async def respond(_head: bytes, n: int) -> bytes:
        return heads[n - 1] + b"\r\n\r\nok"

    async with raw_upstream(respond) as (url, _, _c), running_proxy(url) as (_, purl, _r):
        got = await exchange(purl, [get("/x")] * 3)
    assert [(s, b) for s, _, b in got] == [(200, b"ok"), (200, b"ok"), (599, b"ok")]
    assert got[1][1]["x-t"] == "a\tb \xff" and got[1][1]["x-f"] == "one two"


BAD_FIRST_READ = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n-5\r\nabcde\r\n0\r\n\r\n")


async def test_chunked_framing_broken_before_the_head_went_out_is_502() -> None:
    """The first body bytes came with the head and their framing is broken: nothing had
    gone to the client, which gets a whole 502 (it got a closed connection and no
    response) — on aiohttp's path (first request) and the direct path (the next, once a
    pooled upstream connection is idle)."""

    async def respond(head: bytes, _n: int) -> bytes:
        return BAD_FIRST_READ if head.startswith(b"GET /bad ") else OK

    async with raw_upstream(respond) as (url, _, _c), \
            running_proxy(url) as (proxy, purl, _r):
        # aiohttp's path: the pool is empty, so the request is not served directly
        (first,) = await exchange(purl, [get("/bad")])
        assert proxy.direct_starts == 0
        assert first[0] == 502
        assert "malformed response" in proxy_error(first)
        assert "negative size" in proxy_error(first)
        # the direct path: /ok leaves an idle upstream connection in the pool
        got = await exchange(purl, [get("/ok"), get("/bad"), get("/ok")])
        assert proxy.direct_starts >= 1
        assert [r[0] for r in got] == [200, 502, 200]
        assert "malformed response" in proxy_error(got[1])
        # (the client's connection stayed usable after the 502: /e was answered on it)


async def test_content_length_and_transfer_encoding_together_do_not_reuse_the_connection(
) -> None:
    async def respond(_head: bytes, n: int) -> bytes:
        if n == 1:
            return (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
        return OK

    async with raw_upstream(respond) as (url, _, conns), running_proxy(url) as (_, purl, _r):
        got = await exchange(purl, [get("/a"), get("/b")])
        await asyncio.sleep(0.05)
    assert [(s, b) for s, _, b in got] == [(200, b"ok"), (200, b"ok")]
    assert "content-length" not in got[0][1]
    assert len(conns) == 2  # the second request went on a fresh upstream connection


@pytest.mark.parametrize("target", ["example.com:443", "/x"])
async def test_connect_is_refused_and_never_sent_upstream(target: str) -> None:
    async def respond(head: bytes, _n: int) -> bytes:
        if head.startswith(b"CONNECT"):
            return b"HTTP/1.1 200 Connection established\r\n\r\n"
        return OK

    connect = f"CONNECT {target} HTTP/1.1\r\nHost: example.com:443\r\n\r\n".encode()
    async with raw_upstream(respond) as (url, heads, _c), \
            running_proxy(url) as (_, purl, _r):
        # prime the pool so that the direct path could take the CONNECT
        await exchange(purl, [get("/prime"), get("/prime")])
        (resp,) = await exchange(purl, [connect])
    assert resp[0] == 501
    assert proxy_error(resp) == "llmtop: a reverse proxy: CONNECT tunnels are not opened"
    assert not any(h.startswith(b"CONNECT") for h in heads)


@pytest.mark.parametrize(
    ("request_bytes", "why"),
    [
        (b"GE(T /x HTTP/1.1\r\nHost: x\r\n\r\n", "Invalid method"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
         b"\r\nzz\r\nabc\r\n0\r\n\r\n", "chunk size"),
        (b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n"
         b"\r\n0\r\n\r\n", "Content-Length"),
        (b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10000 + b"\r\n\r\n", "8190"),
    ],
)
async def test_malformed_client_request_gets_a_json_400(request_bytes: bytes, why: str
                                                         ) -> None:
    async def respond(_head: bytes, _n: int) -> bytes:
        return OK

    async with raw_upstream(respond) as (url, heads, _c), \
            running_proxy(url) as (_, purl, _r):
        (resp,) = await exchange(purl, [request_bytes])
        assert resp[0] == 400
        message = proxy_error(resp)
        assert message.startswith("llmtop: bad request: ") and why in message
        assert json.loads(resp[2])["error"]["code"] == "bad_request"
        assert (await exchange(purl, [get("/x")]))[0][0] == 200  # still serving
    assert len(heads) == 1  # only the good request went upstream


async def test_upstream_101_to_a_request_without_upgrade_is_502_at_once() -> None:
    """An upstream switching protocols although llmtop never asks it to: a 502 at once,
    not a wait for a head in the bytes of the other protocol (up to first_byte_s)."""

    async def respond(_head: bytes, _n: int) -> bytes:
        return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\n\r\n\x81\x05hello")  # and the connection stays open

    async with raw_upstream(respond) as (url, _, _c), \
            running_proxy(url, timeouts__first_byte_s=30) as (_, purl, _r):
        (resp,) = await exchange(purl, [get("/x")], wait_s=5)
    assert resp[0] == 502
    assert "101 Switching Protocols" in proxy_error(resp)


async def test_http09_request_line_gets_505_in_http10() -> None:
    async def respond(_head: bytes, _n: int) -> bytes:
        return OK

    async with raw_upstream(respond) as (url, heads, _c), \
            running_proxy(url) as (_, purl, _r):
        host, port = purl.removeprefix("http://").split(":")
        r, w = await asyncio.open_connection(host, int(port))
        w.write(b"GET /v1/models\r\n\r\n")
        async with asyncio.timeout(2):
            raw = await r.read()
        w.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 505 ")
    assert json.loads(body)["error"]["code"] == "http_version_not_supported"
    assert heads == []


async def test_options_asterisk_goes_upstream_without_the_path_prefix() -> None:
    async def respond(_head: bytes, _n: int) -> bytes:
        return OK

    async with raw_upstream(respond) as (url, heads, _c), \
            running_proxy(url + "/v1") as (_, purl, _r):
        got = await exchange(purl, [b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", get("/models")])
    assert [r[0] for r in got] == [200, 200]
    assert heads[0].startswith(b"OPTIONS * HTTP/1.1\r\n")
    assert heads[1].startswith(b"GET /v1/models HTTP/1.1\r\n")


async def test_h2c_upgrade_offer_is_ignored_and_the_request_served_in_http11() -> None:
    """``curl --http2 http://…`` offers h2c on every request; the engine ignores the offer
    and answers in HTTP/1.1, and so must the proxy (it answered 501)."""

    async def respond(_head: bytes, _n: int) -> bytes:
        return OK

    h2c = (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
           b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n")
    async with raw_upstream(respond) as (url, heads, _c), \
            running_proxy(url) as (_, purl, _r):
        got = await exchange(purl, [h2c, get("/after")])
        ws = await exchange(purl, [b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                                   b"Upgrade: websocket\r\n\r\n"])
    assert [(s, b) for s, _, b in got] == [(200, b"ok"), (200, b"ok")]
    assert heads[0] == (b"GET /v1/models HTTP/1.1\r\nHost: " + url.removeprefix("http://")
                        .encode() + b"\r\n\r\n")  # no Upgrade, Connection or HTTP2-Settings
    assert heads[1].startswith(b"GET /after ")
    assert ws[0][0] == 501  # a WebSocket upgrade is still refused, plainly


@pytest.mark.parametrize("method", ["HEAD", "DELETE"])
async def test_bytes_after_a_bodiless_response_do_not_reuse_the_connection(method: str
                                                                           ) -> None:
    """A 204 (or an answer to HEAD) with body bytes anyway: the connection is out of step
    (the rest of that body could arrive as the head of the next request's response)."""

    async def respond(head: bytes, _n: int) -> bytes:
        if head.startswith(b"GET "):
            return OK
        status = b"204 No Content" if method == "DELETE" else b"200 OK"
        return b"HTTP/1.1 " + status + b"\r\nContent-Length: 5\r\n\r\nhello"

    async with raw_upstream(respond) as (url, _, conns), \
            running_proxy(url) as (_, purl, _r):
        first = f"{method} /a HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        host, port = purl.removeprefix("http://").split(":")
        r, w = await asyncio.open_connection(host, int(port))
        w.write(first)
        async with asyncio.timeout(2):
            head = await r.readuntil(b"\r\n\r\n")
        w.close()
        await asyncio.sleep(0.05)
        (second,) = await exchange(purl, [get("/b")])
    assert head.split(b" ")[1] in (b"200", b"204")
    assert second[0] == 200 and second[2] == b"ok"
    assert len(conns) == 2


@pytest.mark.parametrize(
    ("te", "body"),
    [
        (b"gzip", b"\x1f\x8b\x08\x00junk"),  # until close
        (b"gzip, chunked", b"4\r\n\x1f\x8b\x08\x00\r\n0\r\n\r\n"),
        (b"chunked, chunked", b"2\r\nok\r\n0\r\n\r\n"),
    ],
)
async def test_transfer_coding_other_than_chunked_is_502_not_relayed_as_the_body(
        te: bytes, body: bytes) -> None:
    """A transfer coding the proxy does not decode (RFC 9112 7: hop-by-hop, so it cannot
    be passed on without the header a client would need) is refused as nginx refuses it;
    the coded bytes went to the client as the body itself."""

    async def respond(head: bytes, _n: int) -> bytes:
        if head.startswith(b"GET /te "):
            return (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: "
                    + te + b"\r\nConnection: close\r\n\r\n" + body)
        return OK

    async with raw_upstream(respond) as (url, _, _c), running_proxy(url) as (_, purl, _r):
        got = await exchange(purl, [get("/te"), get("/ok")])
    assert got[0][0] == 502
    assert "Transfer-Encoding" in proxy_error(got[0]) and "only chunked" in proxy_error(got[0])
    assert (got[1][0], got[1][2]) == (200, b"ok")  # the proxy still serves


async def test_transfer_encoding_on_a_bodiless_response_is_harmless() -> None:
    async def respond(_head: bytes, _n: int) -> bytes:
        return b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: gzip\r\n\r\n"

    async with raw_upstream(respond) as (url, _, _c), running_proxy(url) as (_, purl, _r):
        (resp,) = await exchange(purl, [get("/x")])
    assert resp[0] == 204


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\n\nok",  # CRLF lines, then a bare LF end
])
async def test_upstream_head_with_bare_lf_line_ends_is_502_at_once(head: bytes) -> None:
    """A head whose lines end in bare LF was never found (this reader takes CRLF only):
    the client waited first_byte_s for a 504, for a head that had come whole."""

    async def respond(_head: bytes, _n: int) -> bytes:
        return head  # and the connection stays open

    async with raw_upstream(respond) as (url, _, _c), \
            running_proxy(url, timeouts__first_byte_s=30) as (_, purl, _r):
        (resp,) = await exchange(purl, [get("/x")], wait_s=5)
        assert (await exchange(purl, [get("/y")], wait_s=5))[0][0] == 502  # still serving
    assert resp[0] == 502
    assert "bare LF line ends" in proxy_error(resp)
