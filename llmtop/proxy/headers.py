"""Which headers cross the proxy, per RFC 9110 §7.6.1 (hop-by-hop fields).

A proxy removes ``Connection``, every field that ``Connection`` names, and the
fields that only make sense for one connection (``Keep-Alive``, ``Proxy-*``,
``TE``, ``Trailer``, ``Transfer-Encoding``, ``Upgrade``). Everything else —
``Authorization`` and ``x-api-key`` included — passes through untouched, in
order, with repeated fields kept.

Upstream-bound requests also lose ``Host`` (the client session writes the
upstream's), ``Content-Length`` (recomputed from the body actually sent, which
may differ when usage is injected) and ``Expect`` (the proxy has already read
the body, so a ``100-continue`` handshake upstream has nothing to wait for).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from multidict import CIMultiDict

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

_REQUEST_DROP: Final = HOP_BY_HOP | {"host", "content-length", "expect"}
_RESPONSE_DROP: Final = HOP_BY_HOP | {"content-length"}


def _connection_listed(items: Iterable[tuple[str, str]]) -> set[str]:
    """The field names a ``Connection`` header lists (they are hop-by-hop too)."""
    named: set[str] = set()
    for name, value in items:
        if name.lower() == "connection":
            named.update(t.strip().lower() for t in value.split(",") if t.strip())
    return named


def _filter(items: Iterable[tuple[str, str]], drop: frozenset[str]) -> CIMultiDict[str]:
    pairs = list(items)
    extra = _connection_listed(pairs)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in pairs:
        low = name.lower()
        if low in drop or low in extra or low.startswith("proxy-"):
            continue
        out.add(name, value)
    return out


def upstream_request_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's request headers (aiohttp's ``raw_headers``, bytes as received) as they
    go upstream, in order and byte for byte (see the module docstring)."""
    pairs = list(raw)
    extra: set[str] = set()
    for name, value in pairs:
        if name.lower() == b"connection":
            extra.update(t.strip().lower() for t in value.decode("latin-1").split(",")
                         if t.strip())
    out: list[tuple[bytes, bytes]] = []
    for name, value in pairs:
        low = name.decode("latin-1").lower()
        if low in _REQUEST_DROP or low in extra or low.startswith("proxy-"):
            continue
        out.append((name, value))
    return out


def client_response_headers(items: Iterable[tuple[str, str]]) -> CIMultiDict[str]:
    """The upstream's response headers as they go to the client, less ``Content-Length``
    (the relay sets it again when it passes the body unchanged) and hop-by-hop fields."""
    return _filter(items, _RESPONSE_DROP)
