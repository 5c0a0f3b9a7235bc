"""llmtop.net_errors: the one wording for "could not connect", on real sockets where a
machine can produce the failure (a closed port, a name that never resolves, TLS to a plain
TCP port or to an untrusted certificate) and on constructed errors for what only some
machines or library versions produce (asyncio's joined error without an errno)."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client_reqrep import ConnectionKey

from llmtop.net_errors import KINDS, MAX_REASON, connect_failure, connect_failure_kind


def closed_port() -> int:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class BothLoopbacks(AbstractResolver):
    """Every name is ``::1`` and ``127.0.0.1``, as ``localhost`` is on many machines (on
    this one it may be 127.0.0.1 only)."""

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        return [ResolveResult(hostname=host, host=ip, port=port, family=fam, proto=0,
                              flags=socket.AI_NUMERICHOST)
                for ip, fam in (("::1", socket.AF_INET6), ("127.0.0.1", socket.AF_INET))]

    async def close(self) -> None:
        pass


async def failure(url: str, resolver: AbstractResolver | None = None,
                  ssl_ctx: ssl.SSLContext | None = None) -> aiohttp.ClientConnectorError:
    """What a GET of ``url`` raises (it must be a connector error)."""
    conn = aiohttp.TCPConnector(resolver=resolver, ssl=ssl_ctx if ssl_ctx else True)
    async with aiohttp.ClientSession(connector=conn) as session:
        with pytest.raises(aiohttp.ClientConnectorError) as info:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=20)):
                pass
    return info.value


def connector_error(cause: OSError, host: str = "localhost",
                    cls: type[aiohttp.ClientConnectorError] = aiohttp.ClientConnectorError,
                    ) -> aiohttp.ClientConnectorError:
    key = ConnectionKey(host, 8081, False, True, None, None, None)
    return cls(key, cause)


async def test_a_closed_port_is_refused() -> None:
    exc = await failure(f"http://127.0.0.1:{closed_port()}/")
    assert connect_failure_kind(exc) == connect_failure(exc) == "connection refused"


async def test_localhost_closed_port_is_refused() -> None:
    """``localhost`` as this machine resolves it (127.0.0.1 here; ::1 too elsewhere)."""
    exc = await failure(f"http://localhost:{closed_port()}/")
    assert connect_failure(exc) == "connection refused"


async def test_refused_on_both_loopback_addresses_is_refused() -> None:
    """A name with two addresses, both refused (or ::1 unusable where IPv6 is off): the
    failures come back joined into one error, which still reads as refused."""
    exc = await failure(f"http://localhost:{closed_port()}/", resolver=BothLoopbacks())
    assert "Multiple exceptions" in str(exc.os_error)  # the joined case, not one address
    assert connect_failure(exc) == "connection refused"


JOINED = "Multiple exceptions: [Errno {}] Connect call failed ('::1', 8081, 0, 0), " \
         "[Errno {}] Connect call failed ('127.0.0.1', 8081)"


@pytest.mark.parametrize(
    ("v6", "v4", "kind"),
    [(errno.ECONNREFUSED, errno.ECONNREFUSED, "connection refused"),
     # ::1 where IPv6 is off, 127.0.0.1 refused: nothing listens
     (errno.EADDRNOTAVAIL, errno.ECONNREFUSED, "connection refused"),
     (errno.ENETUNREACH, errno.ECONNREFUSED, "connection refused"),
     (errno.ETIMEDOUT, errno.ETIMEDOUT, "connect timed out"),
     (errno.EHOSTUNREACH, errno.ECONNREFUSED, "cannot connect"),
     (errno.EADDRNOTAVAIL, errno.ENETUNREACH, "cannot connect")],
)
def test_joined_errors_without_an_errno(v6: int, v4: int, kind: str) -> None:
    """asyncio's own create_connection (aiohttp < 3.10) and aiohappyeyeballs when the
    addresses failed differently raise ``OSError("Multiple exceptions: …")``, no errno:
    the per-address codes are read from its text."""
    exc = connector_error(OSError(JOINED.format(v6, v4)))
    assert exc.os_error.errno is None
    assert connect_failure_kind(exc) == kind
    assert connect_failure(exc).split(": ", 1)[0] == kind


def test_joined_error_with_the_common_errno() -> None:
    """aiohappyeyeballs ≥ 2.3 keeps the errno when every address failed alike."""
    exc = connector_error(OSError(errno.ECONNREFUSED, JOINED.format(111, 111)))
    assert connect_failure(exc) == "connection refused"


async def test_a_name_that_never_resolves_is_host_not_found() -> None:
    """RFC 6761's ``.invalid`` never resolves (or, offline, cannot be looked up)."""
    exc = await failure("http://nonexistent.invalid:8081/")
    assert connect_failure_kind(exc) == "host not found"
    assert connect_failure(exc) == "host not found: nonexistent.invalid"


def test_the_host_shown_is_made_printable() -> None:
    host = "evil\x1b]0;pwned\x07.invalid"
    exc = connector_error(socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
                          host=host)
    text = connect_failure(exc)
    assert text == "host not found: evil\\x1b]0;pwned\\x07.invalid"
    assert text.isprintable()


@asynccontextmanager
async def plain_tcp_server() -> AsyncIterator[int]:
    """Answers whatever arrives with a line of plain HTTP (no TLS), then closes."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(4096)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_tls_to_a_plain_tcp_port_is_a_failed_handshake() -> None:
    """``https://`` to a port that speaks plain HTTP."""
    async with plain_tcp_server() as port:
        exc = await failure(f"https://127.0.0.1:{port}/")
    assert connect_failure(exc) == "TLS handshake failed"


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    d = tmp_path_factory.mktemp("tls")
    crt, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(crt), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return crt, key


async def test_a_self_signed_certificate_is_not_trusted(cert: tuple[Path, Path]) -> None:
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(str(cert[0]), str(cert[1]))

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_ctx)
    try:
        port = server.sockets[0].getsockname()[1]
        exc = await failure(f"https://127.0.0.1:{port}/")
    finally:
        server.close()
        await server.wait_closed()
    assert connect_failure(exc) == "TLS certificate not trusted"


def test_an_os_connect_timeout_is_named() -> None:
    exc = connector_error(TimeoutError(errno.ETIMEDOUT, "Connection timed out"))
    assert connect_failure(exc) == "connect timed out"


def test_other_reasons_are_the_os_words_one_short_printable_line() -> None:
    exc = connector_error(OSError(errno.EHOSTUNREACH, "No route to host"))
    assert connect_failure(exc) == "cannot connect: No route to host"
    long = connector_error(OSError("Multiple exceptions: " + "\x1b[2J bad, " * 40))
    text = connect_failure(long)
    assert text.startswith("cannot connect: Multiple exceptions: \\x1b[2J bad")
    assert len(text) <= MAX_REASON and text.isprintable()


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE])
def test_no_descriptor_for_the_socket_is_our_side_out_of_file_descriptors(code: int) -> None:
    """EMFILE/ENFILE is this machine's limit, not the other end's refusal (bench counted
    its own exhaustion as the target's "cannot connect"); the real thing is in
    tests/reliability/test_rel_qa_fds.py."""
    exc = connector_error(OSError(code, os.strerror(code)))
    assert connect_failure_kind(exc) == connect_failure(exc) == "out of file descriptors"


def test_every_kind_is_listed() -> None:
    """The kinds are the keys ``llmtop bench`` counts by: each text starts with one."""
    causes: list[OSError] = [ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
                             socket.gaierror(socket.EAI_NONAME, "unknown"),
                             TimeoutError(errno.ETIMEDOUT, "timed out"),
                             OSError(errno.EHOSTUNREACH, "No route to host"),
                             OSError(errno.EMFILE, "Too many open files")]
    for cause in causes:
        exc = connector_error(cause)
        assert connect_failure_kind(exc) in KINDS
        assert connect_failure(exc).split(": ", 1)[0] == connect_failure_kind(exc)
