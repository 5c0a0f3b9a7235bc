"""Asking an OpenAI-style upstream for usage, and hiding the answer from the client.

Counting one token per chunk is wrong whenever an engine packs several tokens into one
chunk, so for a streaming request that did not ask for usage the proxy may add
``stream_options.include_usage: true`` upstream (``add_include_usage``) and remove the
resulting usage-only events before they reach the client (``UsageChunkStripper``), so the
client sees what it would have seen. (Most upstreams send one usage event for the whole
answer; llama.cpp sends one per choice when ``n > 1``: every one of them is removed.)
Upstreams that reject the option answer 400/422 naming it (``is_usage_rejection``); the
proxy then retries without it and remembers.
Upstreams whose usage event carries more than usage cannot have it removed without the
client losing those fields: ``UsageChunkStripper.extra_fields`` says so, and the proxy stops
injecting for them (they count their answers themselves). llama.cpp is one: its server adds
``timings`` to the *last* event of each choice's final write (``deltas.back()`` in its
``to_json_oaicompat_chat_stream``) — the finish event when no usage was asked for, the
usage-only event after it when it was. So for a response that names itself
``Server: llama.cpp`` the proxy uses a :class:`TimingsRestorer`: it holds a chat finish
event back until the event after it has come and, when that is a usage-only event it
removes, puts the fields beyond usage (the bytes of ``"timings":{...}`` as llama.cpp wrote
them) back at the end of the finish event — which is then byte for byte the finish event
llama.cpp sends without ``include_usage``, so the first stream's client loses nothing either.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from llmtop.proxy.dialects._common import BAD, MAX_EVENT_BYTES, loads, loads_event
from llmtop.proxy.dialects.sse import SSEFramer

__all__ = ["TimingsRestorer", "UsageChunkStripper", "add_include_usage", "is_usage_event",
           "is_usage_rejection", "stripper_for"]

_EOL = re.compile(rb"\r\n|\r|\n")
_CHOICES_EMPTY = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_CHOICES_NONEMPTY = re.compile(rb'"choices"\s*:\s*\[\s*\{')
_USAGE_KEY = b'"usage"'
_LF = 0x0A
_CR = 0x0D
_WS = b" \t\r\n"
_INJECT: Final = b'"stream_options":{"include_usage":true},'
USAGE_EVENT_KEYS: Final = frozenset((
    "id", "object", "created", "model", "system_fingerprint", "choices", "usage",
    "service_tier", "obfuscation"))
"""What a usage-only event of the OpenAI API (and vLLM, SGLang) holds: removing it loses
the client nothing it would have had without ``include_usage``."""

# What a "\r" at the very end of a read closed; a "\n" starting the next read is part of
# the same line end and goes where that line went.
_CR_NONE, _CR_LINE, _CR_EMITTED, _CR_DROPPED = 0, 1, 2, 3


def is_usage_event(block: bytes) -> bool:
    """True if ``block`` (the raw bytes of one SSE event) is a usage-only chunk:
    ``choices: []`` with a ``usage`` object. Cheap byte checks first; JSON only if they pass.
    """
    return _usage_object(block) is not None


def _usage_object(block: bytes) -> dict[str, Any] | None:
    """The decoded usage-only chunk ``block`` holds (see ``is_usage_event``), or None."""
    found = _usage_event(block)
    return None if found is None else found[0]


def _usage_event(block: bytes) -> tuple[dict[str, Any], bytes] | None:
    """The decoded usage-only chunk ``block`` holds and its JSON text, or None."""
    if block.find(_USAGE_KEY) < 0 or _CHOICES_EMPTY.search(block) is None:
        return None
    datas: list[bytes]
    if block.startswith(b"data:") and block.find(b"\n") == len(block) - 2 and (
            block.endswith(b"\n\n") and 0x0D not in block):
        # one "data:" line and its blank line (the common case): what the framer gives
        datas = [block[6:-2] if block[5:6] == b" " else block[5:-2]]
    else:
        framer = SSEFramer(len(block) + 1)
        datas = [ev.data for ev in framer.feed(block) + framer.finish()]
    for data in datas:
        obj = loads_event(data)
        if isinstance(obj, dict) and obj.get("choices") == [] and isinstance(
            obj.get("usage"), dict
        ):
            return obj, data
    return None


class UsageChunkStripper:
    """Removes the usage-only events from an OpenAI-style SSE stream, byte-exact otherwise.

    ``filter(data)`` returns the bytes to write to the client for this read; ``flush()``
    the bytes still held at the end of the body. Output == input minus exactly the bytes of
    every usage-only event (its lines and its terminating blank line), however the input
    was split into reads. Most upstreams send one, last; llama.cpp sends one per choice of
    an ``n > 1`` request, each as soon as its choice ends (before the other choices' later
    events), and a client that did not ask for usage must see none of them.

    Holding: every *complete* event in a read is returned at once. Only a trailing
    incomplete event may be held until its blank line arrives (a read can therefore
    return ``b""``, which the caller should not write) — and not even that once its bytes
    show a non-empty ``"choices": [{`` (it cannot be a usage event): from there its bytes
    are returned as they arrive. A held event is bounded by ``max_event_bytes``; a larger
    one is released unchanged. ``removed`` counts the events removed so far.
    """

    __slots__ = ("_at_rest", "_cr", "_has_line", "_held", "_line_open", "_max", "_moved",
                 "_passing", "extra_fields", "removed", "stripped")

    _release = _CHOICES_NONEMPTY
    """A held partial event whose bytes match this goes out as it comes (it cannot be a
    usage event)."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._held = bytearray()
        self._max = max_event_bytes
        self._passing = False  # the open event was released: forward its bytes as they come
        self._has_line = False  # the open event has a complete non-empty line
        self._line_open = False  # the last read ended inside a line
        self._cr = _CR_NONE
        self._at_rest = True
        """At an event boundary with nothing held or open (the state the fast path of
        ``filter`` needs; recomputed after every other read)."""
        self.stripped = False
        """A usage event has been removed."""
        self.removed = 0
        """How many usage events have been removed."""
        self.extra_fields = False
        """A removed event held fields beyond :data:`USAGE_EVENT_KEYS` (e.g. llama.cpp's
        ``timings``): the upstream counts its answers itself. Here the client did not get
        them; a :class:`TimingsRestorer` puts them back where they belong."""
        self._moved: list[tuple[int, tuple[dict[str, Any], bytes]]] | None = None
        """Where removed events with such fields were in this call's output, and what
        they were (kept only by a :class:`TimingsRestorer`)."""

    @property
    def buffered_bytes(self) -> int:
        """Bytes held back now (never more than ``max_event_bytes``)."""
        return len(self._held)

    def filter(self, data: bytes) -> bytes:
        """The bytes of ``data`` (plus any held before) that may be written now."""
        if (
            self._at_rest
            and data.endswith(b"\n\n")
            and 0x0D not in data
            and (data.find(_USAGE_KEY) < 0 or _CHOICES_EMPTY.search(data) is None)
        ):
            # Fast path: whole "\n"-framed events from an event boundary, none of which can
            # be the usage event: all of it goes out, and the next read starts a new event.
            return data
        out = self._filter(data)
        self._at_rest = (self._cr == _CR_NONE and not self._held and not self._passing
                         and not self._line_open)
        return out

    def _filter(self, data: bytes) -> bytes:
        if not data:
            return b""
        cr, self._cr = self._cr, _CR_NONE
        if (
            data.endswith(b"\n\n")
            and cr == _CR_NONE
            and not self._held
            and not self._passing
            and not self._line_open
            and 0x0D not in data
            and data[0] != _LF
            and data.find(b"\n\n\n") < 0
        ):
            # Whole "\n"-framed events from an event boundary, some of which may be usage
            # events (typically the last read: finish chunk, usage, [DONE]): each event block
            # ends at a "\n\n", as the line loop below would find, without the loop.
            kept = b""  # what goes out of data[:keep]
            pos = keep = 0
            n = len(data)
            while pos < n:
                end = data.find(b"\n\n", pos) + 2
                if data.find(_USAGE_KEY, pos, end) >= 0:
                    found = self._strippable(data[pos:end])
                    if found is not None:
                        kept += data[keep:pos]
                        keep = end
                        self._removed(found, len(kept))
                pos = end
            return data if not keep else kept + data[keep:]
        out: list[bytes] = []
        pos = 0  # data[:pos] is dealt with
        line_start = 0
        if cr != _CR_NONE and data[0] == _LF:
            line_start = 1
            if cr == _CR_EMITTED:
                out.append(data[:1])
                pos = 1
            elif cr == _CR_DROPPED:  # the end of a removed event's blank line
                pos = 1
        held = self._held
        last_kind = _CR_NONE
        for m in _EOL.finditer(data, line_start):
            s, e = m.span()
            if s == line_start and not self._line_open:  # a blank line ends an event
                last_kind = _CR_EMITTED
                if self._passing:
                    out.append(data[pos:e])
                else:
                    block = bytes(held) + data[pos:e] if held else data[pos:e]
                    held.clear()
                    found = self._strippable(block) if self._has_line else None
                    if found is not None:
                        self._removed(found, sum(map(len, out)))  # and on to the next event
                        last_kind = _CR_DROPPED
                    else:
                        out.append(block)
                pos = e
                self._passing = False
                self._has_line = False
            else:
                self._has_line = True
                last_kind = _CR_LINE
            self._line_open = False
            line_start = e
        n = len(data)
        if data[-1] == _CR:
            self._cr = last_kind
        if line_start < n:
            self._line_open = True
        if pos < n:
            if self._passing:
                out.append(data[pos:])
            else:
                old = len(held)
                held += data[pos:]
                if len(held) > self._max or self._release.search(held, max(0, old - 64)):
                    out.append(bytes(held))
                    held.clear()
                    self._passing = True
        return b"".join(out)

    def _removed(self, found: tuple[dict[str, Any], bytes], at: int) -> None:
        """``found``, the decoded usage event and its JSON text, was removed where the
        output of this call is ``at`` bytes long."""
        self.stripped = True
        self.removed += 1
        if not USAGE_EVENT_KEYS.issuperset(found[0]):
            self.extra_fields = True
            if self._moved is not None:
                self._moved.append((at, found))

    def _strippable(self, block: bytes) -> tuple[dict[str, Any], bytes] | None:
        """The decoded usage event ``block`` is (and its JSON text), if it may be removed;
        else None."""
        # The same limits as for a held partial event, so that the result never depends on
        # where the reads were split: an event that would have been released early (it
        # shows a non-empty "choices": [{, or it is too big to hold) is never removed.
        if len(block) > self._max or _CHOICES_NONEMPTY.search(block) is not None:
            return None
        return _usage_event(block)

    def flush(self) -> bytes:
        """End of body: the held bytes, unless they are a usage event without its blank line."""
        self._cr = _CR_NONE
        self._line_open = False
        self._at_rest = not self._passing
        if not self._held:
            return b""
        block = bytes(self._held)
        self._held.clear()
        self._has_line = False
        found = self._strippable(block)
        if found is not None:
            self._removed(found, 0)
            return b""
        return block


_RELEASE_LLAMACPP = re.compile(rb'"choices"\s*:\s*\[\s*\{\s*"finish_reason"\s*:\s*null')
_FINISH = b'"finish_reason":"'
_EMPTY_DELTA = b'"delta":{}'
_JSON_SPACE = frozenset(" \t\n\r")
_DECODER = json.JSONDecoder()


class TimingsRestorer(UsageChunkStripper):
    """A :class:`UsageChunkStripper` for llama.cpp (a response that says
    ``Server: llama.cpp``), which also gives the client back what llama.cpp moved into the
    usage event: the client's bytes are exactly llama.cpp's without ``include_usage``.

    llama.cpp writes each choice's last events in one write: its finish event (a chat
    chunk with ``"finish_reason":"..."`` and ``"delta":{}``), then, when usage was asked
    for, the usage-only event, and it adds ``timings`` to whichever of them is last. So a
    complete finish event is held back (not written) until the next event's bytes decide:
    a usage-only event that is removed puts its members beyond :data:`USAGE_EVENT_KEYS`
    back at the end of the finish event (their bytes as llama.cpp wrote them, in their
    order), which then goes out; anything else lets it go out as it was, before it. A
    partial event is released early only once it shows llama.cpp's content chunk start
    (``"choices":[{"finish_reason":null``), so a finish event split across reads is held
    whole too. ``restored`` counts the usage events whose fields were put back; a removed
    one whose fields found no finish event just before it (not llama.cpp's layout) is lost
    to the client as with the plain stripper (``extra_fields`` says so either way).

    Only the first streams to a llama.cpp upstream pass through here: the proxy stops
    injecting once ``extra_fields`` was seen. The per-read cost of the plain stripper,
    which every other upstream gets, is unchanged.
    """

    __slots__ = ("_pending", "restored")

    _release = _RELEASE_LLAMACPP

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        super().__init__(max_event_bytes)
        self._pending = b""
        """A complete finish event held back, at an event boundary."""
        self.restored = 0
        """How many removed usage events had their extra fields put back."""
        self._moved = []

    @property
    def buffered_bytes(self) -> int:
        return len(self._held) + len(self._pending)

    def filter(self, data: bytes) -> bytes:
        out = UsageChunkStripper.filter(self, data)
        if self._pending or self._moved:
            out = self._settle(out)
        elif out.find(_FINISH) < 0:  # (a content read: the common case)
            return out
        return self._hold_last(out)

    def flush(self) -> bytes:
        out = UsageChunkStripper.flush(self)
        return self._settle(out) if self._pending or self._moved else out

    def _settle(self, out: bytes) -> bytes:
        """``out`` after the finish event held before it, with what the usage events
        removed from it moved back (see :meth:`_put_back`)."""
        pending = self._pending
        moved = self._moved
        assert moved is not None
        out = pending + out
        self._pending = b""
        if moved:
            out = self._put_back(out, len(pending), moved)
            moved.clear()
        return out

    def _hold_last(self, out: bytes) -> bytes:
        """``out`` less its last event when that is a finish event and ``out`` ends at an
        event boundary (a partial event after it may be held, not passing): that event is
        held until the next one is known."""
        if (out.endswith(b"\n\n") and not self._passing and self._cr == _CR_NONE
                and out.find(_FINISH) >= 0):
            start = out.rfind(b"\n\n", 0, len(out) - 2)
            start = 0 if start < 0 else start + 2
            last = out[start:]
            if last.find(_FINISH) >= 0 and last.find(_EMPTY_DELTA) >= 0 and (
                    _CHOICES_EMPTY.search(last) is None):
                self._pending = last
                return out[:start]
        return out

    def _put_back(self, out: bytes, base: int,
                  moved: list[tuple[int, tuple[dict[str, Any], bytes]]]) -> bytes:
        """``out`` with the extra members of each removed event in ``moved`` (at
        ``base + at`` in ``out``) added to the end of the event just before it."""
        for at, (obj, text) in reversed(moved):
            end = base + at
            head = out[:end].rstrip(b"\r\n")
            start = max(head.rfind(b"\n"), head.rfind(b"\r")) + 1
            target = head[start:]
            extra = _extra_members(text, obj)
            if (extra is None or not head.endswith(b"}") or target.find(_FINISH) < 0
                    or any(target.find(b'"%s"' % key) >= 0 for key in extra[1])):
                continue  # not llama.cpp's layout: lost to the client, as by the stripper
            cut = len(head) - 1
            out = out[:cut] + extra[0] + out[cut:]
            self.restored += 1
        return out


def _extra_members(text: bytes, obj: dict[str, Any]) -> tuple[bytes, list[bytes]] | None:
    """The members of the JSON object ``text`` (decoded: ``obj``) beyond
    :data:`USAGE_EVENT_KEYS`, as ``,"key":value`` each, their bytes as written, and their
    keys' bytes; None when ``text`` cannot be read so (or its keys are not plain)."""
    try:
        s = text.decode("utf-8")
        spans = _member_spans(s)
    except (ValueError, RecursionError):
        return None
    if spans is None or len(spans) != len(obj):
        return None
    parts: list[str] = []
    keys: list[bytes] = []
    for key, start, end in spans:
        if key not in USAGE_EVENT_KEYS:
            raw_key = s[start:s.index(":", start)].rstrip(" \t\n\r")
            if raw_key != '"' + key + '"' or "\\" in raw_key:
                return None
            parts.append("," + s[start:end])
            keys.append(key.encode("utf-8"))
    return ("".join(parts).encode("utf-8"), keys) if parts else None


def _member_spans(s: str) -> list[tuple[str, int, int]] | None:
    """Each top-level member of the JSON object ``s``: its key, where its key's quote
    starts and where its value ends. None if ``s`` is not one object; raises ValueError
    on malformed JSON."""
    i = _skip(s, 0)
    if s[i:i + 1] != "{":
        return None
    i = _skip(s, i + 1)
    spans: list[tuple[str, int, int]] = []
    if s[i:i + 1] == "}":
        return spans
    while True:
        if s[i:i + 1] != '"':
            return None
        key, j = _DECODER.raw_decode(s, i)
        j = _skip(s, j)
        if s[j:j + 1] != ":":
            return None
        _, end = _DECODER.raw_decode(s, _skip(s, j + 1))
        spans.append((key, i, end))
        k = _skip(s, end)
        c = s[k:k + 1]
        if c == "}":
            return spans
        if c != ",":
            return None
        i = _skip(s, k + 1)


def _skip(s: str, i: int) -> int:
    """Where the JSON whitespace from ``s[i]`` on ends."""
    while i < len(s) and s[i] in _JSON_SPACE:
        i += 1
    return i


def stripper_for(headers: list[tuple[bytes, bytes]]) -> UsageChunkStripper:
    """The stripper for a response with these header fields: a :class:`TimingsRestorer`
    when the upstream names itself llama.cpp (``Server: llama.cpp``), else the plain one."""
    for name, value in headers:
        if len(name) == 6 and name.lower() == b"server" and value.startswith(b"llama.cpp"):
            return TimingsRestorer()
    return UsageChunkStripper()


def add_include_usage(body: bytes) -> bytes | None:
    """``body`` with ``stream_options.include_usage = true``, or None when not applicable.

    Not applicable: not a JSON object, not ``"stream": true``, usage already requested, or
    ``stream_options`` of an unexpected type. A ``continuous_usage_stats`` asked without
    ``include_usage`` (which gives no usage: vLLM's ``should_include_usage``) is turned
    off with it, so that the stream the client gets carries no usage, as asked.

    When the request has no ``stream_options`` the option is spliced in after the opening
    brace, so every other byte of the client's body is unchanged; otherwise the object is
    re-encoded. Never raises.
    """
    obj = loads(body) if body else BAD
    if not isinstance(obj, dict) or obj.get("stream") is not True:
        return None
    if "stream_options" not in obj:
        stripped = body.lstrip(_WS)
        i = len(body) - len(stripped)
        if stripped[:1] == b"{" and body[i + 1 : i + 2] != b"\x00":
            return body[: i + 1] + _INJECT + body[i + 1 :]
        obj["stream_options"] = {"include_usage": True}
    else:
        opts = obj["stream_options"]
        if opts is None:
            obj["stream_options"] = {"include_usage": True}
        elif isinstance(opts, dict):
            if opts.get("include_usage") is True:
                return None
            opts["include_usage"] = True
            if opts.get("continuous_usage_stats"):
                # vLLM sends usage in every chunk only with include_usage as well: asked
                # alone, the client gets none, and with include_usage added it would get
                # usage in each chunk (the stripper removes only the usage-only chunk)
                opts["continuous_usage_stats"] = False
        else:
            return None
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except (ValueError, TypeError, RecursionError):
        return None


def is_usage_rejection(status: int, body: bytes) -> bool:
    """True if an upstream answered 400/422 because it does not accept ``stream_options``."""
    if status not in (400, 422) or not body:
        return False
    head = body[:65536].lower()
    return b"stream_options" in head or b"include_usage" in head
