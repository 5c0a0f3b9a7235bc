"""A lean HTTP/1.1 client for the forwarding path: keep-alive connections to one upstream.

Why not aiohttp's client: it delivers a response body through a ``StreamReader`` that a
task must wake up to read, so every chunk costs a future, a task switch and a dozen
Python calls before it can be written out. Here the body is handed to a
:class:`BodySink` synchronously from the connection's ``data_received`` — the relay writes
it to the client inside the same callback, like an event-driven C proxy does. The
request line and headers are parsed once per response in Python; the body is only
de-framed (``Content-Length``, ``chunked``, or until close), never decoded.

One :class:`UpstreamPool` per proxy keeps idle keep-alive connections (LIFO, capped); an
idle connection the upstream closes is dropped from the pool as soon as the close
arrives. A request that finds its reused connection closed before any byte of a response
may be resent once on a fresh connection (``UpstreamClosed.retryable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import deque
from collections.abc import Callable
from typing import Final, Protocol, cast
from urllib.parse import urlsplit

from llmtop.proxy.upstream_head import (
    ConnectFailed,
    ConnectTimeout,
    MalformedResponse,
    ResponseHead,
    UpstreamClosed,
    UpstreamError,
    parse_head,
)

__all__ = [
    "BodySink",
    "BufferSink",
    "ConnectFailed",
    "ConnectTimeout",
    "MalformedResponse",
    "ResponseHead",
    "UpstreamClosed",
    "UpstreamConnection",
    "UpstreamError",
    "UpstreamPool",
]

MAX_HEAD_BYTES: Final = 256 * 1024
"""A response's status line and headers may not be longer (then it is malformed)."""
MAX_CHUNK_LINE: Final = 4096
IDLE_MAX: Final = 4096
"""Idle keep-alive connections kept at most."""


class BodySink(Protocol):
    """Receives a response body as it arrives (called from ``data_received``)."""

    def on_data(self, data: bytes, frame: bytes | None = None) -> None:
        """Body bytes of one network read (de-framed, so without chunk headers).
        ``frame``: the read itself when it was whole chunks of a chunked body and nothing
        else (``SIZE\\r\\n`` + payload + ``\\r\\n`` each, the sizes in plain hex digits,
        the payloads together ``data``), which a sink writing a chunked body may send on as
        it is."""

    def on_end(self) -> None:
        """The body is complete."""

    def on_last(self, data: bytes) -> None:
        """The last body bytes, and the body is complete (``on_data`` then ``on_end``, for
        a read that brought both)."""

    def on_error(self, exc: UpstreamError) -> None:
        """The body broke off (connection closed or malformed framing)."""


class BufferSink:
    """A sink that keeps the whole body (small error bodies the proxy must look at)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.parts: list[bytes] = []
        self.done: asyncio.Future[bytes] = loop.create_future()

    def on_data(self, data: bytes, frame: bytes | None = None) -> None:
        self.parts.append(data)

    def on_end(self) -> None:
        if not self.done.done():
            self.done.set_result(b"".join(self.parts))

    def on_last(self, data: bytes) -> None:
        self.on_data(data)
        self.on_end()

    def on_error(self, exc: UpstreamError) -> None:
        if not self.done.done():
            self.done.set_exception(exc)


_HEAD, _BODY, _IDLE, _CLOSED = 0, 1, 2, 3


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self, pool: UpstreamPool) -> None:
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.reused = False
        self._state = _IDLE
        self._buf = b""
        self._head_fut: asyncio.Future[ResponseHead] | None = None
        self.head_ready: Callable[[ResponseHead | None], None] | None = None
        """Set after :meth:`send` by a caller that takes the response head from the
        connection's own callback instead of the future's (:mod:`llmtop.proxy.direct`):
        called with the head as soon as it is read, with the head's first body bytes
        already pending (an :meth:`attach` in the call delivers them at once, with no loop
        turn and no pause of the connection in between), or with None when the head
        failed (the future holds why). Not called once the future is done (cancelled)."""
        self._is_head_request = False
        self._sink: BodySink | None = None
        self._pending: list[bytes] = []
        self._pending_eof = False
        self._received = False
        self._reusable = False
        # body framing
        self._mode = 0  # 1 length, 2 chunked, 3 until close
        self._left = 0  # length mode: bytes to come; chunked: payload bytes of this chunk
        self._crlf = 0  # chunked: bytes of the CRLF after a chunk still to skip
        self._line = b""  # chunked: partial chunk-size or trailer line
        self._trailers = False

    # -- lifecycle -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, but behave as one)
        self.transport = cast(asyncio.Transport, transport)
        # once per connection: asyncio.get_running_loop() is a getpid() syscall on 3.11
        self._loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def usable(self) -> bool:
        t = self.transport
        return self._state == _IDLE and t is not None and not t.is_closing()

    @property
    def reusable(self) -> bool:
        """The last response ended cleanly and the connection may carry another."""
        return self._reusable and self.usable

    def abort(self) -> None:
        """Drop the connection now (the upstream sees it closed at once)."""
        self._state = _CLOSED
        self._reusable = False
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        self._state = _CLOSED
        self._reusable = False
        if self.transport is not None:
            self.transport.close()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # -- one exchange ----------------------------------------------------------------

    def send(self, request: bytes, head_request: bool) -> asyncio.Future[ResponseHead]:
        """Write one request; the future resolves with the response head."""
        assert self.transport is not None and self._loop is not None and self._state == _IDLE
        self._head_fut = self._loop.create_future()
        self.head_ready = None
        self._state = _HEAD
        self._is_head_request = head_request
        self._buf = b""
        self._sink = None
        if self._pending:  # (the list is kept across requests: one object less to collect)
            self._pending = []
        self._pending_eof = False
        self._received = False
        self._reusable = False
        self.transport.write(request)
        return self._head_fut

    def attach(self, sink: BodySink) -> None:
        """Start delivering the body to ``sink`` (what arrived so far first)."""
        self._sink = sink
        pending = self._pending
        if pending:
            self._pending = []
            for data in pending:
                if self._state != _BODY:
                    break
                self._body(data)
        if self._state == _BODY:
            if self._pending_eof:
                self._eof()
            else:
                self.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._state == _BODY:
            sink = self._sink
            if sink is not None:
                if (self._mode == 2 and not self._left and not self._crlf and not self._line
                        and not self._trailers):
                    # the hot path: a read that is exactly one whole "SIZE\r\nDATA\r\n"
                    # (at a chunk boundary the first CRLF ends the size line)
                    nl = data.find(b"\r\n")
                    if nl > 0:
                        size_text = data[:nl]
                        if size_text.isalnum():
                            try:
                                size = int(size_text, 16)
                            except ValueError:
                                size = 0
                            end = nl + 2 + size
                            if size and end + 2 == len(data) and data[end:] == b"\r\n":
                                if 0x78 in size_text or 0x58 in size_text:
                                    # int() also reads "0x1f", HTTP does not: framed anew
                                    # for the client, and not pooled again (_dechunk)
                                    self._reusable = False
                                    sink.on_data(data[nl + 2:end], None)
                                else:
                                    sink.on_data(data[nl + 2:end], data)
                                return
                self._body(data)
            else:
                self._pending.append(data)
                self.pause_reading()
            return
        if self._state == _HEAD:
            self._received = True
            self._head(data)
            return
        # bytes while idle: the upstream is out of step; this connection is done for
        self.abort()

    def eof_received(self) -> bool | None:
        if self._state == _BODY and self._sink is None:
            self._pending_eof = True
            return True  # keep the transport until the pending bytes are delivered
        self._eof()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        state = self._state
        self._state = _CLOSED
        self._reusable = False
        self._pool.forget(self)
        if state == _HEAD:
            self._fail_head(UpstreamClosed(
                "upstream closed the connection before responding"
                + (f" ({exc})" if exc else ""),
                retryable=self.reused and not self._received))
        elif state == _BODY:
            if self._mode == 3 and exc is None:
                self._finish(reusable=False)
            elif self._sink is not None:
                self._sink.on_error(UpstreamClosed(
                    "upstream closed the connection mid-response"
                    + (f" ({exc})" if exc else "")))

    def _eof(self) -> None:
        if self._state == _BODY:
            if self._mode == 3:
                self._finish(reusable=False)
            elif self._sink is not None:
                self._state = _CLOSED
                self._sink.on_error(UpstreamClosed("upstream closed the connection "
                                                   "mid-response"))
        elif self._state == _HEAD:
            self._state = _CLOSED
            self._fail_head(UpstreamClosed("upstream closed the connection before responding",
                                           retryable=self.reused and not self._received))
        if self.transport is not None:
            self.transport.close()

    def _fail_head(self, exc: UpstreamError) -> None:
        fut, ready = self._head_fut, self.head_ready
        self.head_ready = None
        if fut is not None and not fut.done():
            fut.set_exception(exc)
            if ready is not None:
                ready(None)

    # -- parsing ---------------------------------------------------------------------

    def _head(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    self._malformed_head("response head too large")
                    return
                if b"\n\n" in buf:
                    # (no CRLF head holds LF LF before its end: the head ended in bare LFs,
                    # which this reader does not take; desync checks: the client waited
                    # first_byte_s for a 504, for a head that had come)
                    self._malformed_head("response head with bare LF line ends")
                    return
                self._buf = buf
                return
            try:
                head = parse_head(buf[:end], self._is_head_request)
            except MalformedResponse as exc:
                self._malformed_head(str(exc))
                return
            buf = buf[end + 4:]
            if head.status == 101:
                # the proxy never sends Upgrade, so a switch of protocols is out of step
                # (QA: it was skipped as interim and what followed it read as the next
                # head, the client waiting up to first_byte_s for a 502)
                self._malformed_head("101 Switching Protocols to a request without Upgrade")
                return
            if 100 <= head.status < 200:  # interim (100 Continue, 103 Early Hints): skip
                continue
            break
        self._buf = b""
        self._state = _BODY
        if head.no_body:
            self._mode = 0
        elif head.chunked:
            self._mode, self._left, self._crlf, self._line = 2, 0, 0, b""
            self._trailers = False
        elif head.length is not None:
            self._mode, self._left = 1, head.length
        else:
            self._mode = 3
        # bytes after a response without a body (a 204/304/HEAD answer with one anyway):
        # the upstream is out of step, and the rest may come once the connection carries
        # the next request (QA: it went back to the pool)
        self._reusable = head.keep_alive and self._mode != 3 and not (buf and not self._mode)
        if buf:
            self._pending.append(buf)
        if self._mode == 0 or (self._mode == 1 and self._left == 0):
            self._pending.append(b"")  # nothing to wait for: attach() completes at once
        fut, ready = self._head_fut, self.head_ready
        self._head_fut = self.head_ready = None  # the caller's from now on
        if fut is not None and not fut.done():
            fut.set_result(head)
            if ready is not None:
                ready(head)  # may attach (and even finish the response) before it returns
                if self._sink is not None or self._state != _BODY:
                    return
        self.pause_reading()  # until the relay has sent the head on and attaches

    def _malformed_head(self, why: str) -> None:
        self._state = _CLOSED
        self._fail_head(MalformedResponse(why))
        self.abort()

    def _body(self, data: bytes) -> None:
        mode = self._mode
        sink = self._sink
        assert sink is not None
        if mode == 1:
            n = len(data)
            if n >= self._left:
                if n > self._left:  # more than announced: deliver what was, drop the rest
                    data = data[: self._left]
                    self._reusable = False
                self._left = 0
                self._finish(self._reusable, data)
                return
            self._left -= n
            sink.on_data(data)
            return
        if mode == 2:
            try:
                payload, done, whole = self._dechunk(data)
            except MalformedResponse as exc:
                self._state = _CLOSED
                self.abort()
                sink.on_error(exc)
                return
            if done:
                self._finish(self._reusable, payload)
            elif payload:
                sink.on_data(payload, data if whole else None)
            return
        if mode == 3:
            if data:
                sink.on_data(data)
            return
        self._finish(self._reusable)  # no body

    def _dechunk(self, data: bytes) -> tuple[bytes, bool, bool]:
        """The payload bytes in ``data``, whether the last chunk (and trailers) ended, and
        whether ``data`` was whole chunks only, from a chunk boundary to one, each size in
        plain hex digits (a chunked client may then be sent ``data`` as it is)."""
        n = len(data)
        left = self._left
        if left >= n and not self._crlf:  # all of it inside one chunk: no copy
            self._left = left - n
            if self._left == 0:
                self._crlf = 2
            return data, False, False
        # (a read that is exactly one whole chunk was taken by data_received)
        out: list[bytes] = []
        pos = 0
        whole = True  # only whole plain chunks so far, from a boundary
        while pos < n:
            if not self._left and not self._crlf and not self._line and not self._trailers:
                # at a chunk boundary: take whole "SIZE\r\nDATA\r\n" frames in a tight loop
                nl = data.find(b"\r\n", pos, pos + 20)
                if nl > pos:
                    size_text = data[pos:nl]
                    if size_text.isalnum():
                        try:
                            size = int(size_text, 16)
                        except ValueError:
                            size = -1
                        end = nl + 2 + size
                        if size > 0 and end + 2 <= n and data[end:end + 2] == b"\r\n":
                            out.append(data[nl + 2:end])
                            pos = end + 2
                            if 0x78 in size_text or 0x58 in size_text:
                                # "0x1f": int() reads it, HTTP does not (see below)
                                whole = self._reusable = False
                            continue
                        if size == 0 and nl + 4 == n and data.endswith(b"\r\n\r\n"):
                            # the last chunk, no trailers, ends this read: "0\r\n\r\n"
                            return (out[0] if len(out) == 1 else b"".join(out)), True, False
            whole = False  # a part of a chunk, a CRLF, a size line or trailers
            if self._left:
                take = min(self._left, n - pos)
                out.append(data[pos:pos + take])
                pos += take
                self._left -= take
                if self._left == 0:
                    self._crlf = 2
            elif self._crlf:
                skip = min(self._crlf, n - pos)
                if data[pos:pos + skip] != b"\r\n"[2 - self._crlf:2 - self._crlf + skip]:
                    raise MalformedResponse("bad chunked encoding (missing CRLF after chunk)")
                pos += skip
                self._crlf -= skip
            else:
                nl = data.find(b"\n", pos)
                if nl < 0:
                    self._line += data[pos:]
                    if len(self._line) > MAX_CHUNK_LINE:
                        raise MalformedResponse("bad chunked encoding (line too long)")
                    break
                line = self._line + data[pos:nl]
                self._line = b""
                pos = nl + 1
                if line[-1:] == b"\r":
                    line = line[:-1]
                else:  # a bare LF: read as a line end, but not pooled again (see below)
                    self._reusable = False
                if self._trailers:
                    if not line:  # the blank line after the trailers: done
                        if pos < n:
                            self._reusable = False  # bytes after the response
                        return b"".join(out), True, False
                    continue
                raw_size = line.split(b";", 1)[0]
                size_text = raw_size.strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise MalformedResponse(
                        f"bad chunked encoding (chunk size {size_text[:20]!r})") from None
                if size < 0:
                    raise MalformedResponse("bad chunked encoding (negative size)")
                if (not size_text.isalnum() or 0x78 in size_text or 0x58 in size_text
                        or raw_size[:1] in (b" ", b"\t")):
                    # chunk-size is 1*HEXDIG, and int() also reads "+5", " 5", "0_5" and
                    # "0x5": the client gets the body framed anew, but a server that
                    # writes such sizes (or bare LF line ends) may mean another framing
                    # than the one read here, so the connection is not pooled again —
                    # its next bytes could become another client's response (desync
                    # checks: such responses were relayed and their connection reused)
                    self._reusable = False
                if size == 0:
                    self._trailers = True
                else:
                    self._left = size
        return (out[0] if len(out) == 1 else b"".join(out)), False, whole

    def _finish(self, reusable: bool, last: bytes = b"") -> None:
        """The response ended; ``last`` is body bytes that came with its end."""
        self._state = _IDLE if reusable else _CLOSED
        self._reusable = reusable
        if reusable:
            self.resume_reading()  # an idle connection must notice the upstream closing it
        sink = self._sink
        if sink is not None:
            if last:
                sink.on_last(last)
            else:
                sink.on_end()


class UpstreamPool:
    """Keep-alive connections to one upstream origin (``http://`` or ``https://``)."""

    def __init__(self, base_url: str, connect_timeout_s: float,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        u = urlsplit(base_url)
        self.https = u.scheme == "https"
        host = u.hostname or "localhost"
        if ":" in host:  # a zone is written %25 in a URL (RFC 6874): fe80::1%25eth0
            host = host.replace("%25", "%", 1)
        self.host = host
        self.port = u.port or (443 if self.https else 80)
        default = 443 if self.https else 80
        # an IPv6 literal in brackets, without its zone (fe80::1%eth0): a zone means
        # something on this host only, and a Host field has no room for it (RFC 6874 §4,
        # RFC 9110 §7.2)
        shown = f"[{host.partition('%')[0]}]" if ":" in host else host
        self.host_header = shown if self.port == default else f"{shown}:{self.port}"
        self.prefix = u.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self._ssl: ssl.SSLContext | None = (
            (ssl_context or ssl.create_default_context()) if self.https else None)
        self._idle: deque[UpstreamConnection] = deque()
        self._all: set[UpstreamConnection] = set()

    def take_idle(self) -> UpstreamConnection | None:
        """An idle keep-alive connection now, or None when there is none."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if conn.usable:
                conn.reused = True
                return conn
        return None

    async def acquire(self, fresh: bool = False) -> UpstreamConnection:
        """An idle keep-alive connection, or a new one. Raises ConnectFailed/ConnectTimeout."""
        if not fresh:
            conn = self.take_idle()
            if conn is not None:
                return conn
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, proto = await loop.create_connection(
                    lambda: UpstreamConnection(self), self.host, self.port, ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None)
        except TimeoutError:
            raise ConnectTimeout(
                f"connecting to {self.host_header} took over {self.connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self.host_header}: "
                                f"{exc.strerror or exc}", exc) from exc
        self._all.add(proto)
        return proto

    def release(self, conn: UpstreamConnection) -> None:
        """Back to the pool when it can carry another request; closed otherwise."""
        if conn.reusable and len(self._idle) < IDLE_MAX:
            self._idle.append(conn)
        else:
            conn.close()

    def forget(self, conn: UpstreamConnection) -> None:
        self._all.discard(conn)
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)

    def close(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._idle.clear()

    def request_bytes(self, method: str, target: str, fields: bytes, body: bytes,
                      with_length: bool) -> bytes:
        """The request as it goes upstream: ``target`` (path and query as the client sent
        them) under the upstream's path prefix, ``Host`` rewritten, the client's other
        headers byte for byte (``fields``: their lines, from
        :func:`llmtop.proxy.headers.upstream_field_lines`), ``Content-Length`` for the
        body actually sent."""
        # (``*``, asterisk-form, names the server itself: no prefix before it — QA:
        # ``OPTIONS *`` went to an upstream at /v1 as ``OPTIONS /v1*``)
        prefix = self.prefix if target != "*" else ""
        line = (f"{method} {prefix}{target} HTTP/1.1\r\nHost: {self.host_header}\r\n"
                .encode("utf-8", "surrogateescape"))
        if with_length:
            return b"".join((line, fields, b"Content-Length: %d\r\n\r\n" % len(body), body))
        return b"".join((line, fields, b"\r\n", body))
