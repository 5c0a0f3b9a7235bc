"""A strict, minimal reading of one whole HTTP/1.x request in one network read.

The proxy serves such a request itself (:mod:`llmtop.proxy.direct`): it goes upstream from
the very callback that read it, and aiohttp's parser, request objects and handler task
never see it (on an idle machine with cold caches that parse alone takes a quarter of a
millisecond). It needs only the method, the target, the headers, the body and whether
the connection stays open, and only for the plain case: one read that holds exactly one
request — request line, headers, blank line and a body of exactly ``Content-Length``
bytes (or none) — and nothing unusual. Anything else returns None and goes to aiohttp;
so does anything this reading might see differently from aiohttp's parser (the protocol
also checks, on every read aiohttp parses, that both read it alike before it lets the next
read bypass aiohttp):

* lines end with CRLF only; no obsolete line folding; no control bytes in values;
* method and header names are RFC 9110 tokens; the target is origin-form (one leading
  ``/``) without spaces, control bytes, percent-escapes, dot segments or ``#`` (so the
  path is the target up to ``?`` with nothing to decode or normalise);
* ``HTTP/1.1`` or ``HTTP/1.0``; at most one ``Content-Length``, all digits; no
  ``Transfer-Encoding``, ``Expect`` or ``Upgrade``;
* within aiohttp's limits: no line longer than 8190 bytes, at most 128 fields;
* a method of the usual few (aiohttp's parser refuses methods it does not know, ``G&T``
  or ``FOO``, which are tokens all the same), each field aiohttp takes only once
  (``Host``, ``Content-Type``, ``User-Agent``, … its ``SINGLETON_HEADERS``) at most once,
  and ``Host`` in an HTTP/1.1 request (desync checks: this reading forwarded such requests
  that aiohttp's path answered 400 — the same bytes read two ways, by which path they
  happened to take).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp.http_parser import SINGLETON_HEADERS
from multidict import CIMultiDict

_T = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_HEAD = re.compile(
    rb"(?:GET|POST|PUT|PATCH|DELETE|OPTIONS|HEAD)"  # methods any parser knows
    rb" /[!\"$-~]* HTTP/1\.[01]"  # request line: origin-form target, no blanks, controls
    # or "#" (aiohttp's path reads the path up to a fragment: POST /v1/chat/completions#x
    # was measured as OpenAI cold and as "other" served directly)
    rb"(?:\r\n" + _T + rb":[\t\x20-\x7e\x80-\xff]*)*"  # fields: token, values w/o controls
)
"""A whole request head (less its blank line) of the plain kind: CRLF line ends only (a
bare CR or LF is a control byte, allowed nowhere), no line folding (a field line starts
with a token)."""
_NOT_HERE = frozenset({b"transfer-encoding", b"expect", b"upgrade"})
_ONCE = frozenset(h.encode() for h in SINGLETON_HEADERS)
"""Fields that aiohttp's parser refuses to see twice in a request (lower-case)."""
MAX_HEAD = 16384
"""A longer head is left to aiohttp."""
MAX_LINE = 8190
"""aiohttp's parser refuses (400) a target, or a field's name and value together, longer
than this (its ``max_line_size`` and ``max_field_size``; the proxy's server passes them)."""
MAX_FIELDS = 128
"""…and a head of more fields than this (its ``max_headers``)."""


@dataclass(frozen=True, slots=True)
class QuickRequest:
    """One request read whole: what serving it directly needs."""

    method: str
    target: str
    """As sent: path and query, still encoded."""
    path: str
    """The target up to ``?``."""
    version: tuple[int, int]
    raw_headers: tuple[tuple[bytes, bytes], ...]
    """Names and values as sent (values without surrounding blanks), in order."""
    has_length: bool
    """A ``Content-Length`` was sent."""
    body: bytes
    keep_alive: bool
    """The connection may carry another request after this one (HTTP/1.1 unless
    ``Connection: close``; HTTP/1.0 only with ``Connection: keep-alive``; ``close`` wins
    over ``keep-alive`` in either: RFC 9112 9.3, 9.6)."""

    def headers(self, only: frozenset[bytes] | None = None) -> CIMultiDict[str]:
        """The headers as text, by case-insensitive name (built on demand: the request
        goes upstream without it); ``only``: just those of these lower-case names."""
        return CIMultiDict((n.decode("latin-1"), v.decode("utf-8", "surrogateescape"))
                           for n, v in self.raw_headers
                           if only is None or n.lower() in only)


def asks_close(values: Iterable[str]) -> bool:
    """Whether ``Connection`` fields with these values list ``close`` (any case, among
    any other tokens)."""
    return any(t.strip(" \t").lower() == "close" for v in values for t in v.split(","))


def read_request(data: bytes) -> QuickRequest | None:
    """``data`` as exactly one plain request, or None (see the module docstring)."""
    end = data.find(b"\r\n\r\n", 0, MAX_HEAD)
    if end < 0:
        return None
    head = data[:end]
    if _HEAD.fullmatch(head) is None:
        return None
    lines = head.split(b"\r\n")
    if len(lines) > MAX_FIELDS + 1 or (end > MAX_LINE and max(map(len, lines)) > MAX_LINE):
        # over aiohttp's limits (a line longer than MAX_LINE holds a target or a field
        # that may be): its parser answers 400, whichever way the bytes came (desync
        # checks: with an upstream connection idle, a 10,000-byte field or 200 fields
        # in one read were served directly, and the same request on a cold pool got 400)
        return None
    method, target, version = lines[0].split(b" ")
    if b"%" in target or b"/." in target.partition(b"?")[0] or target.startswith(b"//"):
        return None
    raw: list[tuple[bytes, bytes]] = []
    length: int | None = None
    connection = b""
    not_here, once = _NOT_HERE, _ONCE
    seen: set[bytes] = set()
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        low = name.lower()
        if low in not_here:
            return None
        if low in once:
            if low in seen:
                return None
            seen.add(low)
        value = value.strip(b" \t")
        if low == b"content-length":
            if length is not None or not value.isdigit():
                return None
            length = int(value)
        elif low == b"connection":
            connection += b"," + value.lower()
        raw.append((name, value))
    start = end + 4
    if len(data) != start + (length or 0):
        return None  # a body still to come, or a second request behind this one
    http11 = version == b"HTTP/1.1"
    if http11 and b"host" not in seen:
        return None  # (aiohttp answers 400)
    text_target = target.decode("utf-8", "surrogateescape")
    tokens = {t.strip(b" \t") for t in connection.split(b",")}
    return QuickRequest(
        method=method.decode("ascii"),
        target=text_target,
        path=text_target.partition("?")[0],
        version=(1, 1) if http11 else (1, 0),
        raw_headers=tuple(raw),
        has_length=length is not None,
        body=data[start:],
        keep_alive=b"close" not in tokens and (http11 or b"keep-alive" in tokens),
    )
