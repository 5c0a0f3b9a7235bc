"""Helpers shared by the dialect parsers: safe JSON, bounded bodies, the common state.

Nothing here is part of the relay's interface (that is ``base.StreamParser`` and
``registry``); it exists so that every dialect reads JSON, counts and errors the same way.
"""

from __future__ import annotations

import json
import json.scanner
import re
from abc import ABC, abstractmethod
from typing import Any, Final

import orjson

MAX_EVENT_BYTES: Final = 16 * 1024 * 1024
"""Largest SSE line/event or NDJSON line a parser holds; a larger one is discarded and
sets ``error`` (memory stays bounded whatever the upstream sends)."""
MAX_BODY_BYTES: Final = 32 * 1024 * 1024
"""Largest non-streaming body a parser accumulates to read usage from at ``finish()``."""
MAX_ERROR_CHARS: Final = 300
MAX_MODEL_CHARS: Final = 200
MAX_UPSTREAM_ID_CHARS: Final = 128
"""The most characters of the engine's own id of a request kept (its ``X-Request-Id``, or
the ``chatcmpl-…``/``msg_…`` id of its answer): real ones are 20–60."""

ZERO: Final[tuple[int, int]] = (0, 0)


class _Bad:
    """The result of ``loads`` on bytes that are not JSON (a sentinel, never equal to data)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "BAD"


BAD: Final = _Bad()


_scan_once = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
"""The C scanner ``json.loads`` ends up in, without its three Python layers."""


def loads(data: bytes | bytearray) -> Any:
    """``json.loads`` that returns ``BAD`` instead of raising (bad UTF-8, bad JSON, too deep).

    orjson reads what it can: a stream event in ~1 µs where ``json`` takes ~3.4 µs, on the
    forwarding loop, once per event. What it refuses and ``json`` takes (lone surrogates,
    ``NaN``, numbers past a double, a BOM) goes to ``json``, so nothing is read as ``BAD``
    that was read before. (One difference: an integer past 64 bits comes back as a float,
    and so is no token count — no engine counts that high.) A JSON object then goes
    straight to the C scanner: bytes starting ``{`` and then a non-NUL byte are UTF-8 by
    ``json.loads``' own encoding detection, so the result is the same, three Python calls
    cheaper."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        if data[:1] == b"{" and data[1:2] != b"\x00":
            text = data.decode("utf-8", "surrogatepass")
            try:
                obj, end = _scan_once(text, 0)
            except StopIteration:
                return BAD
            if end != len(text) and text[end:].strip(" \t\n\r"):
                return BAD  # extra data after the object
            return obj
        return json.loads(data)
    except (ValueError, RecursionError, TypeError):
        return BAD


class _LastEvent:
    """The last stream event ``loads_event`` read: its bytes and what they decoded to,
    held as one tuple swapped whole (a reader on another thread sees a matching pair)."""

    pair: tuple[bytes, Any] = (b"", BAD)


def loads_event(data: bytes) -> Any:
    """``loads`` for stream events, remembering the last one: the usage-chunk stripper and
    the parser each read a stream's usage event (the stripper to drop it before the write,
    the parser after it), and the second read is then a byte comparison. The result is
    shared: callers read it and never change it."""
    raw, obj = _LastEvent.pair
    if len(data) == len(raw) and data == raw:
        return obj
    obj = loads(data)
    _LastEvent.pair = (data, obj)
    return obj


MAX_TOKENS: Final = 1 << 40
"""The largest token count taken from an engine (the recording's reader takes no more):
a counter bug's 2**63 made the metrics drop the whole request, not read it as no usage."""


def count(value: object) -> int | None:
    """A token count as the engine wrote it: an int (not a bool) in [0, MAX_TOKENS], else
    None (the request is then counted as if the engine had sent no usage)."""
    if type(value) is int and 0 <= value <= MAX_TOKENS:
        return value
    return None


def as_text(value: str) -> str:
    """``value`` as text every output can carry: a lone surrogate (from a header byte that
    is not UTF-8, or a JSON ``\\udcff`` escape) becomes one U+FFFD, and a surrogate pair
    the character it stands for. Without this a single client-chosen user or model name
    makes UTF-8 encoders (the Prometheus exposition, a terminal) fail for as long as the
    name is shown. (Through UTF-8 with ``surrogatepass``, each lone surrogate read as its
    three bytes: ``bad\\xff`` showed as ``bad`` and three U+FFFD.)"""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return value


def upstream_id_text(value: object) -> str | None:
    """The engine's id of a request as a record keeps it: a non-empty string cut to
    :data:`MAX_UPSTREAM_ID_CHARS`, as text every output can carry (:func:`as_text`); None
    for anything else (JSON ``null``, a number, ``""``)."""
    if not isinstance(value, str) or not value:
        return None
    return as_text(value[:MAX_UPSTREAM_ID_CHARS])


def error_text(err: object) -> str:
    """A short one-line description of an error object from an upstream."""
    text: str
    if isinstance(err, str):
        text = err
    elif isinstance(err, dict):
        msg = err.get("message")
        if isinstance(msg, str) and msg:
            text = msg
        elif isinstance(msg, dict):  # e.g. {"error": {"message": {"detail": ...}}}
            text = repr(msg)[: MAX_ERROR_CHARS + 1]
        else:
            typ = err.get("type") or err.get("error_type") or err.get("code")
            text = str(typ) if isinstance(typ, str | int) and typ != "" else repr(err)
    else:
        text = repr(err)
    text = " ".join(text[: MAX_ERROR_CHARS * 2].split())
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 1] + "…"
    return as_text(text) or "error"


_KIND_PART = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}|[0-9]{1,6}")
"""A part of an error's kind that is kept: a short identifier (``invalid_request_error``,
``context_length_exceeded``, ``BadRequestError``) or a short number (``400``)."""


def kind_part(value: object) -> str | None:
    """``value`` when it is a short machine word the engine wrote as an error's type or
    code — a string matching ``[A-Za-z][A-Za-z0-9_.-]{0,63}`` or of at most six digits,
    or a non-negative int of at most six digits (as digits) — else None. Free text, long
    strings, non-ASCII, control characters, floats, bools, lists and objects are dropped:
    a ``type`` or ``code`` that quotes the prompt never gets through."""
    if type(value) is int:
        return str(value) if 0 <= value < 1_000_000 else None
    if type(value) is str and _KIND_PART.fullmatch(value) is not None and value != "error":
        return value  # "error" (Anthropic's envelope type) says nothing
    return None


def error_kind(err: object) -> str | None:
    """The machine-readable kind of an error object: its ``type`` (else ``error_type``)
    and its ``code``, each kept only when ``kind_part`` keeps it, joined by ``/``
    (``invalid_request_error/context_length_exceeded``, ``BadRequestError/400``,
    ``overloaded_error``, ``validation``); None when neither is kept or ``err`` is not an
    object. Unlike ``error_text`` it carries no text the user wrote, so it is recorded
    even when prompt text may not be."""
    if not isinstance(err, dict):
        return None
    kind: str | None = None
    for key in ("type", "error_type"):
        kind = kind_part(err.get(key))
        if kind is not None:
            break
    code = kind_part(err.get("code"))
    if code is None or code == kind:
        return kind
    return code if kind is None else f"{kind}/{code}"


def error_kind_of(obj: dict[str, Any]) -> str | None:
    """The kind of the error in an upstream's error body or event ``obj``: of its
    ``error`` object when it has one (OpenAI, llama.cpp, Anthropic), else of ``obj``
    itself (vLLM's bare ``{"object": "error", "type": ..., "code": ...}``, TGI's
    ``{"error": "...", "error_type": ...}``). Ollama's ``{"error": "..."}`` has none."""
    err = obj.get("error")
    return error_kind(err if isinstance(err, dict) else obj)


class ParserState:
    """The attributes of ``base.StreamParser`` and the small setters every dialect uses.

    ``usage_seen`` is True exactly when ``usage_completion_tokens`` is known.
    """

    __slots__ = ("_response_id", "ended", "error", "error_kind", "model",
                 "usage_completion_tokens", "usage_prompt_tokens", "usage_seen")

    def __init__(self) -> None:
        self.ended = False
        self.usage_prompt_tokens: int | None = None
        self.usage_completion_tokens: int | None = None
        self.model: str | None = None
        self._response_id: str | None = None
        self.error: str | None = None
        self.error_kind: str | None = None
        self.usage_seen: bool = False

    def _fail(self, message: str, kind: str | None = None) -> None:
        """Set ``error`` (and ``error_kind``, the upstream's machine-readable kind of it)
        unless an error was set already: the first one wins, with its own kind."""
        if self.error is None:
            self.error = message
            self.error_kind = kind

    def _set_model(self, model: object) -> None:
        if self.model is None and isinstance(model, str) and model:
            self.model = as_text(model[:MAX_MODEL_CHARS])

    @property
    def response_id(self) -> str | None:
        """The engine's id of the answer, once its body has named it (see
        ``base.StreamParser``)."""
        return self._response_id

    def _set_response_id(self, value: object) -> None:
        """The answer's own id (``chatcmpl-…``, ``msg_…``), the first one given."""
        if self._response_id is None:
            self._response_id = upstream_id_text(value)

    def _set_completion(self, value: object) -> int | None:
        n = count(value)
        if n is not None:
            self.usage_completion_tokens = n
            self.usage_seen = True
        return n

    def _set_prompt(self, value: object) -> None:
        n = count(value)
        if n is not None:
            self.usage_prompt_tokens = n


class JSONBodyParser(ParserState, ABC):
    """A non-streaming JSON response: bytes are accumulated (bounded) and read at ``finish()``.

    ``feed`` always returns ``(0, 0)``. ``finish`` returns ``(1, tokens)`` when the body
    carries output content (``tokens`` = the usage's completion tokens, else 1), ``(0, 0)``
    otherwise. A body over ``max_body_bytes`` is not kept: it counts as one content event
    of unknown size ``(1, 1)`` and sets no error (it is large, not malformed). A body that
    is not JSON sets ``error``.
    """

    __slots__ = ("_buf", "_finished", "_max", "_overflow")

    def __init__(self, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        super().__init__()
        self._buf = bytearray()
        self._max = max_body_bytes
        self._overflow = False
        self._finished = False

    @property
    def buffered_bytes(self) -> int:
        """Bytes held now (never more than ``max_body_bytes``)."""
        return len(self._buf)

    def feed(self, data: bytes) -> tuple[int, int]:
        if self._overflow or self._finished or not data:
            return ZERO
        if len(self._buf) + len(data) > self._max:
            self._overflow = True
            self._buf = bytearray()
        else:
            self._buf += data
        return ZERO

    def finish(self) -> tuple[int, int]:
        if self._finished:
            return ZERO
        self._finished = True
        if self._overflow:
            return (1, 1)
        body = bytes(self._buf)
        self._buf = bytearray()
        if not body.strip():
            return ZERO
        obj = loads(body)
        if obj is BAD:
            self._fail("malformed JSON body")
            return ZERO
        if not self._interpret(obj):
            return ZERO
        n = self.usage_completion_tokens
        return (1, n if n is not None else 1)

    @abstractmethod
    def _interpret(self, obj: Any) -> bool:
        """Read usage, model and errors from the decoded body; True if it has output content."""


def text_or_none(value: object) -> str | None:
    """``value`` when it is a non-empty string, else None (a request's ``model`` or ``user``
    as a client wrote it: anything else names nothing)."""
    return value if isinstance(value, str) and value else None
