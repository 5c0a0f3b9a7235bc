"""OpenAI-compatible responses (``/v1/chat/completions``, ``/v1/completions``) and requests.

Served by vLLM, SGLang, llama.cpp, TGI's OpenAI route, LiteLLM and OpenAI itself.

Streams are SSE ``data: {json}`` events ending with ``data: [DONE]``. An event is
*content-bearing* when a choice has a non-empty ``delta.content``, ``delta.tool_calls``,
``delta.reasoning_content``/``delta.reasoning``, ``delta.refusal``, a legacy
``delta.function_call``, or (legacy completions) a non-empty ``text``. Role-only, empty,
finish-only and usage-only (``choices: []``) events are not.

Tokens: each content event counts one token, unless the event carries ``usage`` (vLLM's
``stream_options.continuous_usage_stats``, where ``usage.completion_tokens`` is
cumulative): then the event carries exactly the increase since the tokens already counted.
``usage`` on an event of one choice is that choice's (cumulative) figure: vLLM's continuous
usage counts each choice of an ``n > 1`` request on its own, and llama.cpp's legacy
completions (``/v1/completions``) put each choice's final usage on that choice's finish
event. So ``usage_completion_tokens`` is the last figure of each choice index, summed over
the choices (with ``n = 1``: the last one seen), and ``usage_prompt_tokens`` the last
prompt figure (the same prompt in each: counted once) — unless the request held a list of
prompts (``"prompt": ["a", "b"]``, told from its body: ``RequestInfo.prompts``), whose
choices ``i`` answer prompt ``i // n``, each with its own prompt's figure: the last one per
prompt, summed (``several_prompts``). Usage on an event that is not one
choice with an ``index`` is a figure for the whole answer: it replaces those before it.
Usage-only events (``choices: []``) are summed: vLLM and the OpenAI API send one for
the whole answer, but llama.cpp's chat completions send one per choice of an ``n > 1``
request (each with that choice's completion tokens and the whole prompt), so
``usage_completion_tokens`` is the sum of their completion tokens and
``usage_prompt_tokens`` the prompt once; once one was seen, usage on other events no
longer changes the figures.
Without any ``usage``, llama.cpp's ``timings`` (on its finish event — one per choice —
and on non-streamed answers) give them: ``predicted_n`` output tokens (the last per choice
index, summed over choices), ``prompt_n + cache_n`` prompt tokens — so its streams are
counted exactly when usage is not injected (see ``openai_usage``).

A non-streamed answer's ``usage`` (or, without it, ``timings``) is taken as it is. With
``n > 1`` llama.cpp's covers choice 0 only (its usage and its ``timings`` are the first
choice's; it sends no per-choice counts): the figures are then a lower bound, and no
count of the other choices is made up. (The same for a list of prompts: llama.cpp's
answer counts the first prompt and its first choice only.)

The usage-injection helpers (``add_include_usage``, ``UsageChunkStripper``,
``is_usage_rejection``) live in ``openai_usage`` and are re-exported here.

llama.cpp's own completion API (``POST /completion``, and ``/completions`` without
``/v1``) is read here too: its events and answers have no ``choices`` but a top-level
``content`` string and a ``stop`` flag (``_native_content``); a non-empty ``content`` is
content, and the last event's (or the answer's) ``timings`` give the counts as above.
"""

from __future__ import annotations

import re
from typing import Any

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
    loads_event,
    text_or_none,
    upstream_id_text,
)
from llmtop.proxy.dialects.base import RequestInfo
from llmtop.proxy.dialects.openai_usage import (
    UsageChunkStripper,
    add_include_usage,
    is_usage_rejection,
)
from llmtop.proxy.dialects.sse import SSEEvent, SSEFramer

__all__ = [
    "OpenAIBodyParser",
    "OpenAIStreamParser",
    "UsageChunkStripper",
    "add_include_usage",
    "inspect_openai_request",
    "is_usage_rejection",
]

_DONE = b"[DONE]"

# Fast path: most chunks are decided without json.loads. A non-empty string under one of
# these keys, or a non-empty tool_calls/function_call, marks content. Keys match only as
# keys: inside a JSON string every quote is escaped. Chunks that carry a usage object or an
# error, that do not look like one whole JSON object, and the first chunk (which names the
# model), are decoded in full. tests/proxy/test_dialect_openai.py checks that both paths
# agree on generated chunks.
_CONTENT_KEY = re.compile(
    rb'"(?:content|reasoning_content|reasoning|refusal|text)"\s*:\s*"[^"]'
    rb'|"(?:tool_calls|function_call)"\s*:\s*[\[{]\s*[^\s\]}]'
)
_USAGE_OBJ = re.compile(rb'"usage"\s*:\s*\{')
_PLAIN_START = (b"data: {", b"data:{")


def _text_like(v: object) -> bool:
    """A non-empty string, or content parts (list or object) with a non-empty ``text``."""
    if isinstance(v, str):
        return v != ""
    if isinstance(v, list):
        return any(isinstance(p, dict) and _text_like(p.get("text")) for p in v)
    if isinstance(v, dict):
        return _text_like(v.get("text"))
    return False


def _delta_has_content(d: dict[str, Any]) -> bool:
    for key in ("content", "reasoning_content", "reasoning", "refusal"):
        v = d.get(key)
        # absent, None and "" are no content; a non-empty string is (no call for either)
        if v and (v.__class__ is str or _text_like(v)):
            return True
    for key in ("tool_calls", "function_call"):
        v = d.get(key)
        if v and isinstance(v, list | dict):
            return True
    return False


def _choices_have_content(choices: object, key: str) -> bool:
    """``key`` is "delta" for stream chunks, "message" for whole responses."""
    if not choices or not isinstance(choices, list):
        return False
    for ch in choices:
        if not isinstance(ch, dict):
            continue
        d = ch.get(key)
        if isinstance(d, dict) and _delta_has_content(d):
            return True
        if _text_like(ch.get("text")):  # legacy completions
            return True
    return False


def _native_content(obj: dict[str, Any]) -> bool:
    """A content-bearing event or answer of llama.cpp's own completion API (``/completion``,
    ``/completions`` without ``/v1``): no ``choices``, a non-empty top-level ``content``
    string, and its ``stop`` flag."""
    content = obj.get("content")
    return (content.__class__ is str and content != "" and "stop" in obj
            and "choices" not in obj)


def _error_of(obj: dict[str, Any]) -> tuple[str, str | None] | None:
    """The error text and kind of an error body or event (None: ``obj`` is no error):
    ``{"error": {"message", "type", "code"}}`` (OpenAI, llama.cpp, newer vLLM),
    ``{"error": "...", "error_type": ...}`` (TGI's OpenAI route) or vLLM's bare
    ``{"object": "error", "message", "type", "code"}``."""
    err = obj.get("error")
    if err is not None:
        return error_text(err), error_kind_of(obj)
    if obj.get("object") == "error":  # vLLM's bare ErrorResponse
        return error_text(obj), error_kind(obj)
    return None


_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]*)"')
"""The model of a chunk, when written plainly (no escapes in it)."""
_FIRST_HELD_MAX = 4096
"""The first event is held for its ``id`` up to this size (a larger one is read at once)."""


def _one_index(choices: object) -> int | None:
    """The ``index`` of the one choice of an event; None when it has not exactly one
    choice with an integer index."""
    if isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict):
        i = choices[0].get("index")
        if type(i) is int:
            return i
    return None


class OpenAIStreamParser(ParserState):
    """An OpenAI-style SSE stream (see the module docstring for what counts)."""

    __slots__ = ("_counted", "_fast", "_first", "_max", "_per_choice", "_per_prompt",
                 "_prompt_per_index", "_sse", "_summed", "_usage_obj", "_usage_per_choice",
                 "_warm", "done")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        super().__init__()
        self._sse = SSEFramer(max_event_bytes)
        self._max = max_event_bytes
        self._counted = 0  # tokens attributed to content events so far
        self._warm = False  # one event was decoded in full (the model is read from it)
        self._fast = False  # _warm, and the framer is idle (see feed)
        self._usage_obj = False  # a ``usage`` object was seen (timings are then not read)
        self._summed: int | None = None  # completion tokens of the usage-only events, summed
        self._per_choice: dict[int, int] | None = None  # timings.predicted_n per choice index
        self._prompt_per_index: dict[int, int] | None = None  # native API: prompt per index
        self._usage_per_choice: dict[int, int] | None = None  # usage per choice index
        self._first: bytes | None = None  # the first event, for its id (see response_id)
        self._per_prompt = 0  # choices per prompt of a list of prompts (0: one prompt)
        self.done = False
        """``data: [DONE]`` was seen."""

    @property
    def buffered_bytes(self) -> int:
        return self._sse.buffered_bytes

    def several_prompts(self, prompts: int, n: int) -> None:
        """The request held a list of ``prompts`` prompts, ``n`` choices each (legacy
        completions; ``RequestInfo.prompts``): choice ``i`` answers prompt ``i // n`` (as
        llama.cpp and vLLM number them), and a choice's own usage (or ``timings``) gives
        its prompt's tokens — different prompts, summed, each once however many choices
        it has. A usage-only event's ``prompt_tokens`` (vLLM's, for the whole request) is
        taken as it is."""
        if prompts > 1 and n > 0:
            self._per_prompt = n

    def feed(self, data: bytes) -> tuple[int, int]:
        if self._fast and data.endswith(b"}\n\n"):
            # Fast path for the common read: exactly one whole `data: {...}` event, from an
            # idle framer, after the first event was decoded. It gives what the framer's own
            # whole-event path and _handle's byte path give for that read (and leaves the
            # framer idle, as they would); every other read, and every event that path would
            # decode in full (usage object, error), goes the full way below.
            end = len(data) - 2
            start = 6 if data.startswith(b"data: {") else 5 if data.startswith(b"data:{") else 0
            if (
                start
                and data.find(b"\n", start) == end  # one line: the only "\n"s end the event
                and 0x0D not in data  # an int: memchr, no TypeError fallback
                and end + 2 <= self._max
                and data.find(b'"error"') < 0
                and (data.find(b'"usage"') < 0 or _USAGE_OBJ.search(data, start, end) is None)
            ):
                # The patterns start with '"', which "data: " and "\n\n" lack, and the event
                # ends with "}", so searching all of ``data`` finds what the event holds.
                i = data.find(b'"content":"')
                if (i >= 0 and data[i + 11] != 0x22) or _CONTENT_KEY.search(
                    data, start, end
                ) is not None:
                    self._counted += 1
                    return (1, 1)
                if data.find(b'"timings"') < 0:  # llama.cpp's counts: decoded below
                    return ZERO
            elif start:
                got = self._plain_events(data)
                if got is not None:
                    return got
        elif self._fast and data.endswith(b"\n\n") and data.startswith(_PLAIN_START):
            got = self._plain_events(data)  # plain events, then one that is not ([DONE])
            if got is not None:
                return got
        return self._full(data)

    def _full(self, data: bytes) -> tuple[int, int]:
        """The full way: the framer's events, each decoded or decided by ``_handle``; the
        fast paths are open to the next read when the framer is idle after this one."""
        sse = self._sse
        events = sse.feed(data)
        if sse.error is not None:
            self._fail(sse.error)
        out = self._handle(events) if events else ZERO
        self._fast = self._warm and sse.idle
        return out

    def _plain_events(self, data: bytes) -> tuple[int, int] | None:
        """A read of several whole events starting with one-line ``data: {...}`` ones (a
        busy upstream's reads, or a client reading slower than the engine writes), from an
        idle framer after the first event was decoded: each plain event decided as the
        one-event fast path decides one — without the framer's event objects and the full
        path's checks, which cost ~2.5× as much per event. From the first block that is not
        such an event, or is one the full path would decode (usage object, error,
        llama.cpp's ``timings``, ``[DONE]``), the rest of the read goes the full way (the
        framer is idle at that event boundary, as it would be after the events before it):
        a stream's last read — its last tokens, the usage event, ``[DONE]`` — no longer
        takes every event in it the full way (a whole 32-token answer in one read: 44 →
        31 µs). None when the first block is not plain: the whole read goes the full way,
        nothing having changed here."""
        if 0x0D in data or len(data) > self._max:
            return None
        blocks = data.split(b"\n\n")
        blocks.pop()  # b"" after the last blank line
        # the first error or usage object: the full path decides its block and the rest
        cut = data.find(b'"error"')
        if data.find(b'"usage"') >= 0:
            m = _USAGE_OBJ.search(data)
            if m is not None and (cut < 0 or m.start() < cut):
                cut = m.start()
        if cut >= 0:
            del blocks[data.count(b"\n\n", 0, cut):]
        n = 0
        stop: bytes | None = None  # the first block not decided here
        for block in blocks:
            if (not block.startswith(_PLAIN_START) or not block.endswith(b"}")
                    or 0x0A in block):
                stop = block
                break
            i = block.find(b'"content":"')
            if (i >= 0 and block[i + 11] != 0x22) or _CONTENT_KEY.search(block) is not None:
                n += 1
            elif block.find(b'"timings"') >= 0:
                stop = block
                break
        if stop is None and cut < 0:  # every event plain (the common read)
            self._counted += n
            return (n, n)
        # (an equal block before ``stop`` would have stopped the loop there: the verdict
        # depends on the bytes alone, so the first equal one is it)
        taken = len(blocks) if stop is None else blocks.index(stop)
        if taken == 0:
            return None
        self._counted += n
        rn, rt = self._full(data[sum(map(len, blocks[:taken])) + 2 * taken:])
        return (n + rn, n + rt)

    def finish(self) -> tuple[int, int]:
        self._fast = False
        events = self._sse.finish()
        return self._handle(events) if events else ZERO

    def _model_from_bytes(self, data: bytes) -> bool:
        """The first event's model read off its bytes (the fast path needs it read once);
        False when it is not there plainly, and the event is then decoded in full. The
        event itself is kept for its ``id`` (:attr:`response_id`)."""
        m = _MODEL.search(data)
        if m is None:
            return False
        self._first = data
        if len(data) > _FIRST_HELD_MAX:
            self._read_first()
        self._set_model(m.group(1).decode("utf-8", "replace"))
        self._warm = True
        return True

    @property
    def response_id(self) -> str | None:
        """The top-level ``id`` of the first event, decoded when first asked for (by the
        record, or the live row), not on the forwarding path: :meth:`_model_from_bytes`
        keeps a reference to the event's bytes. Off the bytes a top-level ``id`` cannot be
        told from a tool call's without decoding them (llama.cpp writes ``choices`` before
        ``id``), and the byte searches that tried cost 5–10% of the per-read time of
        ``benchmarks/parser_throughput.py``'s 15-event stream. When the first event was
        decoded in full (or an event was, before the id was asked for), :meth:`_handle`
        read the id there."""
        if self._first is not None:
            self._read_first()
        return self._response_id

    def _read_first(self) -> None:
        """The first event's ``id``, from its bytes (taken before an id a later event gave:
        they are the same in every engine). The live row may ask from another thread than
        the relay's: each reads the bytes once, and both would find the same id."""
        first = self._first
        self._first = None
        if first is None:
            return
        obj = loads(first)
        if isinstance(obj, dict):
            rid = upstream_id_text(obj.get("id"))
            if rid is not None:
                self._response_id = rid

    def _handle(self, events: list[SSEEvent]) -> tuple[int, int]:
        n = tokens = 0
        for ev in events:
            data = ev.data
            if data == _DONE or (len(data) < 16 and data.strip() == _DONE):
                self.done = self.ended = True
                continue
            if (
                data.startswith(b"{")
                and data.endswith(b"}")
                and ev.event != "error"
                and data.find(b'"error"') < 0
                and (data.find(b'"usage"') < 0 or _USAGE_OBJ.search(data) is None)
                and (self._warm or self._model_from_bytes(data))
            ):
                i = data.find(b'"content":"')  # compact JSON, the common case
                if (i >= 0 and data[i + 11 : i + 12] != b'"') or _CONTENT_KEY.search(
                    data
                ) is not None:
                    n += 1
                    tokens += 1
                    self._counted += 1
                    continue
                if data.find(b'"timings"') < 0:  # llama.cpp's counts: decoded below
                    continue
            obj = loads_event(data)
            if obj is BAD or not isinstance(obj, dict):
                if ev.event == "error":
                    self._fail(error_text(data.decode("utf-8", "replace")))
                elif obj is BAD:
                    self._fail("malformed JSON in stream event")
                continue
            err = _error_of(obj)
            if err is not None:
                self._fail(*err)
                continue
            if ev.event == "error":
                self._fail(error_text(obj), error_kind(obj))
                continue
            self._warm = True
            self._set_model(obj.get("model"))
            if self._response_id is None:
                self._set_response_id(obj.get("id"))
            cum: int | None = None
            usage = obj.get("usage")
            if isinstance(usage, dict):
                self._usage_obj = True
                if obj.get("choices") == []:  # usage-only: one per choice from llama.cpp
                    cum = self._add_usage_only(usage)
                elif self._summed is None:
                    cum = self._add_choice_usage(obj.get("choices"), usage)
                else:
                    cum = count(usage.get("completion_tokens"))
            elif not self._usage_obj:
                self._timings(obj)
            if _choices_have_content(obj.get("choices"), "delta") or _native_content(obj):
                n += 1
                if cum is None:
                    tokens += 1
                    self._counted += 1
                elif cum > self._counted:
                    tokens += cum - self._counted
                    self._counted = cum
            elif cum is not None and cum > self._counted:
                self._counted = cum  # e.g. an end-of-sequence token in a finish-only chunk
        return (n, tokens)

    def _add_usage_only(self, usage: dict[str, Any]) -> int | None:
        """A usage-only event's figures added to those of the ones before it (the same
        prompt in each: counted once). Returns the completion tokens so far."""
        n = count(usage.get("completion_tokens"))
        if n is not None:
            self._summed = n if self._summed is None else self._summed + n
            self._set_completion(self._summed)
        self._set_prompt(usage.get("prompt_tokens"))
        return self._summed

    def _add_choice_usage(self, choices: object, usage: dict[str, Any]) -> int | None:
        """``usage`` on an event with choices: the figure of its one choice (the last per
        choice index, summed over the choices), or of the whole answer when the event is
        not one choice with an ``index``. Returns the completion tokens so far (None when
        this usage has no figure)."""
        n = count(usage.get("completion_tokens"))
        index = _one_index(choices)
        if self._per_prompt and index is not None:
            self._prompt_of(index // self._per_prompt, usage.get("prompt_tokens"))
        else:
            self._set_prompt(usage.get("prompt_tokens"))
        if n is None:
            return None
        per = self._usage_per_choice
        if index is None or per is None:
            per = self._usage_per_choice = {}
        per[-1 if index is None else index] = n
        total = sum(per.values())
        self._set_completion(total)
        return total

    def _timings(self, obj: dict[str, Any]) -> None:
        """llama.cpp's counts from ``timings`` (no ``usage`` in the stream): the last
        ``predicted_n`` of each choice index, summed (with ``n > 1`` each choice's finish
        event carries its own), and the prompt once. Its own API's events have no
        ``choices`` but a top-level ``index``, one per prompt of a list of prompts: their
        prompts are different, so theirs are summed too."""
        t = obj.get("timings")
        if not isinstance(t, dict):
            return
        index = _one_index(obj.get("choices"))
        native = None
        if index is None and "choices" not in obj:
            native = obj.get("index")
            if type(native) is int:
                index = native
        if index is None:
            index = -1
        n = count(t.get("predicted_n"))
        if n is not None:
            per = self._per_choice
            if per is None:
                per = self._per_choice = {}
            per[index] = n
            self._set_completion(sum(per.values()))
        prompt, cached = t.get("prompt_n"), t.get("cache_n", 0)
        if type(prompt) is int and type(cached) is int:
            if type(native) is int:
                self._prompt_of(native, prompt + cached)
            elif self._per_prompt and index >= 0:
                self._prompt_of(index // self._per_prompt, prompt + cached)
            else:
                self._set_prompt(prompt + cached)

    def _prompt_of(self, prompt: int, tokens: object) -> None:
        """``tokens``: the prompt tokens of the request's prompt number ``prompt`` (one of
        several, each counted once): the prompt figure is their sum."""
        n = count(tokens)
        if n is None:
            return
        prompts = self._prompt_per_index
        if prompts is None:
            prompts = self._prompt_per_index = {}
        prompts[prompt] = n
        self._set_prompt(sum(prompts.values()))


class OpenAIBodyParser(JSONBodyParser):
    """A non-streaming chat/completions response (``application/json``)."""

    __slots__ = ()

    def _interpret(self, obj: Any) -> bool:
        if isinstance(obj, list):
            return self._native_results(obj)
        if not isinstance(obj, dict):
            return False
        err = _error_of(obj)
        if err is not None:
            self._fail(*err)
            return False
        self._set_model(obj.get("model"))
        self._set_response_id(obj.get("id"))
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._set_completion(usage.get("completion_tokens"))
            self._set_prompt(usage.get("prompt_tokens"))
        else:
            _llamacpp_timings(self, obj)
        return _choices_have_content(obj.get("choices"), "message") or _native_content(obj)

    def _native_results(self, results: list[Any]) -> bool:
        """llama.cpp's own API answering a list of prompts: a list of results, one per
        prompt, each with its own ``timings``: their counts summed (different prompts)."""
        if not results or not all(isinstance(r, dict) and "stop" in r and "choices" not in r
                                  for r in results):
            return False
        completion = prompt = 0
        have_completion = have_prompt = False
        for r in results:
            self._set_model(r.get("model"))
            t = r.get("timings")
            if not isinstance(t, dict):
                continue
            n = count(t.get("predicted_n"))
            if n is not None:
                completion += n
                have_completion = True
            p, cached = t.get("prompt_n"), t.get("cache_n", 0)
            if type(p) is int and type(cached) is int:
                prompt += p + cached
                have_prompt = True
        if have_completion:
            self._set_completion(completion)
        if have_prompt:
            self._set_prompt(prompt)
        return any(_native_content(r) for r in results)


def _llamacpp_timings(state: ParserState, obj: dict[str, Any]) -> None:
    """llama.cpp's own counts when an answer has no ``usage``: ``timings.predicted_n``
    output tokens and ``prompt_n + cache_n`` prompt tokens (its usage says the same)."""
    t = obj.get("timings")
    if not isinstance(t, dict):
        return
    state._set_completion(t.get("predicted_n"))
    prompt, cached = t.get("prompt_n"), t.get("cache_n", 0)
    if type(prompt) is int and type(cached) is int:
        state._set_prompt(prompt + cached)


def inspect_openai_request(body: bytes) -> RequestInfo:
    """Model, user, stream and ``stream_options.include_usage`` of a request body.

    Never raises: a body that is not a JSON object gives ``RequestInfo()``.
    """
    obj = loads(body) if body else BAD
    if not isinstance(obj, dict):
        return RequestInfo()
    model = obj.get("model")
    user = obj.get("user")
    opts = obj.get("stream_options")
    n = obj.get("n")
    return RequestInfo(
        model=text_or_none(model),
        user=text_or_none(user),
        stream=obj.get("stream") is True,
        wants_usage=isinstance(opts, dict) and opts.get("include_usage") is True,
        prompts=_prompt_count(obj.get("prompt")),
        n=n if type(n) is int and n > 0 else 1,
    )


def _prompt_count(prompt: object) -> int:
    """How many prompts a completions request's ``prompt`` holds, as llama.cpp and vLLM
    read it: a list of strings or of token lists is one prompt each; a string, a list of
    token ids, and llama.cpp's mixed list of token ids and strings are one prompt."""
    if not isinstance(prompt, list) or len(prompt) < 2:
        return 1
    first = prompt[0]
    if type(first) is int:  # token ids (or llama.cpp's mixed list): one prompt
        return 1
    if isinstance(first, str) and any(type(p) is int for p in prompt):
        return 1  # llama.cpp's mixed list of strings and token ids
    return len(prompt)
