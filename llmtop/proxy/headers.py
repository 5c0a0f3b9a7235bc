"""Which headers cross the proxy, per RFC 9110 §7.6.1 (hop-by-hop fields).

A proxy removes ``Connection``, every field that ``Connection`` names, and the
fields that only make sense for one connection (``Keep-Alive``, ``Proxy-*``,
``TE``, ``Trailer``, ``Transfer-Encoding``, ``Upgrade``). Everything else —
``Authorization`` and ``x-api-key`` included — passes through untouched, in
order, with repeated fields kept.

Upstream-bound requests also lose ``Host`` (the client session writes the
upstream's), ``Content-Length`` (recomputed from the body actually sent, which
may differ when usage is injected) and ``Expect: 100-continue`` (the proxy answers
it and has read the body, so a handshake upstream has nothing to wait for). Any
other expectation goes upstream as it came: it is the upstream's to meet or to
refuse with 417 (RFC 9110 10.1.1), as it would for a client reaching it directly:
servers differ (Go's net/http, Ollama's, and aiohttp's router answer 417; uvicorn,
vLLM's and SGLang's, serves the request), and a proxy that dropped the field served
the request as if nothing had been expected, whatever the upstream does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""Fields that describe one connection, never forwarded (lower-case)."""

_REQUEST_DROP: Final = frozenset(
    h.encode() for h in HOP_BY_HOP | {"host", "content-length", "expect"})
_LISTED_FAST: Final = _REQUEST_DROP - {b"expect"}
"""Tokens of a ``Connection`` field that :func:`upstream_field_lines` may pass over in
its one pass (they name fields it drops anyway; ``expect`` may be kept)."""
RESPONSE_DROP: Final = frozenset(h.encode() for h in HOP_BY_HOP | {"content-length"})
"""Response fields never passed to the client as they are (lower-case bytes; ``Proxy-*``
and the fields ``Connection`` names go too)."""
_CONTINUE: Final = b"100-continue"


def _kept_expect(value: bytes) -> bool:
    """An ``Expect`` field with this value goes upstream: any expectation but
    ``100-continue``, which the proxy answers itself (see the module docstring)."""
    return value.strip(b" \t").lower() != _CONTINUE


def _without_hop_by_hop(items: Iterable[tuple[bytes, bytes]], drop: frozenset[bytes]
                        ) -> list[tuple[bytes, bytes]]:
    """``items`` in order, less the fields in ``drop``, ``Proxy-*`` and those that a
    ``Connection`` field lists (RFC 9110 7.6.1)."""
    out: list[tuple[bytes, bytes]] = []
    listed: set[bytes] | None = None
    for pair in items:
        low = pair[0].lower()
        if low in drop or low.startswith(b"proxy-"):
            if low == b"connection":
                if listed is None:
                    listed = set()
                listed.update(_tokens(pair[1]))
            elif low == b"expect" and _kept_expect(pair[1]):  # (requests only)
                out.append(pair)
            continue
        out.append(pair)
    if listed:
        out = [pair for pair in out if pair[0].lower() not in listed]
    return out


def upstream_request_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's request headers (aiohttp's ``raw_headers``, bytes as received) as they
    go upstream, in order and byte for byte (see the module docstring)."""
    return _without_hop_by_hop(raw, _REQUEST_DROP)


def upstream_field_lines(raw: Iterable[tuple[bytes, bytes]], identity_encoding: bool = False
                         ) -> bytes:
    """:func:`upstream_request_headers` as the field lines that go upstream (``Name:
    value\r\n`` each, in order), ``Accept-Encoding`` set to ``identity`` when
    ``identity_encoding``; in one pass over the fields unless a ``Connection`` field names
    one that would not be dropped anyway (``Connection: keep-alive`` does not)."""
    out: list[bytes] = []
    for name, value in raw:
        low = name.lower()
        if low in _REQUEST_DROP or low.startswith(b"proxy-"):
            if low == b"connection" and not all(
                    t in _LISTED_FAST or t.startswith(b"proxy-") for t in _tokens(value)):
                return _field_lines(upstream_request_headers(raw), identity_encoding)
            if low == b"expect" and _kept_expect(value):
                out.append(name + b": " + value + b"\r\n")
            continue
        if identity_encoding and low == b"accept-encoding":
            value = b"identity"
        out.append(name + b": " + value + b"\r\n")
    return b"".join(out)


def _field_lines(fields: list[tuple[bytes, bytes]], identity_encoding: bool) -> bytes:
    return b"".join(name + b": " + (b"identity" if identity_encoding
                                    and name.lower() == b"accept-encoding" else value) + b"\r\n"
                    for name, value in fields)


def _tokens(value: bytes) -> list[bytes]:
    """The field names a ``Connection`` value lists (lower-case)."""
    return [t.strip().lower() for t in value.split(b",") if t.strip()]


def client_response_headers(items: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers (name and value bytes) as they go to the client, in
    order, less ``Content-Length`` (set again when the body passes unchanged) and
    hop-by-hop fields."""
    return _without_hop_by_hop(items, RESPONSE_DROP)
