"""The upstream's response head (status line and headers, parsed once per response) and
the errors an exchange with the upstream can end in. Used by :mod:`llmtop.proxy.upstream`.
"""

from __future__ import annotations

import re
from typing import Final

from llmtop.proxy.dialects._common import upstream_id_text

_NO_BODY_STATUS: Final = frozenset({204, 304})


class UpstreamError(Exception):
    """The upstream could not be reached or did not answer properly."""


class ConnectFailed(UpstreamError):
    """Connecting failed (refused, unreachable, DNS, TLS); ``os_error`` says why."""

    def __init__(self, message: str, os_error: OSError | None = None) -> None:
        super().__init__(message)
        self.os_error = os_error


class ConnectTimeout(UpstreamError):
    """Connecting took longer than the connect timeout."""


class UpstreamClosed(UpstreamError):
    """The connection closed or broke before the response was complete.

    ``retryable``: nothing of a response had arrived on a reused keep-alive connection —
    the upstream closed it while idle, so sending again on a fresh one is safe.
    """

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class MalformedResponse(UpstreamError):
    """The response was not valid HTTP/1.x."""


class ResponseHead:
    """Status line and headers of one response, and how its body is framed.

    ``headers`` are the fields as received — name and value bytes, the value without the
    whitespace around it, obsolete line folding joined with one space — so the proxy
    passes them on without decoding and re-encoding them."""

    __slots__ = ("chunked", "content_encoding", "content_type", "headers", "keep_alive",
                 "length", "no_body", "reason", "request_id", "status")

    def __init__(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]],
                 length: int | None, chunked: bool, no_body: bool, keep_alive: bool,
                 content_type: str = "", content_encoding: str = "",
                 request_id: str | None = None) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.length = length
        """Content-Length when the body is framed by it."""
        self.chunked = chunked
        self.no_body = no_body
        """HEAD request, 204 or 304: nothing follows the headers."""
        self.keep_alive = keep_alive
        self.content_type = content_type
        """The first Content-Type ("" when none)."""
        self.content_encoding = content_encoding
        """The first Content-Encoding ("" when none)."""
        self.request_id = request_id
        """The first non-empty ``X-Request-Id`` (any case) as text
        (``_common.upstream_id_text``: at most 128 characters), else None: the engine's own
        id of the request (vLLM with ``--enable-request-id-headers``, OpenAI), which the
        record's ``upstream_id`` prefers to the id the body names."""


_FRAMING: Final = frozenset({b"content-length", b"transfer-encoding", b"connection",
                             b"content-type", b"content-encoding", b"x-request-id"})
"""The fields :func:`parse_head` reads: those that frame the body, and those of the others
it passes on that the proxy uses (the media type, the coding, the engine's request id)."""
_SPACE: Final = b" \t\x0b\x0c"
_FOLD: Final = b" \t"
_VALUE: Final = rb"[\t\x20-\x7e\x80-\xff]*"
_HEAD_OK: Final = re.compile(
    rb"(?: " + _VALUE + rb")?"  # after the status code: the reason phrase
    rb"(?:\r\n(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:|[ \t])" + _VALUE + rb")*")
"""A response head whose reason phrase and field lines hold no control bytes (NUL, DEL, …)
and whose field names are RFC 9110 tokens: one C-speed match per response. A field that
breaks it would reach the client as the upstream wrote it (QA: ``X-A: a\x00b`` and
``X A: b`` were relayed verbatim), and a client or a proxy behind llmtop may read such a
head differently from llmtop (response splitting)."""


def parse_head(raw: bytes, head_request: bool) -> ResponseHead:
    """The head of a response (``raw``: up to, not including, the blank line after the
    headers); ``head_request``: the request was HEAD (no body follows). Raises
    MalformedResponse."""
    lines = raw.split(b"\r\n")
    status_line = lines[0]
    version, _, rest = status_line.partition(b" ")
    code, _, reason = rest.partition(b" ")
    if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise MalformedResponse(f"bad status line {status_line[:60]!r}")
    status = int(code)
    if status < 100:  # (QA: "099" went to the client as "HTTP/1.1 99")
        raise MalformedResponse(f"bad status line {status_line[:60]!r}")
    headers: list[tuple[bytes, bytes]] = []
    length: int | None = None
    chunked = False
    conn_close = version == b"HTTP/1.0"
    close_listed = False
    ctype = encoding = None
    request_id: str | None = None
    folded = False
    te_seen = False
    codings: list[bytes] = []
    if raw.count(b"\n") != len(lines) - 1 or raw.count(b"\r") != len(lines) - 1:
        # a bare CR or LF: a client would read it as a line end (header injection)
        raise MalformedResponse("bare CR or LF in the response head")
    if _HEAD_OK.fullmatch(raw, len(version) + 4) is None:
        raise MalformedResponse(_bad_line(lines))
    for i in range(1, len(lines)):
        line = lines[i]
        if not line:
            continue
        if line[0] in _FOLD and headers:  # obsolete line folding
            name, value = headers[-1]
            headers[-1] = (name, value + b" " + line.strip())
            folded = True
            continue
        name, sep, value = line.partition(b":")
        if not sep or not name or name[0] in _SPACE or name[-1] in _SPACE:
            raise MalformedResponse(f"bad header line {line[:60]!r}")
        value = value.strip()
        headers.append((name, value))
        low = name.lower()
        if low not in _FRAMING:
            continue
        if low == b"content-length":
            if not value.isdigit():
                raise MalformedResponse(f"bad Content-Length {value[:30]!r}")
            n = int(value)
            if length is not None and length != n:
                raise MalformedResponse("conflicting Content-Length headers")
            length = n
        elif low == b"transfer-encoding":
            codings.extend(c.strip().lower() for c in value.split(b",") if c.strip())
            te_seen = True
        elif low == b"connection":
            tokens = {t.strip().lower() for t in value.split(b",")}
            if b"close" in tokens:
                conn_close = close_listed = True
            elif b"keep-alive" in tokens and version == b"HTTP/1.0" and not close_listed:
                # (close wins over keep-alive in any field: RFC 9112 9.3, 9.6)
                conn_close = False
        elif low == b"content-type":
            if ctype is None:
                ctype = value.decode("latin-1")
        elif low == b"x-request-id":
            if request_id is None:
                request_id = upstream_id_text(value[:512].decode("utf-8", "replace"))
        elif encoding is None:
            encoding = value.decode("latin-1")
    if folded:  # the values as folded
        ctype = encoding = request_id = None
        for name, value in headers:
            low = name.lower()
            if low == b"content-type" and ctype is None:
                ctype = value.decode("latin-1")
            elif low == b"content-encoding" and encoding is None:
                encoding = value.decode("latin-1")
            elif low == b"x-request-id" and request_id is None:
                request_id = upstream_id_text(value[:512].decode("utf-8", "replace"))
    no_body = head_request or status in _NO_BODY_STATUS or 100 <= status < 200
    if status == 204 and (te_seen or length):
        # a 204 announcing a body (RFC 9110 15.3.5: it has none, and RFC 9112 6.1/6.2: it
        # sends neither field): the upstream may send that body after the head, where
        # the next request's response would be read — the connection is not used again
        # (desync checks: "204 ... Content-Length: 6" with its 6 bytes written late
        # reached the next client, another tenant, as the start of its response)
        conn_close = True
    if te_seen:
        if version == b"HTTP/1.0":
            # RFC 9112 6.1: framing faulty, close after it — an HTTP/1.0 server knows no
            # transfer codings, and may mean a body that ends when the connection does
            # (desync checks: "HTTP/1.0 ... Connection: keep-alive ... chunked" was
            # pooled again, its late bytes reaching the next client)
            conn_close = True
        chunked = codings == [b"chunked"]
        if not chunked and not no_body:
            # a transfer coding other than chunked (gzip, compress, deflate, or chunked
            # twice): its bytes would reach the client as the body itself, undecoded and
            # unframed — refused, as nginx does (QA: "gzip" went through as plain bytes)
            shown = b", ".join(codings).decode("latin-1")[:60]
            raise MalformedResponse(f"unsupported Transfer-Encoding {shown!r} "
                                    "(only chunked is relayed)")
        # Transfer-Encoding overrides Content-Length (RFC 9112 6.3: a body of unknown
        # length when its last coding is not chunked); both at once may be a smuggling
        # attempt, so the connection is not used again (QA: it went back to the pool)
        if length is not None:
            conn_close = True
        length = None
    return ResponseHead(status, reason, headers, length, chunked and not no_body, no_body,
                        not conn_close, ctype or "", encoding or "", request_id)


def _bad_line(lines: list[bytes]) -> str:
    """What :data:`_HEAD_OK` refused, for the error (only called for a head it refused)."""
    for i, line in enumerate(lines):
        if i == 0:
            what = "status line"
        elif line[:1] in (b" ", b"\t"):
            what = "folded header line"
        else:
            what = "header line"
            name = line.partition(b":")[0]
            if not re.fullmatch(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", name):
                return f"bad header name {name[:60]!r}"
        if re.search(rb"[\x00-\x08\x0a-\x1f\x7f]", line):
            return f"control byte in the {what} {line[:60]!r}"
    return "malformed response head"
