"""Network faults over real sockets, shared by the test folders (importable from any of
them: pytest puts ``tests/`` on ``sys.path`` for its ``conftest.py``)."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

from aiohttp import web


@contextlib.contextmanager
def blackhole() -> Iterator[str]:
    """A URL whose connection attempts time out, as a host that drops SYNs does (down,
    firewalled, a dead node behind a stale address): a listening socket whose accept queue
    is full and never accepted from, so the kernel drops further SYNs. Checked: a probe
    connect must time out, or the test would be testing something else."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fill: list[socket.socket] = []
    try:
        for _ in range(4):  # fill the accept queue (never accepted)
            c = socket.socket()
            c.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                c.connect(("127.0.0.1", port))
            fill.append(c)
        time.sleep(0.1)
        probe = socket.socket()
        probe.settimeout(0.5)
        try:
            probe.connect(("127.0.0.1", port))
            raise AssertionError("the accept queue did not fill: SYNs are not dropped")
        except TimeoutError:
            pass
        finally:
            probe.close()
        yield f"http://127.0.0.1:{port}"
    finally:
        for c in fill:
            c.close()
        srv.close()


def loopback_v6() -> bool:
    """This machine has ::1 (IPv6 loopback) to bind."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


def link_local_v6() -> str | None:
    """A link-local address of this machine with its zone (``fe80::…%eth0``), if any."""
    try:
        rows = Path("/proc/net/if_inet6").read_text().split()
    except OSError:
        return None
    for i in range(0, len(rows) - 5, 6):
        addr, scope, name = rows[i], rows[i + 3], rows[i + 5]
        if scope == "20":  # link
            return f"{ipaddress.IPv6Address(int(addr, 16))}%{name}"
    return None


@contextlib.asynccontextmanager
async def serving(*routes: web.RouteDef) -> AsyncIterator[str]:
    """``routes`` (``web.get("/metrics", handle)``, …) served on 127.0.0.1 (a port of its
    own); yields the base URL."""
    app = web.Application()
    app.router.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def chat_engine(
    handle: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    """``handle`` served as an engine's ``POST /v1/chat/completions`` on 127.0.0.1 (a
    port of its own); yields the base URL."""
    async with serving(web.post("/v1/chat/completions", handle)) as url:
        yield url
