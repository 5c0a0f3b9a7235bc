"""The simulator's listen queue holds a burst of connections it has not accepted yet.

A proxy in front of the simulator opens hundreds of upstream connections at once when
1,024 streams start. With aiohttp's default listen backlog (128) the kernel's accept queue
overflowed while the simulator was busy, SYN cookies were sent, some of them failed, and
the proxy's fresh connections were reset before any response (502s in
``benchmarks/scale_overhead.py`` at 1,024 streams). Here the simulator's event loop is held
while 300 connections are opened, so none can be accepted: the kernel must queue them all
(the accept-queue length of a listening socket is the ``rx_queue`` of ``/proc/net/tcp``),
and every one is answered once the loop runs again.
"""

from __future__ import annotations

import asyncio
import socket
import time

from llmtop.sim.server import running_sim

BURST = 300


def _accept_queue_len(port: int) -> int | None:
    """Connections waiting in the accept queue of the socket listening on 127.0.0.1:port."""
    want = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[1] == want and fields[3] == "0A":  # 0A: LISTEN
                return int(fields[4].split(":")[1], 16)
    return None


async def _get_health(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    parts = []
    while data := await loop.sock_recv(sock, 4096):
        parts.append(data)
    return b"".join(parts)


async def test_a_burst_of_connections_waits_in_the_listen_queue() -> None:
    async with running_sim("tiny") as sim:
        socks = []
        try:
            # the loop is held from here to the first await: nothing is accepted meanwhile
            for _ in range(BURST):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", sim.port))
                socks.append(s)
            queued = 0
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                queued = _accept_queue_len(sim.port) or 0
                if queued >= BURST:
                    break
                time.sleep(0.01)  # noqa: ASYNC251 - the loop must stay held (no accepts)
            assert queued == BURST, f"only {queued} of {BURST} connections queued"
            replies = await asyncio.wait_for(
                asyncio.gather(*(_get_health(s) for s in socks)), 60)
        finally:
            for s in socks:
                s.close()
    assert all(r.startswith(b"HTTP/1.1 200") for r in replies)
