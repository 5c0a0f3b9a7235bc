"""A harness for request-smuggling (desync) checks over real sockets: an upstream on raw
asyncio sockets that keeps every byte it receives per connection and frames requests
strictly (exactly one of ``Content-Length`` or ``Transfer-Encoding: chunked``, CRLF line
ends, no folding or control bytes), and a raw-socket client that reads the responses it
gets back with a strict framing of its own.

The upstream answers each request it frames with a small JSON body naming the request
(``{"up": N, ...}``, N counting requests across all connections), so a client can tell
which upstream request its answer belongs to (a target starting with ``/slow``: after
0.3 s). A framing it cannot read exactly is noted
in ``UpConn.errors`` (a desync: the proxy sent something another server may read
differently) and the connection is closed.

A request whose target starts with ``/hostile/NAME`` is answered by ``responses[NAME]``
instead — ``(answer, late)``: ``answer`` now, and ``late`` before the answer to the next
request on the same connection (bytes the upstream meant as part of this response, which
the proxy did not read as such): the response-side checks. A proxy that pools such a
connection again hands ``late`` to another client as the start of its response.

Imported by test_rel_desync*.py (pytest puts this directory on ``sys.path``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")


@dataclass
class Framed:
    """One request as the upstream framed it."""

    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    framing: str
    """``length``, ``chunked`` or ``none``."""
    n: int
    """Its number across all connections (1, 2, …)."""

    def header(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.headers if k.lower() == name]


@dataclass
class UpConn:
    """One proxy→upstream connection as the upstream saw it."""

    index: int
    late: bytes = b""
    """Bytes to send before the next answer (see the module docstring)."""
    raw: bytearray = field(default_factory=bytearray)
    requests: list[Framed] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    closed: bool = False


class FramingError(Exception):
    pass


def frame_request(buf: bytes) -> tuple[tuple[bytes, bytes, list[tuple[bytes, bytes]],
                                              bytes, str], int] | None:
    """The first request in ``buf`` framed strictly, and the bytes it took; None when it
    is not complete yet. Raises FramingError for anything two servers might frame
    differently."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if b"\n" in buf.replace(b"\r\n", b"") or len(buf) > 65536:
            raise FramingError(f"bare LF or an overlong head in {bytes(buf[:80])!r}")
        return None
    head = buf[:end]
    lines = head.split(b"\r\n")
    for line in lines:
        if b"\r" in line or b"\n" in line:
            raise FramingError(f"bare CR or LF in {line[:80]!r}")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or parts[2] != b"HTTP/1.1":
        raise FramingError(f"bad request line {lines[0][:80]!r}")
    method, target, _ = parts
    if not target or not re.fullmatch(rb"[!-~]+", target):
        raise FramingError(f"bad target {target[:80]!r}")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise FramingError(f"bad field line {line[:80]!r}")
        value = value.strip(b" \t")
        if not _VALUE.fullmatch(value):
            raise FramingError(f"control byte in {line[:80]!r}")
        headers.append((name, value))
    lengths = [v for k, v in headers if k.lower() == b"content-length"]
    codings = [v for k, v in headers if k.lower() == b"transfer-encoding"]
    hosts = [v for k, v in headers if k.lower() == b"host"]
    if len(hosts) != 1:
        raise FramingError(f"{len(hosts)} Host fields")
    if lengths and codings:
        raise FramingError("both Content-Length and Transfer-Encoding")
    if len(lengths) > 1 or len(codings) > 1:
        raise FramingError("repeated framing field")
    pos = end + 4
    if lengths:
        if not lengths[0].isdigit():
            raise FramingError(f"Content-Length {lengths[0]!r}")
        n = int(lengths[0])
        if len(buf) < pos + n:
            return None
        return (method, target, headers, bytes(buf[pos:pos + n]), "length"), pos + n
    if codings:
        if codings[0] != b"chunked":
            raise FramingError(f"Transfer-Encoding {codings[0]!r}")
        body = bytearray()
        while True:
            nl = buf.find(b"\r\n", pos)
            if nl < 0:
                return None
            size_text = buf[pos:nl]
            if not re.fullmatch(rb"[0-9a-fA-F]{1,8}", size_text):
                raise FramingError(f"chunk size {bytes(size_text[:20])!r}")
            size = int(size_text, 16)
            pos = nl + 2
            if size == 0:
                if buf[pos:pos + 2] == b"\r\n":
                    return (method, target, headers, bytes(body), "chunked"), pos + 2
                if len(buf) < pos + 2:
                    return None
                raise FramingError("trailers sent upstream")
            if len(buf) < pos + size + 2:
                return None
            if buf[pos + size:pos + size + 2] != b"\r\n":
                raise FramingError("no CRLF after a chunk")
            body += buf[pos:pos + size]
            pos += size + 2
    return (method, target, headers, b"", "none"), pos


class RecordingUpstream:
    """The upstream (see the module docstring)."""

    def __init__(self, responses: dict[str, tuple[bytes, bytes]] | None = None) -> None:
        self.responses = responses or {}
        self.conns: list[UpConn] = []
        self.count = 0
        self.url = ""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def requests(self) -> list[Framed]:
        return sorted((r for c in self.conns for r in c.requests), key=lambda r: r.n)

    @property
    def errors(self) -> list[str]:
        return [e for c in self.conns for e in c.errors]

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        port = int(self._server.sockets[0].getsockname()[1])
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()  # every connection's read then ends
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2.0)

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        conn = UpConn(len(self.conns))
        self.conns.append(conn)
        self._writers.add(writer)
        buf = b""
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    if buf:
                        conn.errors.append(f"closed with {len(buf)} bytes unframed")
                    return
                conn.raw += data
                buf += data
                while buf:
                    try:
                        got = frame_request(buf)
                    except FramingError as exc:
                        conn.errors.append(str(exc))
                        return
                    if got is None:
                        break
                    (method, target, headers, body, framing), used = got
                    buf = buf[used:]
                    self.count += 1
                    req = Framed(method, target, headers, body, framing, self.count)
                    conn.requests.append(req)
                    if not await self._answer(writer, req, conn):
                        return
        except ConnectionError:
            pass
        finally:
            conn.closed = True
            self._tasks.discard(task)  # type: ignore[arg-type]
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, req: Framed, conn: UpConn
                      ) -> bool:
        late, conn.late = conn.late, b""
        if req.target.startswith(b"/slow"):  # an answer that takes a while
            await asyncio.sleep(0.3)
        if req.target.startswith(b"/hostile/"):
            answer, conn.late = self.responses[req.target.split(b"/")[2].decode()]
            writer.write(late + answer)
            await writer.drain()
            return True
        body = json.dumps({"up": req.n, "conn": conn.index, "len": len(req.body),
                           "method": req.method.decode("latin-1"),
                           "target": req.target.decode("latin-1")}).encode()
        writer.write(late + b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        return True


@contextlib.asynccontextmanager
async def recording_upstream(responses: dict[str, tuple[bytes, bytes]] | None = None
                             ) -> AsyncIterator[RecordingUpstream]:
    up = RecordingUpstream(responses)
    await up.start()
    try:
        yield up
    finally:
        await up.close()


@dataclass
class Answer:
    """One response as a strict client framed it."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.headers if k.lower() == name]

    @property
    def up(self) -> int | None:
        """The upstream request number this answers (None: not the upstream's answer)."""
        try:
            got = json.loads(self.body)
        except ValueError:
            return None
        return got.get("up") if isinstance(got, dict) else None


def read_responses(data: bytes, head_request: bool = False
                   ) -> tuple[list[Answer], bytes, bool]:
    """The responses in ``data`` (what a client read until the connection closed), the
    bytes left over that are not a whole response, and whether the framing was clean."""
    out: list[Answer] = []
    pos = 0
    while pos < len(data):
        start = pos
        end = data.find(b"\r\n\r\n", pos)
        if end < 0:
            return out, data[pos:], False
        lines = data[pos:end].split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
            return out, data[pos:], False
        status = int(status_line[1])
        headers = [(k, v.strip()) for k, _, v in (ln.partition(b":") for ln in lines[1:])]
        lengths = [v for k, v in headers if k.lower() == b"content-length"]
        codings = [v for k, v in headers if k.lower() == b"transfer-encoding"]
        if (lengths and codings) or len(lengths) > 1 or len(codings) > 1:
            return out, data[pos:], False
        pos = end + 4
        if status in (204, 304) or 100 <= status < 200 or head_request:
            body = b""
        elif lengths:
            n = int(lengths[0])
            if len(data) < pos + n:
                return out, data[start:], False
            body = data[pos:pos + n]
            pos += n
        elif codings:
            if codings[0].lower() != b"chunked":
                return out, data[pos:], False
            parts = []
            while True:
                nl = data.find(b"\r\n", pos)
                if nl < 0:
                    return out, data[pos:], False
                size = int(data[pos:nl].split(b";")[0], 16)
                pos = nl + 2
                if size == 0:
                    tail = data.find(b"\r\n\r\n", pos - 2)
                    if tail < 0:
                        return out, data[pos:], False
                    pos = tail + 4
                    break
                parts.append(data[pos:pos + size])
                pos += size + 2
            body = b"".join(parts)
        else:
            body = data[pos:]
            pos = len(data)
        if 100 <= status < 200:
            continue
        out.append(Answer(status, headers, body))
    return out, b"", True


@dataclass
class Exchanged:
    """What a raw client read back: the bytes, and whether the proxy closed the
    connection (False: it was still open when the client stopped reading)."""

    raw: bytes
    closed: bool


async def exchange(port: int, *pieces: bytes, expect: int | None = None, eof: bool = False,
                   read_s: float = 3.0, gap_s: float = 0.05) -> Exchanged:
    """Send ``pieces`` on a fresh connection (``gap_s`` apart: separate reads at the proxy;
    ``eof``: then shut the client's sending side) and read until the proxy closes the
    connection, ``expect`` whole responses have come, or ``read_s`` passes quietly."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out = b""
    closed = False
    try:
        for i, piece in enumerate(pieces):
            if i:
                await asyncio.sleep(gap_s)
            writer.write(piece)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        if eof:
            writer.write_eof()
        with contextlib.suppress(TimeoutError, ConnectionError):
            while True:
                async with asyncio.timeout(read_s):
                    chunk = await reader.read(65536)
                if not chunk:
                    closed = True
                    break
                out += chunk
                if expect is not None:
                    answers, left, clean = read_responses(out)
                    if clean and not left and len(answers) >= expect:
                        break
        return Exchanged(out, closed)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
