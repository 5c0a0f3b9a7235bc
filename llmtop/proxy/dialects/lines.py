"""Incremental, bounded line splitting for byte streams read in arbitrary pieces.

Used by the SSE framer (``\\r\\n``, ``\\n`` and a lone ``\\r`` all end a line) and the
NDJSON reader (only ``\\n`` ends a line). The work per read is a few C-level bytes
operations (``in``, ``replace``, ``rfind``, ``split``) — no per-byte Python loop.
"""

from __future__ import annotations

from llmtop.proxy.dialects._common import MAX_EVENT_BYTES

_LF = 0x0A
_CR = 0x0D


class LineSplitter:
    """Turns reads into complete lines (without their line ends).

    * A line split across reads at any byte is returned once it is complete.
    * With ``cr_is_eol`` a ``\\r`` at the end of one read followed by ``\\n`` at the start
      of the next is ONE line end (the line is returned at the ``\\r`` — nothing is held
      back waiting to see whether a ``\\n`` follows).
    * The unfinished line is held in a buffer of at most ``max_line`` bytes. A longer line
      sets ``error``, is dropped, and everything up to its line end is skipped; splitting
      resumes with the next line.
    """

    __slots__ = ("_buf", "_cr_is_eol", "_discarding", "_max", "_prev_cr", "error")

    def __init__(self, max_line: int = MAX_EVENT_BYTES, *, cr_is_eol: bool = True) -> None:
        self._buf = bytearray()
        self._max = max_line
        self._cr_is_eol = cr_is_eol
        self._prev_cr = False
        self._discarding = False
        self.error: str | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the unfinished line held now (never more than ``max_line``)."""
        return len(self._buf)

    @property
    def at_line_start(self) -> bool:
        """Nothing is pending: the next byte starts a new line (no partial line, no line
        being discarded, no ``\r`` whose ``\n`` may follow)."""
        return not self._buf and not self._discarding and not self._prev_cr

    def feed(self, data: bytes) -> list[bytes]:
        """The lines completed by ``data``, in order."""
        if not data:
            return []
        if self._cr_is_eol:
            if self._prev_cr:
                self._prev_cr = False
                if data[0] == _LF:  # the second half of a \r\n split across reads
                    data = data[1:]
                    if not data:
                        return []
            if 0x0D in data:
                self._prev_cr = data[-1] == _CR
                data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if 0x0A not in data:
            self._hold(data)
            return []
        lines = data.split(b"\n")
        rest = lines.pop()
        if self._discarding:
            # the first completed line is the tail of an oversized line: drop it
            self._discarding = False
            del lines[0]
        elif self._buf:
            self._buf += lines[0]
            lines[0] = bytes(self._buf)
            self._buf.clear()
        if len(data) > self._max or (lines and len(lines[0]) > self._max):
            kept = [line for line in lines if len(line) <= self._max]
            if len(kept) != len(lines):
                self._overflow()
                lines = kept
        if rest:
            self._hold(rest)
        return lines

    def finish(self) -> bytes | None:
        """The last line if the stream ended without a line end, else None."""
        self._prev_cr = False
        if self._discarding:
            self._discarding = False
            return None
        if not self._buf:
            return None
        line = bytes(self._buf)
        self._buf.clear()
        return line

    def _hold(self, data: bytes) -> None:
        if self._discarding:
            return
        if len(self._buf) + len(data) > self._max:
            self._buf = bytearray()
            self._discarding = True
            self._overflow()
        else:
            self._buf += data

    def _overflow(self) -> None:
        if self.error is None:
            self.error = f"line longer than {self._max} bytes discarded"
