"""A strict, minimal reading of one whole HTTP/1.x request in one network read.

The proxy's early start (:mod:`llmtop.proxy.stamping`) sends a request upstream from the
very callback that read it, before aiohttp's parser has built its request objects (on an
idle machine with cold caches that parse alone takes a quarter of a millisecond). It
needs only the method, the target, the headers and the body, and only for the plain case:
one read that holds exactly one request — request line, headers, blank line and a body of
exactly ``Content-Length`` bytes (or none) — and nothing unusual. Anything else returns
None and takes the ordinary path; so does anything this reading might see differently from
aiohttp's parser, which still parses the same bytes right after and is checked against
(a disagreement undoes the early start):

* lines end with CRLF only; no obsolete line folding; no control bytes in values;
* method and header names are RFC 9110 tokens; the target is origin-form (one leading
  ``/``) without spaces, control bytes, percent-escapes or dot segments (so the path is
  the target up to ``?`` with nothing to decode or normalise);
* ``HTTP/1.1`` or ``HTTP/1.0``; at most one ``Content-Length``, all digits; no
  ``Transfer-Encoding``, ``Expect`` or ``Upgrade``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from multidict import CIMultiDict

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"/[!-~]*")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_NOT_HERE = frozenset({b"transfer-encoding", b"expect", b"upgrade"})
MAX_HEAD = 16384
"""A longer head is left to aiohttp (its own limit is 8190 bytes per line)."""


@dataclass(frozen=True, slots=True)
class QuickRequest:
    """One request read whole: what an early start needs."""

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

    def headers(self) -> CIMultiDict[str]:
        """The headers as text, by case-insensitive name (built on demand: the request
        goes upstream without it)."""
        return CIMultiDict((n.decode("latin-1"), v.decode("utf-8", "surrogateescape"))
                           for n, v in self.raw_headers)


def read_request(data: bytes) -> QuickRequest | None:
    """``data`` as exactly one plain request, or None (see the module docstring)."""
    end = data.find(b"\r\n\r\n", 0, MAX_HEAD)
    if end < 0:
        return None
    head = data[:end]
    if head.count(b"\n") != head.count(b"\r\n") or head.count(b"\r") != head.count(b"\r\n"):
        return None  # a bare LF or CR
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        return None
    method, target, version = parts
    if _TOKEN.fullmatch(method) is None or _TARGET.fullmatch(target) is None:
        return None
    if b"%" in target or b"/." in target.partition(b"?")[0] or target.startswith(b"//"):
        return None
    if version == b"HTTP/1.1":
        ver = (1, 1)
    elif version == b"HTTP/1.0":
        ver = (1, 0)
    else:
        return None
    raw: list[tuple[bytes, bytes]] = []
    length: int | None = None
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            return None  # also an obs-fold line, which starts with a blank
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value) is not None:
            return None
        low = name.lower()
        if low in _NOT_HERE:
            return None
        if low == b"content-length":
            if length is not None or not value.isdigit():
                return None
            length = int(value)
        raw.append((name, value))
    start = end + 4
    if len(data) != start + (length or 0):
        return None  # a body still to come, or a second request behind this one
    text_target = target.decode("utf-8", "surrogateescape")
    return QuickRequest(
        method=method.decode("ascii"),
        target=text_target,
        path=text_target.partition("?")[0],
        version=ver,
        raw_headers=tuple(raw),
        has_length=length is not None,
        body=data[start:],
    )
