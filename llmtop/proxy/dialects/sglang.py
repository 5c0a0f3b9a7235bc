"""SGLang's native API: ``POST /generate``, streamed as SSE or answered as one JSON body.

TGI serves ``/generate`` too, so the request body tells them apart
(``is_sglang_request``): SGLang's ``GenerateReqInput`` takes ``text`` (a string or a list:
a batch), ``input_ids`` or ``input_embeds``, with ``sampling_params`` (``max_new_tokens``,
``n``, …), ``stream``, ``rid``; TGI's takes ``inputs`` and ``parameters``.

What SGLang writes, as read in its source (sgl-project/sglang, ``python/sglang/srt/``):

* ``entrypoints/http_server.py`` ``generate_request`` (``POST``/``PUT /generate``): with
  ``stream`` true, ``text/event-stream`` of ``data: <orjson of one output>\\n\\n``, then
  ``data: [DONE]\\n\\n``; a ``ValueError`` mid-stream is written as
  ``data: {"error": {"message": "..."}}`` before the ``[DONE]``. Not streamed: the one
  output as JSON (a list of them for a batch), or HTTP 400
  ``{"error": {"message": "..."}}`` (``_create_error_response``); a request that fails
  validation gets FastAPI's error turned into 400 ``{"object": "error", "message",
  "type", "code"}`` (``ErrorResponse``).
* ``managers/tokenizer_manager.py`` ``_handle_batch_output``: an output is ``{"text",
  "output_ids", "meta_info"}`` with ``meta_info`` ``{"id", "finish_reason",
  "prompt_tokens", "completion_tokens", "cached_tokens", …}`` (``e2e_latency`` once
  finished); ``completion_tokens`` is the sequence's count so far. ``text`` and
  ``output_ids`` are the whole output so far, unless the server runs with
  ``--incremental-streaming-output`` (then each event carries only its own). The
  scheduler sends a streamed request's output every ``stream_interval`` decode steps, and
  ``_wait_one_response`` passes on only the last of the outputs queued meanwhile, so one
  event may carry several tokens. ``finish_reason`` is null until the last event, then
  ``{"type": "length", "length"}``, ``{"type": "stop", "matched"}`` or, for a request the
  server gave up, ``{"type": "abort", "message", "status_code", "err_type"}``
  (``managers/schedule_batch.py`` ``FINISH_*.to_json``).
* ``managers/io_struct.py`` ``GenerateReqInput``: ``text``/``input_ids`` lists, or
  ``sampling_params.n`` > 1, make a batch; ``_stream_batch_responses`` then streams every
  sequence's outputs interleaved, each with an ``index`` (its place in the batch; the
  ``n`` samples of a prompt are consecutive) and its own ``meta_info``.

Hence: an event is content when its sequence's ``completion_tokens`` went up, and carries
that many tokens (an event repeating the count, e.g. a last one with only its
``finish_reason``, is not content); ``usage_completion_tokens`` is the sum of every
sequence's latest count, ``usage_prompt_tokens`` the sum of their ``prompt_tokens`` (for
``n`` > 1 SGLang reports the prompt once per sample, and so does the sum). Without
``completion_tokens`` (not SGLang itself: something SGLang-shaped), an event with text
or token ids counts one token and the usage stays unknown (``token_source`` ``chunks``).
``data: [DONE]`` ends the stream. The answer's id (``response_id``, the record's
``upstream_id`` when the response has no ``X-Request-Id``) is ``meta_info.id``, SGLang's
``rid`` (the request's own ``rid`` when it gave one, else a uuid4 hex): the first output
event's, or the first output's of a body; a batch names its first sequence's (streamed:
the sequence of the first event). It is read from the ``meta_info`` every event has
decoded anyway, at a sequence's first event (with its ``prompt_tokens``), so the events
after it cost nothing more. An ``error`` object, or an ``abort`` finish, sets
``error`` (its kind: ``err_type`` and ``status_code``). Events grow with the output (the
whole output so far in each): one of ``META_ONLY_BYTES`` or more is read by its
``meta_info`` alone, found in the bytes, so that the forwarding path's cost per event
does not grow with the output's length.
"""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

from llmtop.proxy.dialects._common import (
    BAD,
    MAX_EVENT_BYTES,
    ZERO,
    JSONBodyParser,
    ParserState,
    count,
    error_kind,
    error_kind_of,
    error_text,
    loads,
    text_or_none,
)
from llmtop.proxy.dialects.base import RequestInfo
from llmtop.proxy.dialects.sse import SSEEvent, SSEStreamParser

__all__ = ["SGLangBodyParser", "SGLangStreamParser", "inspect_sglang_request",
           "is_sglang_request"]

_DONE = b"[DONE]"
_INPUT_KEYS = ("text", "input_ids", "input_embeds", "sampling_params")
"""A request naming any of these (and no ``inputs``) is SGLang's."""
_QUOTED_KEYS = tuple(f'"{k}"'.encode() for k in _INPUT_KEYS)

META_ONLY_BYTES: Final = 1024
"""An output event at least this long is read by its ``meta_info`` alone (``_meta_only``).
SGLang sends the whole output so far in every event, so decoding each in full costs more
with every token (about 100 µs an event at 2,000 tokens, 2 µs at the first: the sum grows
with the square of the output's length); its ``meta_info`` stays a few hundred bytes."""
_META = b'"meta_info":{'
_INDEX_TAIL = re.compile(rb',"index":([0-9]{1,9})\}\Z')
"""A batch's output ends ``…},"index":N}`` (``_stream_batch_responses`` adds it last)."""


def _fail_on(state: ParserState, obj: dict[str, Any], meta: object) -> bool:
    """Set ``error`` for an error object or an ``abort`` finish; True when ``obj`` was an
    error object (it carries no output)."""
    err = obj.get("error")
    if err is not None:
        state._fail(error_text(err), error_kind_of(obj))
        return True
    if obj.get("object") == "error":  # FastAPI's validation error, as SGLang words it
        state._fail(error_text(obj), error_kind(obj))
        return True
    if isinstance(meta, dict):
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type") == "abort":
            state._fail(error_text(finish.get("message") or "aborted"),
                        error_kind({"type": finish.get("err_type"),
                                    "code": finish.get("status_code")}))
    return False


def _has_output(obj: dict[str, Any]) -> bool:
    return bool(obj.get("text")) or bool(obj.get("output_ids"))


def _meta_only(data: bytes, start: int = 0, stop: int | None = None
               ) -> tuple[dict[str, Any], int] | None:
    """The ``meta_info`` and ``index`` of an output event (``data[start:stop]``) as SGLang
    writes it (orjson, no spaces: ``{"text":…,"output_ids":[…],"meta_info":{…}}``, with
    ``,"index":N`` before the last brace in a batch), read without decoding the text and
    ids before it; None for any other shape (the caller decodes the whole event). The
    ``"meta_info":{`` found last is the member's own: inside a JSON string every ``"`` is
    escaped, and a key of a nested object would leave more than the outer brace after its
    value. (The text and ids are not checked for being well-formed JSON.)"""
    if stop is None:
        stop = len(data)
    i = data.rfind(_META, start, stop)
    if i < 0:
        return None
    end = stop - 1
    index = 0
    if data[end - 1 : stop] != b"}}":
        m = _INDEX_TAIL.search(data, max(start, end - 20), stop)
        if m is None:
            return None
        end, index = m.start(), int(m[1])
    try:
        meta = orjson.loads(data[i + len(_META) - 1 : end])
    except orjson.JSONDecodeError:
        return None
    return (meta, index) if type(meta) is dict else None


class SGLangStreamParser(SSEStreamParser):
    """An SGLang ``/generate`` SSE stream (see the module docstring for what counts)."""

    __slots__ = ("_counts", "_max", "_prompts")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        super().__init__(max_event_bytes)
        self._max = max_event_bytes
        self._counts: dict[int, int] = {}  # index → its completion_tokens so far
        self._prompts: dict[int, int] = {}  # index → its prompt_tokens

    def feed(self, data: bytes) -> tuple[int, int]:
        if (
            len(data) >= META_ONLY_BYTES
            and data.startswith(b"data: {")
            and data.endswith(b"}\n\n")
            and data.find(b"\n", 7) == len(data) - 2  # one line, then the blank line
            and 0x0D not in data
            and len(data) <= self._max
            and self._sse.idle
            and (found := _meta_only(data, 6, len(data) - 2)) is not None
        ):
            # Fast path for the common large read: one whole output event from an idle
            # framer, which the framer would hand on as it is and stay idle after; its
            # meta_info read where it lies (framing copies the whole event, twice).
            _fail_on(self, {}, found[0])
            k = self._count(*found)
            if k is not None:
                return (1, k) if k else ZERO
        return super().feed(data)

    def _handle(self, events: list[SSEEvent]) -> tuple[int, int]:
        n = tokens = 0
        for ev in events:
            data = ev.data
            if data == _DONE:
                self.ended = True
                continue
            k: int | None = None
            if len(data) >= META_ONLY_BYTES and (found := _meta_only(data)) is not None:
                _fail_on(self, {}, found[0])
                k = self._count(*found)
            if k is None:  # a small event, another shape, or no engine count: all of it
                obj = loads(data)
                if not isinstance(obj, dict):
                    if obj is BAD:
                        self._fail("malformed JSON in stream event")
                    continue
                meta = obj.get("meta_info")
                if _fail_on(self, obj, meta):
                    continue
                index = obj.get("index", 0)
                k = self._count(meta, index if type(index) is int else 0)
                if k is None:  # no engine count: one token per event with output
                    k = 1 if _has_output(obj) else 0
            if k:
                n += 1
                tokens += k
        return (n, tokens)

    def _count(self, meta: object, index: int) -> int | None:
        """The tokens an output event of sequence ``index`` adds (0: no content); None
        when its ``meta_info`` has no ``completion_tokens``. A sequence's first event
        gives its ``prompt_tokens``, and the answer's id when none was read yet."""
        if not isinstance(meta, dict):
            return None
        prompts = self._prompts
        if index not in prompts:  # a sequence's first event (SGLang's: every one names it)
            if self._response_id is None:
                self._set_response_id(meta.get("id"))
            if (prompt := count(meta.get("prompt_tokens"))) is not None:
                prompts[index] = prompt
                self.usage_prompt_tokens = sum(prompts.values())
        done = count(meta.get("completion_tokens"))
        if done is None:
            return None
        counts = self._counts
        before = counts.get(index, 0)
        if done > before or index not in counts:
            counts[index] = max(before, done)
            self._set_completion(sum(counts.values()) if len(counts) > 1 else counts[index])
        return done - before if done > before else 0


class SGLangBodyParser(JSONBodyParser):
    """A non-streamed SGLang ``/generate`` answer: one output, a list of them (a batch),
    or an error."""

    __slots__ = ()

    def _interpret(self, obj: Any) -> bool:
        outputs = obj if isinstance(obj, list) else [obj]
        content = False
        completion: int | None = None
        prompt: int | None = None
        for out in outputs:
            if not isinstance(out, dict):
                continue
            meta = out.get("meta_info")
            if _fail_on(self, out, meta):
                continue
            if isinstance(meta, dict):
                self._set_response_id(meta.get("id"))  # the first output's (see the module)
                done = count(meta.get("completion_tokens"))
                if done is not None:
                    completion = (completion or 0) + done
                    content = content or done > 0
                p = count(meta.get("prompt_tokens"))
                if p is not None:
                    prompt = (prompt or 0) + p
            content = content or _has_output(out)
        self._set_completion(completion)
        self._set_prompt(prompt)
        return content


def is_sglang_request(body: bytes) -> bool:
    """``body`` is a request for SGLang's ``/generate``: a JSON object with ``text``,
    ``input_ids``, ``input_embeds`` or ``sampling_params`` and no ``inputs`` (TGI's).
    A body that names none of those keys is not parsed (a TGI request costs a few byte
    searches). Never raises."""
    if not body[:64].lstrip().startswith(b"{"):
        return False
    if not any(key in body for key in _QUOTED_KEYS):
        return False
    obj = loads(body)
    if not isinstance(obj, dict) or "inputs" in obj:
        return False
    return any(key in obj for key in _INPUT_KEYS)


def inspect_sglang_request(path: str, body: bytes) -> RequestInfo:
    """``stream`` from the body (false unless true, as SGLang reads it). SGLang's requests
    name no model; a ``model`` key (a router in front may add one) is read. Never raises."""
    obj = loads(body) if body else BAD
    if not isinstance(obj, dict):
        return RequestInfo()
    model = obj.get("model")
    return RequestInfo(model=text_or_none(model),
                       stream=obj.get("stream") is True)
