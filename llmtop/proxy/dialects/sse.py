"""An incremental Server-Sent Events framer (the WHATWG ``text/event-stream`` rules).

Shared by the openai, anthropic and tgi dialects. Feed it each read as it arrives; it
returns the events those bytes completed:

* events split across reads at any byte; ``\\r\\n``, ``\\n`` and lone ``\\r`` line ends
  (a ``\\r`` ending one read and a ``\\n`` starting the next are one line end);
* ``:`` comment lines (keep-alives) are skipped; ``id:``/``retry:``/unknown fields ignored;
* several ``data:`` lines in one event are joined with ``\\n``; one space after the colon
  is dropped; ``event:`` names the event; a leading byte-order mark is ignored;
* an event still open at EOF (no trailing blank line) is completed by ``finish()``;
* memory is bounded: a line or an event larger than ``max_event_bytes`` sets ``error`` and
  is discarded; framing continues with the next event.
"""

from __future__ import annotations

from typing import NamedTuple

from llmtop.proxy.dialects._common import MAX_EVENT_BYTES, ZERO, ParserState
from llmtop.proxy.dialects.lines import LineSplitter

_BOM = b"\xef\xbb\xbf"


class SSEEvent(NamedTuple):
    """One dispatched event: its ``event:`` name ("" when absent) and its data bytes."""

    event: str
    data: bytes


_event = tuple.__new__
"""``_event(SSEEvent, (name, data))`` is ``SSEEvent(name, data)`` without the NamedTuple's
Python-level ``__new__`` (a third of the cost of framing a read of whole events)."""


class SSEFramer:
    """Bytes in, complete ``SSEEvent``s out. Never raises on any input."""

    __slots__ = ("_data", "_event", "_first", "_lines", "_max", "_size", "_skip", "error")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._lines: LineSplitter | None = None  # made at the first read that needs it
        self._max = max_event_bytes
        self._data: list[bytes] = []
        self._size = 0
        self._event = ""
        self._skip = False  # the current event overflowed: drop lines until its blank line
        self._first = True
        self.error: str | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes held now: the unfinished line plus the open event's data."""
        return (self._lines.buffered_bytes if self._lines is not None else 0) + self._size

    @property
    def idle(self) -> bool:
        """At an event boundary with nothing pending: no partial line or event, no ``event:``
        name, no event being discarded, the byte-order-mark check done. A read that is one
        whole one-line ``data:`` event then yields exactly that event and leaves it idle."""
        return (
            not self._first
            and not self._data
            and not self._event
            and not self._skip
            and (self._lines is None or self._lines.at_line_start)
        )

    def feed(self, data: bytes) -> list[SSEEvent]:
        """The events completed by ``data``."""
        splitter = self._lines
        at_line_start = splitter is None or splitter.at_line_start
        if (
            self._first
            and data
            and at_line_start
            and not data.startswith(_BOM[: len(data)])
        ):
            self._first = False  # no byte-order mark to drop
        if (
            data.endswith(b"\n\n")
            and not self._first
            and not self._data
            and not self._event
            and not self._skip
            and len(data) <= self._max
            and at_line_start
            and 0x0D not in data
        ):
            return self._whole_events(data)
        if splitter is None:
            splitter = self._lines = LineSplitter(self._max, cr_is_eol=True)
        lines = splitter.feed(data)
        if splitter.error is not None and self.error is None:
            self.error = splitter.error
        return self._process(lines) if lines else []

    def finish(self) -> list[SSEEvent]:
        """End of stream: the last line without a line end, and an event without its blank
        line, are completed."""
        last = self._lines.finish() if self._lines is not None else None
        out = self._process([last]) if last is not None else []
        if self._data and not self._skip:
            out.append(_event(SSEEvent, (self._event, b"\n".join(self._data))))
        self._reset()
        return out

    def _whole_events(self, data: bytes) -> list[SSEEvent]:
        """Fast path: a read of whole ``\n``-framed events starting at an event boundary
        (the common case on the forwarding path). A one-line ``data:`` block becomes an
        event directly; any other block goes through the line rules."""
        blocks = data.split(b"\n\n")
        blocks.pop()  # b"" after the final blank line
        out: list[SSEEvent] = []
        for block in blocks:
            if block.startswith(b"data:") and 0x0A not in block:
                out.append(_event(SSEEvent, ("", block[6:] if block[5:6] == b" " else block[5:])))
            else:
                lines = block.split(b"\n")
                lines.append(b"")
                out.extend(self._process(lines))
        return out

    def _reset(self) -> None:
        self._data = []
        self._size = 0
        self._event = ""
        self._skip = False

    def _process(self, lines: list[bytes]) -> list[SSEEvent]:
        out: list[SSEEvent] = []
        if self._first:
            self._first = False
            if lines[0].startswith(_BOM):
                lines[0] = lines[0][3:]
        for line in lines:
            if not line:  # blank line: dispatch
                if self._data and not self._skip:
                    out.append(_event(SSEEvent, (self._event, b"\n".join(self._data))))
                self._reset()
                continue
            if line[0] == 0x3A:  # ":" comment / keep-alive
                continue
            if line.startswith(b"data:"):
                value = line[6:] if line[5:6] == b" " else line[5:]
            else:
                i = line.find(b":")
                if i < 0:
                    name, value = line, b""
                else:
                    name = line[:i]
                    value = line[i + 2 :] if line[i + 1 : i + 2] == b" " else line[i + 1 :]
                if name == b"event":
                    self._event = value.decode("utf-8", "replace")
                    continue
                if name != b"data":
                    continue  # id, retry, unknown fields
            if self._skip:
                continue
            self._size += len(value) + 1
            if self._size > self._max:
                self._data = []
                self._size = 0
                self._skip = True
                if self.error is None:
                    self.error = f"SSE event larger than {self._max} bytes discarded"
                continue
            self._data.append(value)
        return out


class SSEStreamParser(ParserState):
    """Base of the dialects whose streams are plain SSE (Anthropic, TGI): frames each read
    and hands the completed events to ``_handle``; a framing error fails the stream."""

    __slots__ = ("_sse",)

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        super().__init__()
        self._sse = SSEFramer(max_event_bytes)

    @property
    def buffered_bytes(self) -> int:
        return self._sse.buffered_bytes

    def feed(self, data: bytes) -> tuple[int, int]:
        events = self._sse.feed(data)
        if self._sse.error is not None:
            self._fail(self._sse.error)
        return self._handle(events) if events else ZERO

    def finish(self) -> tuple[int, int]:
        events = self._sse.finish()
        return self._handle(events) if events else ZERO

    def _handle(self, events: list[SSEEvent]) -> tuple[int, int]:
        """Content events and tokens completed by ``events``."""
        return ZERO
