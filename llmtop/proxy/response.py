"""The relayed response's head, written by the proxy itself.

aiohttp's ``StreamResponse`` spends about a hundred Python calls on every response (a
header multidict, ``prepare`` and ``write_eof`` coroutines, its writer's bookkeeping, a
write of the head on its own and one of the end of the body on its own) — a third of the
proxy's per-request work at 32 tokens a request. For a relayed response the proxy knows
everything at once, so :func:`response_head` makes the status line and headers in one
join, the relay writes them to the client's transport (together with the first body bytes
when those came with the upstream's head, else at once on their own) and ends the body
itself (the last chunk and the chunked terminator in one write when the upstream's end
came with its last bytes). :class:`SentResponse` then tells aiohttp's server loop that the
response is complete and whether the connection stays open.

The head is what aiohttp would have written: the upstream's headers less hop-by-hop fields
(:func:`llmtop.proxy.headers.client_response_headers`), ``Content-Length`` when the body
passes unchanged (and the upstream's on a HEAD or 304 answer), else ``Transfer-Encoding:
chunked`` (HTTP/1.1); ``X-Accel-Buffering: no`` on streams, ``Date`` and ``Server``, each
when the upstream sent none, and ``Connection`` as the client's keep-alive asks. Two
differences: an HTTP/1.0 client whose response has no length gets it delimited by closing
the connection (aiohttp kept such a connection open, so the client could not tell where
the body ended); and a body the upstream sent without ``Content-Type`` goes on without one
(aiohttp adds ``application/octet-stream``, which the upstream never said: RFC 9110 8.3
leaves an untyped body to the recipient, to sniff or not).
"""

from __future__ import annotations

from http import HTTPStatus

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE

from llmtop.proxy.headers import RESPONSE_DROP, client_response_headers

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_NO_BODY_STATUS = frozenset({204, 304})
_SERVER = f"Server: {SERVER_SOFTWARE}".encode()
_SEEN = {b"x-accel-buffering": 1, b"date": 2, b"server": 4}
"""Fields the proxy adds when the upstream sent none (bits of ``seen``)."""


class ResponseFrame:
    """How the relayed body is framed for the client, and whether the connection stays."""

    __slots__ = ("chunked", "head", "keep_alive")

    def __init__(self, head: bytes, chunked: bool, keep_alive: bool) -> None:
        self.head = head
        """Status line and headers, up to and including the blank line."""
        self.chunked = chunked
        """The body goes out in HTTP/1.1 chunks (and ends with ``0\\r\\n\\r\\n``)."""
        self.keep_alive = keep_alive


def response_head(
    version: tuple[int, int],
    method: str,
    status: int,
    reason: bytes,
    headers: list[tuple[bytes, bytes]],
    *,
    length: int | None,
    stream: bool,
    keep_alive: bool,
) -> ResponseFrame:
    """The head of the response to the client (see the module docstring).

    ``version`` is the client's HTTP version, ``headers`` the upstream's response headers
    (name and value bytes), ``length`` the body's length when it passes unchanged and the
    upstream framed it by ``Content-Length``, ``stream`` whether the response is a stream,
    ``keep_alive`` whether the client's request allows another one on its connection.
    """
    no_length = (status in _NO_BODY_STATUS or 100 <= status < 200
                 or (method == "CONNECT" and 200 <= status < 300))
    empty = no_length or method == "HEAD"
    lines = [b"HTTP/%d.%d %d %s" % (version[0], version[1], status,
                                    reason or _REASONS.get(status, b""))]
    seen = 0
    for name, value in headers:
        low = name.lower()
        if low in RESPONSE_DROP or low.startswith(b"proxy-"):
            if low == b"connection":  # it may name more fields to drop: the careful way
                del lines[1:]
                seen = 0
                for name, value in client_response_headers(headers):
                    low = name.lower()
                    if low in _SEEN:
                        seen |= _SEEN[low]
                    lines.append(name + b": " + value)
                break
            continue
        if low in _SEEN:
            seen |= _SEEN[low]
        lines.append(name + b": " + value)
    chunked = False
    if length is not None and (not no_length or status == 304):
        # (a 304 may carry the length of the 200 it stands for, RFC 9110 8.6, as a HEAD
        # answer does; 1xx and 204 never carry one)
        lines.append(b"Content-Length: %d" % length)
    if stream and not seen & 1:  # (sse-starlette sends it on every stream itself)
        lines.append(b"X-Accel-Buffering: no")
    if not empty and length is None:
        if version >= (1, 1):
            chunked = True
            lines.append(b"Transfer-Encoding: chunked")
        else:
            keep_alive = False  # the end of the body is the end of the connection
    if not seen & 2:
        lines.append(b"Date: " + rfc822_formatted_time().encode())
    if not seen & 4:
        lines.append(_SERVER)
    if keep_alive:
        if version == (1, 0):
            lines.append(b"Connection: keep-alive")
    elif version == (1, 1):
        lines.append(b"Connection: close")
    lines.append(b"\r\n")
    return ResponseFrame(b"\r\n".join(lines), chunked, keep_alive)


class SentResponse(web.StreamResponse):
    """Stands, for aiohttp's server loop, for a response the relay wrote to the transport
    itself: preparing and ending it do nothing; ``keep_alive`` says whether the connection
    carries another request. Nothing about it is per request, so two instances serve all
    (:func:`sent_response`); ``keep_alive`` is fixed (``force_close`` does not change it)."""

    def __init__(self, keep_alive: bool) -> None:
        super().__init__()
        self._keep = keep_alive

    @property
    def keep_alive(self) -> bool:
        return self._keep

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        return None


_KEEP_ALIVE = SentResponse(True)
_CLOSE = SentResponse(False)


def sent_response(keep_alive: bool) -> SentResponse:
    """The response to hand aiohttp once the relay has written everything itself."""
    return _KEEP_ALIVE if keep_alive else _CLOSE
