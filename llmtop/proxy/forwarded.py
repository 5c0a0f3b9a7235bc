"""The client behind a trusted proxy: ``Forwarded``, ``X-Forwarded-For``, ``X-Real-IP``.

Behind a load balancer every request comes from the balancer's address, and every user
named by their address becomes one. When — and only when — the TCP peer is one of the
configured ``trusted_proxies`` the address it forwards is believed, as nginx's ``real_ip``
(``real_ip_recursive on``) and uvicorn's ``--forwarded-allow-ips`` do: from anyone else
such a field is the client's own word, and any client could name itself anyone.

The first of ``Forwarded`` (RFC 7239, its ``for=``), ``X-Forwarded-For``, ``X-Real-IP``
that a request carries decides; its lines are one list, in order. The list is walked from
the right (the hop nearest this proxy) past the addresses that are trusted proxies
themselves: the first one that is not is the client — every hop left of it was written by
someone no trusted proxy vouches for. When every hop is trusted the leftmost is the client.
A hop that names no address — garbage, a ``Forwarded`` element without ``for``, RFC 7239's
``unknown`` and obfuscated (``_hidden``) identifiers — ends the walk with no client: the
peer's address is used, as without a trusted proxy. Addresses are named as
:mod:`ipaddress` writes them (ports dropped, IPv4-mapped IPv6 as IPv4), so one client is
one user however its proxies spell it. Nothing here raises for a request's fields: the
proxy only observes.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from typing import Final, TypeAlias

from llmtop.config import network_of

Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

FIELDS: Final = (b"forwarded", b"x-forwarded-for", b"x-real-ip")
"""The fields that name a forwarded client (lower-case), the first present decides."""
FIELD_NAMES: Final = ("Forwarded", "X-Forwarded-For", "X-Real-IP")
""":data:`FIELDS` as written (for a mapping that is not case-insensitive)."""
_QUOTED_PAIR: Final = re.compile(r"\\(.)")


def address_of(text: str) -> Address | None:
    """The address one hop names (``1.2.3.4``, ``1.2.3.4:80``, ``2001:db8::1``,
    ``[2001:db8::1]:4711``; an obfuscated port ``:_p`` too), IPv4-mapped IPv6 as IPv4;
    None when it names none (``unknown``, ``_hidden``, garbage)."""
    text = text.strip(" \t")
    if text.startswith("["):
        host, bracket, port = text[1:].partition("]")
        if not bracket or (port and not _port(port)):
            return None
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
        if not _port(":" + port):
            return None
    else:
        host = text
    host = host.partition("%")[0]  # an IPv6 zone: this machine's business, not a name
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _port(text: str) -> bool:
    """``:`` and a port number, or an obfuscated port (RFC 7239 6.3: ``_`` and more)."""
    port = text[1:]
    return text[:1] == ":" and port.isascii() and (
        (port.isdigit() and int(port) <= 65535) or (port[:1] == "_" and len(port) > 1))


def split_list(text: str) -> list[str]:
    """An HTTP list's elements (RFC 9110 5.6.1): split at commas outside quoted strings,
    stripped, empty ones dropped."""
    return [e for e in (e.strip(" \t") for e in _split(text, ",")) if e]


def _split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside quoted strings (an unclosed one runs to the end)."""
    if '"' not in text:  # the usual case
        return text.split(sep)
    out: list[str] = []
    start, quoted, escaped = 0, False, False
    for i, c in enumerate(text):
        if escaped:
            escaped = False
        elif quoted and c == "\\":
            escaped = True
        elif c == '"':
            quoted = not quoted
        elif c == sep and not quoted:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return out


def forwarded_for(element: str) -> str | None:
    """An RFC 7239 element's ``for`` value (a quoted string unquoted), None when it has
    none (``for=a;by=b;proto=http``: pairs split at ``;`` outside quotes)."""
    for pair in _split(element, ";"):
        name, eq, value = pair.strip(" \t").partition("=")
        if eq and name.strip(" \t").lower() == "for":
            value = value.strip(" \t")
            if len(value) >= 2 and value[0] == '"' == value[-1]:
                value = _QUOTED_PAIR.sub(r"\1", value[1:-1])
            return value
    return None


class TrustedProxies:
    """The configured ``trusted_proxies``, and the client a trusted one forwards."""

    __slots__ = ("_exact", "_networks")

    def __init__(self, entries: Iterable[str]) -> None:
        exact: set[str] = set()
        networks: list[Network] = []
        for entry in entries:
            net = network_of(entry)
            if net.num_addresses == 1:
                ip = net.network_address
                if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                    ip = ip.ipv4_mapped
                exact.add(str(ip))
                if isinstance(ip, ipaddress.IPv4Address):  # as a [::] listener's peer
                    exact.add(f"::ffff:{ip}")
            else:
                networks.append(net)
        self._exact: frozenset[str] = frozenset(exact)
        """Single addresses as a socket names its peer: one set lookup."""
        self._networks: tuple[Network, ...] = tuple(networks)
        """CIDR networks: the peer is parsed only when there are some."""

    def __bool__(self) -> bool:
        return bool(self._exact or self._networks)

    def trusts_peer(self, peer: str) -> bool:
        """True when ``peer`` (the socket's address of the connection's other end) is a
        trusted proxy. No parsing unless a network (or an IPv6 zone) must be checked."""
        if peer in self._exact:
            return True
        if not self._networks and "%" not in peer:
            return False
        ip = address_of(peer)
        return ip is not None and self.trusts(ip)

    def trusts(self, ip: Address) -> bool:
        if str(ip) in self._exact:
            return True
        return any(ip in net for net in self._networks)

    def client(self, forwarded: Sequence[str], x_forwarded_for: Sequence[str],
               x_real_ip: Sequence[str]) -> str | None:
        """The forwarded client from every line of each of :data:`FIELDS`, in order; None
        when none is present or the one that decides names no client (the caller keeps
        the peer's address)."""
        if forwarded:
            return self._walk([forwarded_for(e) or "" for e in split_list(",".join(forwarded))])
        if x_forwarded_for:
            return self._walk(split_list(",".join(x_forwarded_for)))
        if x_real_ip:
            return self._walk(split_list(",".join(x_real_ip)))
        return None

    def _walk(self, hops: list[str]) -> str | None:
        ip: Address | None = None
        for hop in reversed(hops):
            ip = address_of(hop)
            if ip is None:
                return None
            if not self.trusts(ip):
                return str(ip)
        return None if ip is None else str(ip)  # every hop trusted: the leftmost
