"""Request smuggling (desync) through the proxy, client side: the classic shapes, sent
over real sockets on the direct path (a whole plain request in one read, with a pooled
upstream connection idle) and on aiohttp's path (the same bytes split across reads, or
after a first request on the connection), checked against an upstream that frames what it
receives strictly and keeps every byte (:mod:`desync_support`).

A case is safe when either the proxy refuses it (4xx/5xx of its own, connection closed)
or the upstream receives exactly one request per answer the client got from it, each
framed unambiguously; and in both cases an innocent request from another client over the
pooled upstream connection then arrives alone and gets its own answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from desync_support import (
    Exchanged,
    RecordingUpstream,
    exchange,
    read_responses,
    recording_upstream,
)
from rel_support import Proxy, running_proxy

CHAT = b"/v1/chat/completions"
BODY = b'{"model":"m"}'
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
INNOCENT_BODY = b'{"model":"innocent"}'
INNOCENT = (b"POST /v1/innocent HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(INNOCENT_BODY), INNOCENT_BODY))
FIRST = (b"POST /v1/first HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
         % (len(BODY), BODY))
SLOW_FIRST = FIRST.replace(b"/v1/first", b"/slow/first")


def post(extra: bytes = b"", body: bytes = BODY, *, method: bytes = b"POST",
         target: bytes = CHAT, length: bool = True, version: bytes = b"HTTP/1.1") -> bytes:
    head = (method + b" " + target + b" " + version
            + b"\r\nHost: x\r\nContent-Type: application/json\r\n")
    if length:
        head += b"Content-Length: %d\r\n" % len(body)
    return head + extra + b"\r\n" + body


def chunked(chunks: bytes = b"5\r\nhello\r\n0\r\n\r\n", te: bytes = b"chunked",
            extra: bytes = b"", version: bytes = b"HTTP/1.1") -> bytes:
    return (b"POST " + CHAT + b" " + version + b"\r\nHost: x\r\n" + extra
            + b"Transfer-Encoding: " + te + b"\r\n\r\n" + chunks)


@dataclass(frozen=True)
class Case:
    data: bytes
    statuses: tuple[int, ...]
    """What the client gets (200: the upstream's answer; other: the proxy's refusal)."""
    bodies: tuple[bytes, ...] = ()
    """The bodies the upstream must receive, in order (for the 200s)."""
    eof: bool = False
    """The client stops sending after ``data`` (a body that never ends)."""
    closes: bool = False
    """The proxy closes the connection after the answers."""


REFUSED = (400,)
CASES: dict[str, Case] = {
    # both framing headers
    "CL.TE": Case(b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nG", REFUSED),
    "TE.CL": Case(b"POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                  b"Content-Length: 4\r\n\r\n5c\r\n" + SMUGGLED + b"\r\n0\r\n\r\n", REFUSED),
    "CL.TE in HTTP/1.0": Case(b"POST /v1/x HTTP/1.0\r\nHost: x\r\nContent-Length: 6\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nG", REFUSED),
    # Content-Length variants
    "two equal Content-Length": Case(post(b"Content-Length: 13\r\n"), REFUSED),
    "two different Content-Length": Case(post(b"Content-Length: 5\r\n"), REFUSED),
    "Content-Length +13": Case(post(b"Content-Length: +13\r\n", length=False), REFUSED),
    "Content-Length 13,13": Case(post(b"Content-Length: 13,13\r\n", length=False), REFUSED),
    "Content-Length -1": Case(post(b"Content-Length: -1\r\n", length=False), REFUSED),
    "Content-Length 0x0d": Case(post(b"Content-Length: 0x0d\r\n", length=False), REFUSED),
    "Content-Length overflow": Case(
        post(b"Content-Length: 99999999999999999999999\r\n", length=False), REFUSED),
    "Content-Length empty": Case(post(b"Content-Length: \r\n", length=False), REFUSED),
    "space before colon": Case(post(b"Content-Length : 5\r\n"), REFUSED),
    # (optional whitespace around a value is the value)
    "Content-Length with blanks": Case(post(b"Content-Length:  13 \r\n", length=False),
                                       (200,), (BODY,)),
    # Transfer-Encoding variants
    "TE xchunked": Case(chunked(te=b"xchunked"), REFUSED),
    "TE chunked, identity": Case(chunked(te=b"chunked, identity"), REFUSED),
    "TE chunked twice in one field": Case(chunked(te=b"chunked, chunked"), REFUSED),
    "two TE fields": Case(chunked(extra=b"Transfer-Encoding: chunked\r\n"), REFUSED),
    "two TE fields, identity": Case(chunked(extra=b"Transfer-Encoding: identity\r\n"),
                                    REFUSED),
    "TE empty": Case(chunked(te=b""), REFUSED),
    "TE folded": Case(chunked(te=b"\r\n chunked"), REFUSED),
    "TE name with a space": Case(chunked().replace(b"Encoding:", b"Encoding :"), REFUSED),
    "TE gzip, chunked": Case(chunked(te=b"gzip, chunked"), (501,)),
    "TE identity, chunked": Case(chunked(te=b"identity, chunked"), (501,)),
    "TE in HTTP/1.0": Case(chunked(version=b"HTTP/1.0"), REFUSED),
    "TE in HTTP/1.0, keep-alive": Case(
        chunked(extra=b"Connection: keep-alive\r\n", version=b"HTTP/1.0"), REFUSED),
    "TE Chunked": Case(chunked(te=b"Chunked"), (200,), (b"hello",)),
    "TE with leading blanks": Case(chunked(te=b"  chunked"), (200,), (b"hello",)),
    "TE after a tab": Case(chunked().replace(b": chunked", b":\tchunked"), (200,),
                           (b"hello",)),
    # line ends, folding, control bytes
    "obs-fold": Case(post(b"X-A: a\r\n b\r\n"), REFUSED),
    "bare LF everywhere": Case(post().replace(b"\r\n", b"\n"), REFUSED),
    "one bare LF": Case(post().replace(b"Host: x\r\n", b"Host: x\n"), REFUSED),
    "bare CR": Case(post().replace(b"Host: x\r\n", b"Host: x\r"), REFUSED),
    "CR inside a value": Case(post(b"X-A: a\rb\r\n"), REFUSED),
    "NUL in a value": Case(post(b"X-A: a\x00b\r\n"), REFUSED),
    "control byte in a value": Case(post(b"X-A: a\x01b\r\n"), REFUSED),
    "DEL in a value": Case(post(b"X-A: a\x7fb\r\n"), REFUSED),
    "line starting with a blank": Case(
        post().replace(b"Host: x\r\n", b"Host: x\r\n Content-Length: 0\r\n"), REFUSED),
    # chunked bodies
    "chunk extension": Case(chunked(b"5;a=b\r\nhello\r\n0\r\n\r\n"), (200,), (b"hello",)),
    "chunk size with leading zeros": Case(chunked(b"0005\r\nhello\r\n0\r\n\r\n"), (200,),
                                          (b"hello",)),
    "trailers": Case(chunked(b"5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"), (200,), (b"hello",)),
    "Content-Length as a trailer": Case(
        chunked(b"5\r\nhello\r\n0\r\nContent-Length: 50\r\n\r\n"), REFUSED),
    "chunk extension then bare LF": Case(chunked(b"5;a=b\nhello\r\n0\r\n\r\n"), REFUSED),
    "chunk lines with bare LF": Case(chunked(b"5\nhello\n0\n\n"), REFUSED),
    "chunk size overflow": Case(chunked(b"10000000000000005\r\nhello\r\n0\r\n\r\n"), REFUSED),
    "negative chunk size": Case(chunked(b"-5\r\nhello\r\n0\r\n\r\n"), REFUSED),
    "chunk size 0x5": Case(chunked(b"0x5\r\nhello\r\n0\r\n\r\n"), REFUSED),
    "chunk size with a blank": Case(chunked(b"5 \r\nhello\r\n0\r\n\r\n"), REFUSED),
    "no CRLF after a chunk": Case(chunked(b"5\r\nhelloXX0\r\n\r\n"), REFUSED),
    "no last chunk": Case(chunked(b"5\r\nhello\r\n"), (), eof=True),
    "body shorter than Content-Length": Case(
        post(b"Content-Length: 100\r\n", length=False), (), eof=True),
    # a request inside another's body
    "request in a POST body": Case(post(body=SMUGGLED), (200,), (SMUGGLED,)),
    "request in a GET body": Case(post(method=b"GET", body=SMUGGLED), (200,), (SMUGGLED,)),
    "pipelined pair": Case(post() + post(target=b"/v1/second"), (200, 200), (BODY, BODY)),
    # targets, versions, Host
    "absolute form": Case(post(target=b"http://evil.example:9/v1/x?y"), (200,), (BODY,)),
    "asterisk form": Case(post(method=b"OPTIONS", target=b"*", body=b"", length=False),
                          (200,), (b"",)),
    "space in the target": Case(post(target=b"/v1/a b"), REFUSED),
    "HTTP/1.2": Case(post(version=b"HTTP/1.2"), REFUSED),
    "HTTP/2.0 request line": Case(post(version=b"HTTP/2.0"), (505,)),
    # (read alike on both paths: aiohttp's parser refuses these)
    "two Host fields": Case(post(b"Host: y\r\n"), REFUSED),
    "no Host": Case(post().replace(b"Host: x\r\n", b""), REFUSED),
    "no Host in HTTP/1.0": Case(post(version=b"HTTP/1.0").replace(b"Host: x\r\n", b""),
                                (200,), (BODY,)),
    "two Host fields in HTTP/1.0": Case(post(b"Host: y\r\n", version=b"HTTP/1.0"),
                                        REFUSED),
    "two Content-Type fields": Case(post(b"Content-Type: text/plain\r\n"), REFUSED),
    "two User-Agent fields": Case(post(b"User-Agent: a\r\nUser-Agent: b\r\n"), REFUSED),
    "unknown method token": Case(post(method=b"G&T"), REFUSED),
    "lower-case method": Case(post(method=b"post"), REFUSED),
    "fragment in the target": Case(post(target=b"/v1/x?a=1#frag"), (200,), (BODY,)),
    "empty field value": Case(post(b"X-A:\r\nX-B:   \r\n"), (200,), (BODY,)),
    # hop-by-hop lists naming framing fields
    "Connection: close, Transfer-Encoding": Case(
        chunked(extra=b"Connection: close, Transfer-Encoding\r\n"), (200,), (b"hello",)),
    "Connection: Content-Length": Case(post(b"Connection: Content-Length\r\n"), (200,),
                                       (BODY,)),
    # Upgrade and Expect
    "WebSocket upgrade, then a request": Case(
        post(b"Connection: Upgrade\r\nUpgrade: websocket\r\n", method=b"GET", body=b"",
             length=False) + SMUGGLED, (501,)),
    "CONNECT, then a request": Case(b"CONNECT evil.example:443 HTTP/1.1\r\n"
                                    b"Host: evil.example:443\r\n\r\n" + SMUGGLED, (501,)),
    # (aiohttp's parser drops what follows a declined upgrade in the same read: the
    # connection closes after the answer, so the client knows to send it again)
    "h2c upgrade offer, then a request": Case(
        post(b"Connection: Upgrade\r\nUpgrade: h2c\r\n", method=b"GET", body=b"",
             length=False) + SMUGGLED, (200,), (b"",), closes=True),
    "h2c upgrade offer with a body, then a request": Case(
        post(b"Connection: Upgrade\r\nUpgrade: h2c\r\n") + SMUGGLED, (200,), (BODY,),
        closes=True),
    "h2c upgrade offer": Case(post(b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                                   b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"),
                              (200,), (BODY,)),
    "Expect: 100-continue": Case(post(b"Expect: 100-continue\r\n"), (200,), (BODY,)),
    # sizes
    "very long field line": Case(post(b"X-Long: " + b"a" * 70000 + b"\r\n"), REFUSED),
    "very long target": Case(post(target=b"/v1/" + b"a" * 70000), REFUSED),
}

MODES = ("whole", "split", "after", "pipelined", "held")
"""``whole``: the case in one read on a fresh connection (the direct path when it is plain);
``split``: the same bytes in two reads (aiohttp's path); ``after``: in a later read, after a
first request on the same connection; ``pipelined``: in the same read as a first request;
``held``: in a later read that comes while a first request served directly is still open
(held, then handed on when its response has ended)."""


async def _innocent(proxy: Proxy, up: RecordingUpstream) -> None:
    """Another client's request over the pooled upstream connection arrives alone, in
    full, and gets its own answer."""
    before, conns = up.count, len(up.conns)
    got = await exchange(proxy.port, INNOCENT, expect=1)
    answers, left, clean = read_responses(got.raw)
    assert clean and not left and len(answers) == 1, got
    assert answers[0].status == 200
    news = [r for r in up.requests if r.n > before]
    assert len(news) == 1, news
    (req,) = news
    assert (req.target, req.body, req.framing) == (b"/v1/innocent", INNOCENT_BODY, "length")
    assert answers[0].up == req.n
    assert json.loads(answers[0].body)["conn"] < conns  # a pooled connection, not a new one


def _pieces(case: Case, mode: str) -> tuple[bytes, ...]:
    data = case.data
    if mode == "split":
        cut = data.index(b"\n") + 5  # inside the first field line
        return data[:cut], data[cut:]
    if mode == "after":
        return FIRST, data
    if mode == "pipelined":
        return (FIRST + data,)
    if mode == "held":
        return SLOW_FIRST, data
    return (data,)


@pytest.mark.parametrize("mode", MODES)
async def test_desync_shapes_are_refused_or_forwarded_unambiguously(mode: str) -> None:
    failures: list[str] = []
    async with recording_upstream() as up, running_proxy(up.url) as proxy:
        await exchange(proxy.port, INNOCENT, expect=1)  # a pooled connection, idle
        for name, case in CASES.items():
            try:
                await _check(proxy, up, case, mode)
            except AssertionError as exc:
                failures.append(f"{name}: {exc}".split("\n")[0][:300])
        direct = proxy.server.direct_starts
    assert not failures, "\n".join(failures)
    if mode in ("whole", "after", "held"):  # the plain cases did take the direct path
        assert direct > len(CASES) // 4, direct


async def _check(proxy: Proxy, up: RecordingUpstream, case: Case, mode: str) -> None:
    if mode in ("pipelined", "held") and case.eof:
        return  # (the client's end of input ends the open first request: nothing to see)
    before = up.count
    first = mode in ("after", "pipelined", "held")
    statuses = ((200,) if first else ()) + case.statuses
    bodies = ((BODY,) if first else ()) + case.bodies
    refused = (bool(statuses) and statuses[-1] != 200) or case.closes
    # (after a refusal: read on until the proxy closes the connection)
    got: Exchanged = await exchange(proxy.port, *_pieces(case, mode), eof=case.eof,
                                    expect=None if refused else len(statuses),
                                    read_s=3.0 if case.eof else 5.0)
    answers, left, clean = read_responses(got.raw)
    assert clean and not left, f"badly framed answer {got.raw[-200:]!r}"
    if mode == "pipelined" and answers and answers[0].status == 400:
        # aiohttp's parser refuses a whole read when any request in it is malformed: the
        # first request of the pipeline too, never sent upstream (checked below)
        statuses, bodies = case.statuses, case.bodies
    assert tuple(a.status for a in answers) == statuses, (
        f"statuses {[a.status for a in answers]}, {got.raw[:300]!r}")
    if refused:
        assert got.closed, "the connection stayed open after a refusal"
    assert not up.errors, up.errors
    news = [r for r in up.requests if r.n > before]
    assert tuple(r.body for r in news) == bodies, [(r.target, r.body) for r in news]
    assert [a.up for a in answers if a.status == 200] == [r.n for r in news]
    await _innocent(proxy, up)
