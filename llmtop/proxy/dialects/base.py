"""What the relay needs from a stream dialect.

A parser is a plain synchronous object fed a *copy* of each upstream read. It never
touches the bytes the client receives and never raises out of ``feed``/``finish``: a
malformed stream sets ``error`` and parsing carries on as well as it can.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class StreamParser(Protocol):
    """Observes one response body (streaming or not).

    ``feed`` returns ``(content_events, tokens)`` completed by this read: how many
    content-bearing events (text, tool-call or reasoning deltas; not role-only, empty,
    finish or usage-only events) ended in ``data``, and how many output tokens they carry
    — exact when the stream says so (continuous usage, Ollama/TGI per-token events), else
    one per content event. The relay timestamps the read and records one chunk when
    ``content_events > 0``.

    Notes on the implementations in this package (``registry.make_parser`` builds them):
    an event is reported by the ``feed`` call whose bytes complete it, never later; a
    non-streaming (JSON) body is reported by ``finish()`` as one content event carrying the
    usage's completion tokens; ``finish()`` may be called twice (the second call returns
    ``(0, 0)``); each also has a ``buffered_bytes`` property (what it holds now, bounded by
    its limit whatever the upstream sends). ``error`` is the upstream's own message for an
    error event or error body (e.g. ``Overloaded``; ``error_kind`` its kind), or a short
    description of malformed data (e.g. ``malformed JSON in stream event``,
    ``line longer than 16777216 bytes discarded``).
    """

    usage_prompt_tokens: int | None
    """From the engine's usage, when the stream carried it."""
    usage_completion_tokens: int | None
    model: str | None
    """The model the response names, when it does."""

    @property
    def response_id(self) -> str | None:
        """The engine's own id of the answer, when its body gives one: the top-level ``id``
        of an OpenAI-style stream's first chunk or JSON body (``chatcmpl-…``, ``cmpl-…``;
        the Responses API's ``response.id``, ``resp_…``), Anthropic's ``message_start``
        ``message.id`` (``msg_…``), SGLang's ``meta_info.id`` (its ``/generate``: the
        first output's); at most 128 characters, safe text
        (``_common.upstream_id_text``). Ollama and TGI name none. Read where the model is
        read, once; the OpenAI stream parser decodes it from its first event when asked."""
        ...

    error: str | None
    """Set on an error event mid-stream or malformed data (first one wins)."""
    error_kind: str | None
    """The machine-readable kind of the upstream's error that set ``error``, when it gave
    one: its ``type``/``error_type`` and ``code``, each kept only when it is a short
    identifier or number (``invalid_request_error/context_length_exceeded``,
    ``BadRequestError/400``, ``overloaded_error``, ``validation``), joined by ``/``. It
    never holds free text (see ``_common.error_kind``), so it is recorded where ``error``
    — which may quote the prompt — is not. None for llmtop's own findings (malformed
    data) and errors without a kind (Ollama's ``{"error": "..."}``). An error *body*
    (HTTP 4xx/5xx, non-streamed) sets both too, at ``finish()``."""
    usage_seen: bool
    """True once a usage object (final or continuous) has been read — in this package,
    exactly when ``usage_completion_tokens`` is not None."""
    ended: bool
    """The stream's own end marker has been read (OpenAI ``data: [DONE]``, Anthropic
    ``message_stop``, Ollama ``"done": true``, TGI's final event with ``details`` or
    ``generated_text``, the Responses API's ``response.completed``/``incomplete``/
    ``failed``): a client that leaves after it has the whole answer."""

    def feed(self, data: bytes) -> tuple[int, int]: ...

    def finish(self) -> tuple[int, int]:
        """End of body: complete a last event that had no trailing blank line/newline."""
        ...


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What llmtop reads from a request body (parsed once per request, not per chunk)."""

    model: str | None = None
    user: str | None = None
    stream: bool = False
    wants_usage: bool = False
    """The client itself asked for usage in the stream (OpenAI ``stream_options``)."""
    sends_usage: bool = False
    """The API always sends usage with its answer (the Responses API's
    ``response.completed``): there is nothing to ask for, and the proxy leaves the body
    as it is (``inject_usage`` does not apply)."""
    prompts: int = 1
    """How many prompts the request holds: a legacy completions request's ``prompt`` may be
    a list of them (``["a", "b"]``, or lists of token ids), each answered with its own
    choices; 1 for anything else (a string, one list of token ids)."""
    n: int = 1
    """Choices asked for per prompt (``n``)."""
