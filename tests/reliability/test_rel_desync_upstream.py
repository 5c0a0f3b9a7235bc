"""Response-side framing from a hostile upstream (desync): responses with both framings,
conflicting lengths, bodies where none may be, bytes after the end, chunk sizes only a
lenient parser reads. The client must get a correctly framed response, and a connection
whose framing cannot be trusted must not carry another client's request: the upstream
here sends a planted response ahead of its answer to the next request on that connection
(what it meant as the rest of the previous one), which a proxy that pooled the connection
again hands to the next client (:mod:`desync_support`).

(What test_rel_upstream_faults.py covers — lengths longer or shorter than the body,
resets, error statuses — is not repeated.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from desync_support import RecordingUpstream, exchange, read_responses, recording_upstream
from rel_support import running_proxy

H = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
POISON = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n\r\nPOISON"
CHUNKED = H + b"Transfer-Encoding: chunked\r\n\r\n"
INNOCENT_BODY = b'{"model":"innocent"}'
INNOCENT = (b"POST /v1/innocent HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(INNOCENT_BODY), INNOCENT_BODY))


@dataclass(frozen=True)
class Hostile:
    answer: bytes
    late: bytes
    """Sent ahead of the next answer on the same connection (see the module docstring)."""
    status: int
    body: bytes | None = b""
    """The body the client gets (None: the proxy's own error, not checked)."""
    reuse: bool = False
    """The response is sound: its connection may (and should) be pooled again."""
    method: bytes = b"POST"


CASES: dict[str, Hostile] = {
    "Content-Length and chunked": Hostile(
        H + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        POISON, 200, b"hello"),
    "chunked and Content-Length": Hostile(
        H + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        POISON, 200, b"hello"),
    "two equal Content-Length": Hostile(
        H + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello", b"", 200, b"hello",
        reuse=True),
    "two different Content-Length": Hostile(
        H + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", POISON, 502, None),
    "Content-Length 5, 5": Hostile(H + b"Content-Length: 5, 5\r\n\r\nhello", POISON, 502, None),
    "204 with a body": Hostile(b"HTTP/1.1 204 No Content\r\n\r\n" + POISON, b"", 204),
    "204 announcing a body that comes late": Hostile(
        b"HTTP/1.1 204 No Content\r\nContent-Length: 6\r\n\r\n", POISON, 204),
    "204 announcing a chunked body": Hostile(
        b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n", POISON, 204),
    "204 with Content-Length: 0": Hostile(
        b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", b"", 204, reuse=True),
    "304 with its Content-Length": Hostile(
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 6\r\n\r\n", b"", 304, reuse=True),
    "304 with a body": Hostile(b"HTTP/1.1 304 Not Modified\r\n\r\n" + POISON, b"", 304),
    "HEAD answered with a body": Hostile(H + b"Content-Length: 6\r\n\r\nPOISON", b"", 200,
                                         method=b"HEAD"),
    "HEAD answered with its length": Hostile(H + b"Content-Length: 6\r\n\r\n", b"", 200,
                                             reuse=True, method=b"HEAD"),
    "Connection: close, then more": Hostile(
        H + b"Connection: close\r\nContent-Length: 5\r\n\r\nhello" + POISON, POISON, 200,
        b"hello"),
    "Connection: close, more later": Hostile(
        H + b"Connection: close\r\nContent-Length: 5\r\n\r\nhello", POISON, 200, b"hello"),
    "bytes after the body": Hostile(H + b"Content-Length: 5\r\n\r\nhello" + POISON, b"",
                                    200, b"hello"),
    "bytes after the last chunk": Hostile(CHUNKED + b"5\r\nhello\r\n0\r\n\r\n" + POISON,
                                          b"", 200, b"hello"),
    # chunk-size is 1*HEXDIG, lines end in CRLF: read leniently, but not pooled again
    "chunk size 0x5": Hostile(CHUNKED + b"0x5\r\nhello\r\n0\r\n\r\n", POISON, 200,
                              b"hello"),
    "chunk size +5": Hostile(CHUNKED + b"+5\r\nhello\r\n0\r\n\r\n", POISON, 200, b"hello"),
    "chunk size 0_5": Hostile(CHUNKED + b"0_5\r\nhello\r\n0\r\n\r\n", POISON, 200,
                              b"hello"),
    "chunk size after a blank": Hostile(CHUNKED + b" 5\r\nhello\r\n0\r\n\r\n", POISON, 200,
                                        b"hello"),
    "chunk lines ending in bare LF": Hostile(CHUNKED + b"5\nhello\r\n0\n\n", POISON, 200,
                                             b"hello"),
    "last chunk line ending in bare LF": Hostile(
        CHUNKED + b"5\r\nhello\r\n0\n\r\n", POISON, 200, b"hello"),
    "HTTP/1.0 keep-alive, chunked": Hostile(
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n", POISON, 200, b"hello"),
    # sound responses: the connection goes on serving
    "Chunked": Hostile(H + b"Transfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
                       b"", 200, b"hello", reuse=True),
    "chunk extension and trailers": Hostile(
        CHUNKED + b"5;a=b\r\nhello\r\n0\r\nX-T: 1\r\n\r\n", b"", 200, b"hello", reuse=True),
    "chunk size with leading zeros": Hostile(CHUNKED + b"005\r\nhello\r\n0\r\n\r\n", b"",
                                             200, b"hello", reuse=True),
    "HTTP/1.0 keep-alive": Hostile(
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\nhello", b"",
        200, b"hello", reuse=True),
    "100 Continue, then the answer": Hostile(
        b"HTTP/1.1 100 Continue\r\n\r\n" + H + b"Content-Length: 5\r\n\r\nhello", b"", 200,
        b"hello", reuse=True),
}


def _names() -> dict[str, tuple[bytes, bytes]]:
    return {f"h{i}": (c.answer, c.late) for i, c in enumerate(CASES.values())}


async def _check(port: int, up: RecordingUpstream, index: int, case: Hostile) -> None:
    await exchange(port, INNOCENT, expect=1)  # a pooled connection, idle
    request = (case.method + b" /hostile/h%d HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
               b"\r\n{}" % index)
    got = await exchange(port, request, expect=1)
    answers, left, clean = read_responses(got.raw, head_request=case.method == b"HEAD")
    assert clean and not left, f"badly framed answer {got.raw[-200:]!r}"
    assert [a.status for a in answers][:1] == [case.status], got.raw
    if case.body is not None:
        assert answers[0].body == case.body
    (hostile,) = [r for r in up.requests if r.target == b"/hostile/h%d" % index]
    used = next(c.index for c in up.conns if hostile in c.requests)
    # another client's request: alone upstream, its own answer back
    before = up.count
    got = await exchange(port, INNOCENT, expect=1)
    answers, left, clean = read_responses(got.raw)
    assert clean and not left and len(answers) == 1, got.raw
    (answer,) = answers
    assert answer.status == 200 and answer.body != b"POISON", got.raw
    news = [r for r in up.requests if r.n > before]
    assert [(r.target, r.body) for r in news] == [(b"/v1/innocent", INNOCENT_BODY)]
    assert answer.up == news[0].n
    reused = json.loads(answer.body)["conn"] == used
    assert reused == case.reuse, "pooled again" if reused else "not pooled again"


@pytest.mark.parametrize("name", list(CASES))
async def test_hostile_response_framing(name: str) -> None:
    index = list(CASES).index(name)
    async with recording_upstream(_names()) as up, running_proxy(up.url) as proxy:
        await _check(proxy.port, up, index, CASES[name])
