"""``--workers N`` on a port another process already listens on with ``SO_REUSEPORT`` (a
second ``llmtop run --workers`` given the same ``--listen``, ``llmtop sim --reuse-port``):
refused, as one process is ("Address already in use"). Before, the workers joined it
silently and the kernel split the clients between the two: half the traffic went to the
other process, unseen by this one's figures and recording."""

from __future__ import annotations

import socket

import pytest

from llmtop.worker_procs import StartupErrorProxy, reserve_port


def listener(*, reuse_port: bool) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.parametrize("reuse_port", [True, False])
def test_a_port_another_process_listens_on_is_refused(reuse_port: bool) -> None:
    other = listener(reuse_port=reuse_port)
    try:
        port = other.getsockname()[1]
        with pytest.raises(StartupErrorProxy, match=f"127.0.0.1:{port}: Address already in use"):
            reserve_port("127.0.0.1", port).close()
    finally:
        other.close()


def test_the_reserved_port_takes_the_workers() -> None:
    """What the reservation is for: the workers bind the port beside it (SO_REUSEPORT),
    the port picked by the kernel when asked for 0."""
    holder = reserve_port("127.0.0.1", 0)
    try:
        port = holder.getsockname()[1]
        assert port != 0
        worker = listener_on(port)
        worker.close()
    finally:
        holder.close()


def listener_on(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s
