"""Binding a listen address (``--listen``, ``--admin``, ``llmtop sim --listen``) on every
address its host names, all on one port.

aiohttp's ``TCPSite`` (asyncio's ``create_server``) binds each address a host name
resolves to on its own, so with port 0 each got a free port of its own: ``localhost``
names both ::1 and 127.0.0.1 on most systems, and ``--listen localhost:0`` listened on two
different ports and printed one of them. A client whose ``localhost`` resolved to the other
family was refused at the printed address. Here the first address picks the port and the
others are bound to the same one. A host of one address (every IP literal), or a port
given, is bound as ``TCPSite`` always did.

``::`` (``--listen [::]:8080``) is every address, IPv4 included, as ``0.0.0.0`` is every
IPv4 address: asyncio makes its IPv6 sockets IPv6-only, so IPv4 clients of ``[::]`` were
refused (and the start-up check that refuses an upstream looping back into the proxy took
``[::]`` for what it says). Its socket is made here, dual-stack.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
from typing import Any, Final

from aiohttp import web

TRIES: Final = 5
"""Fresh ports tried when another process already holds the one picked on another of the
host's addresses."""


async def host_addresses(host: str) -> list[str]:
    """The distinct addresses ``host`` resolves to for a stream listener, in the
    resolver's order (``socket.gaierror``, an ``OSError``, when it resolves to none)."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    seen: dict[str, None] = {}
    for family, *_, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            seen.setdefault(str(sockaddr[0]), None)
    return list(seen)


def _bound_port(site: web.TCPSite, default: int) -> int:
    server: Any = site._server  # (aiohttp keeps the started server there)
    for sock in getattr(server, "sockets", None) or ():
        return int(sock.getsockname()[1])
    return default


def dual_stack(port: int, *, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """A TCP socket bound to ``[::]:port`` that takes IPv4 clients too (as
    ``::ffff:a.b.c.d``); ``listen=False``: bound only (a port held for workers)."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", port))
        if listen:
            sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def is_any_v6(host: str) -> bool:
    """``host`` is the IPv6 wildcard (``::``, however written) on a system with
    dual-stack sockets."""
    if ":" not in host:
        return False
    try:
        unspecified = ipaddress.IPv6Address(host.strip("[]")).is_unspecified
    except ValueError:
        return False
    return unspecified and socket.has_dualstack_ipv6()


async def start_tcp(runner: web.BaseRunner, host: str, port: int, **site_kw: Any) -> int:
    """Serve ``runner`` on ``host:port`` — on every address of ``host``, on one port —
    and return the port bound. ``site_kw`` goes to each ``TCPSite`` (``backlog``,
    ``reuse_port``). ``OSError`` as ``TCPSite.start`` raises it; nothing is left bound
    then."""
    if is_any_v6(host):
        sock = dual_stack(port, reuse_port=bool(site_kw.get("reuse_port")))
        try:
            await web.SockSite(runner, sock, backlog=site_kw.get("backlog", 128)).start()
        except BaseException:
            sock.close()
            raise
        return int(sock.getsockname()[1])
    addresses = await host_addresses(host) if port == 0 else []
    if len(addresses) < 2:
        site = web.TCPSite(runner, host, port, **site_kw)
        await site.start()
        return _bound_port(site, port)
    for attempt in range(TRIES):
        started: list[web.TCPSite] = []
        try:
            first = web.TCPSite(runner, addresses[0], 0, **site_kw)
            await first.start()
            started.append(first)
            chosen = _bound_port(first, 0)
            for address in addresses[1:]:
                site = web.TCPSite(runner, address, chosen, **site_kw)
                await site.start()
                started.append(site)
        except OSError as exc:
            for site in started:
                await site.stop()
            if exc.errno != errno.EADDRINUSE or attempt == TRIES - 1:
                raise
            continue
        return chosen
    raise AssertionError("unreachable")  # pragma: no cover
