"""Why a connection could not be made, in the few words a user can act on.

One wording for aiohttp's connector errors, shared by ``llmtop bench`` (which counts
failures by kind) and the TUI / ``llmtop attach`` (which say why an admin API is down):

- ``connection refused`` — nothing listens there (also when a name such as ``localhost``
  has several addresses and every usable one refused: asyncio and aiohappyeyeballs then
  join the failures into one ``OSError`` whose errno may be missing, and only its text,
  ``Multiple exceptions: [Errno 111] …, [Errno 111] …``, tells what happened);
- ``host not found: <host>``;
- ``TLS certificate not trusted``, ``TLS handshake failed`` (e.g. ``https://`` to a plain
  HTTP port);
- ``connect timed out``;
- ``out of file descriptors`` — this process (EMFILE) or the system (ENFILE) had none
  left for the socket: the local side's limit, nothing the other end did;
- ``cannot connect: <the OS's reason>``.

The kind — what :func:`connect_failure_kind` returns, and the text before the first
``": "`` of :func:`connect_failure` — is one of :data:`KINDS`.
"""

from __future__ import annotations

import errno
import re
import socket
from typing import Final

import aiohttp

from llmtop.textsafe import printable

OUT_OF_FILES: Final = "out of file descriptors"

KINDS: Final = ("connection refused", "host not found", "TLS certificate not trusted",
                "TLS handshake failed", "connect timed out", OUT_OF_FILES, "cannot connect")

MAX_REASON: Final = 80
"""The longest ``cannot connect: …`` text (the OS's joined reasons can be long)."""

_ERRNO = re.compile(r"\[Errno (\d+)\]")

_NO_ROUTE: Final = frozenset({errno.EADDRNOTAVAIL, errno.ENETUNREACH, errno.EAFNOSUPPORT})
"""An address this machine cannot use at all (``::1`` with IPv6 off, no route to the
network): beside a refusal on another address of the same name, the refusal is the news."""


def _codes(cause: OSError) -> set[int]:
    """The errno of each address tried: the error's own, else those named in its text."""
    if cause.errno is not None:
        return {cause.errno}
    return {int(c) for c in _ERRNO.findall(str(cause))}


def connect_failure_kind(exc: aiohttp.ClientConnectorError) -> str:
    """The kind of connector failure, one of :data:`KINDS` (a stable key to count by)."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return "TLS certificate not trusted"
    if isinstance(exc, aiohttp.ClientSSLError):
        return "TLS handshake failed"
    cause = exc.os_error
    # ClientConnectorDNSError is aiohttp ≥ 3.10's; older ones hand over the gaierror
    if isinstance(exc, aiohttp.ClientConnectorDNSError) or isinstance(cause, socket.gaierror):
        return "host not found"
    codes = _codes(cause)
    if errno.ECONNREFUSED in codes and codes <= _NO_ROUTE | {errno.ECONNREFUSED}:
        return "connection refused"
    if isinstance(cause, TimeoutError) or codes == {errno.ETIMEDOUT}:
        return "connect timed out"
    if codes & {errno.EMFILE, errno.ENFILE}:
        return OUT_OF_FILES
    return "cannot connect"


def connect_failure(exc: aiohttp.ClientConnectorError) -> str:
    """Why the connection failed, one line safe to print: the kind, and for ``host not
    found`` the host, for ``cannot connect`` the OS's reason (at most :data:`MAX_REASON`
    characters)."""
    kind = connect_failure_kind(exc)
    if kind == "host not found":
        return f"{kind}: {printable(str(exc.host))}"
    if kind == "cannot connect":
        cause = exc.os_error
        why = cause.strerror or str(cause) or type(cause).__name__
        return printable(f"{kind}: {why}")[:MAX_REASON]
    return kind
