"""A response the proxy ends early (the upstream broke mid-stream, or went idle past
``idle_s``) closes the client's connection gracefully, so the client reads what it was
sent and then a truncated body. A client that does not read kept that connection, and
the bytes queued for it, for as long as it kept its end open: a graceful close waits for
the buffer to drain. ``close_then_drop`` gives it the idle limit to read, then drops it.
Over real sockets: a client that reads nothing while 4 MiB are queued for it."""

from __future__ import annotations

import asyncio
import socket

import pytest

from llmtop.proxy.relay import close_then_drop


async def stalled_client_transport() -> tuple[asyncio.Transport, asyncio.Future[None],
                                              socket.socket, asyncio.Server]:
    """A server-side transport whose client (returned) never reads; its future resolves
    when the server side's connection is lost."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[tuple[asyncio.Transport, asyncio.Future[None]]] = loop.create_future()

    class Side(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.lost: asyncio.Future[None] = loop.create_future()
            assert isinstance(transport, asyncio.Transport)
            ready.set_result((transport, self.lost))

        def connection_lost(self, exc: Exception | None) -> None:
            if not self.lost.done():
                self.lost.set_result(None)

    server = await loop.create_server(Side, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", port))
    transport, lost = await ready
    transport.write(b"x" * (4 << 20))  # far more than the kernel's buffers hold
    await asyncio.sleep(0.05)
    assert transport.get_write_buffer_size() > 0
    return transport, lost, client, server


@pytest.mark.parametrize("drop", [True, False], ids=["close_then_drop", "close-alone"])
async def test_a_client_that_does_not_read_is_dropped_after_the_grace(drop: bool) -> None:
    transport, lost, client, server = await stalled_client_transport()
    try:
        if drop:
            close_then_drop(transport, 0.2)
        else:
            transport.close()  # what the proxy did: it waits for the client, unbounded
        done, _ = await asyncio.wait([lost], timeout=1.0)
        assert bool(done) is drop
    finally:
        transport.abort()
        client.close()
        server.close()
        await server.wait_closed()


async def test_a_client_that_has_everything_is_closed_at_once() -> None:
    """Nothing queued: closed as before, no timer keeps anything."""
    loop = asyncio.get_running_loop()
    got: asyncio.Future[asyncio.Transport] = loop.create_future()

    class Side(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            got.set_result(transport)

    server = await loop.create_server(Side, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    transport = await got
    transport.write(b"end")
    await asyncio.sleep(0.05)
    close_then_drop(transport, 60.0)
    assert await asyncio.wait_for(reader.read(), 2.0) == b"end"  # then EOF: a clean close
    writer.close()
    server.close()
    await server.wait_closed()
