"""Wire formats: the bytes each dialect's real server sends, built from pre-encoded pieces.

One encoder object per response. Streaming handlers call ``first()`` just before the first
content chunk (role chunk, ``message_start`` …), ``chunk(start, k)`` for each engine chunk
of ``k`` tokens starting at token index ``start``, ``malformed()`` for the fault, and
``end()`` after the last token. Non-streaming handlers call ``body()``.

* OpenAI chat (vLLM / llama.cpp): a role-only first chunk with ``content: null``, content
  chunks, a finish chunk with an empty delta, a usage-only chunk with ``choices: []`` when
  ``stream_options.include_usage`` (and ``usage`` in every chunk when
  ``continuous_usage_stats`` is set too: vLLM ignores it alone), then ``data: [DONE]``;
  every event ends with a blank line.
* OpenAI completions: the same without the role chunk (``text`` instead of ``delta``).
* Anthropic messages: ``message_start``, ``content_block_start``, ``ping``,
  ``content_block_delta`` (``text_delta``)…, ``content_block_stop``, ``message_delta``
  (``stop_reason`` and ``usage.output_tokens``), ``message_stop``.
* Ollama ``/api/chat`` and ``/api/generate``: NDJSON, last object ``done: true`` with
  ``done_reason``, ``prompt_eval_count``, ``eval_count`` and durations in nanoseconds.
* TGI ``/generate_stream``: ``data:{"index":…,"token":{…},"generated_text":null,…}`` per
  token; the last token's event carries ``generated_text`` and ``details`` (TGI's
  ``StreamDetails``, with ``input_length``). ``/generate``: ``generated_text`` and TGI's
  ``Details`` (``finish_reason``, ``generated_tokens``, ``seed``, ``prefill``, ``tokens``).
* OpenAI ``/v1/responses``: in :mod:`llmtop.sim.responses_format`.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from datetime import UTC, datetime
from typing import Any

from llmtop.sim.engine import SimRequest
from llmtop.sim.tokens import VOCAB, json_text_of, text_of

SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
DONE = b"data: [DONE]\n\n"


def _j(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class Encoder(ABC):
    """Base: subclasses fill in the dialect's bytes."""

    content_type = SSE

    def __init__(self, req: SimRequest, model: str, *, include_usage: bool = False,
                 continuous_usage: bool = False, details: bool = True,
                 prefill: bool = False) -> None:
        self.req = req
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage or continuous_usage
        self.continuous_usage = continuous_usage
        self.details = details
        self.prefill = prefill

    def head(self) -> bytes:
        """Events sent with the headers, before any token (the Responses API's)."""
        return b""

    def first(self) -> bytes:
        return b""

    @abstractmethod
    def chunk(self, start: int, k: int) -> bytes:
        """One content chunk: tokens ``start`` … ``start + k - 1``."""

    def malformed(self) -> bytes:
        return b'data: {"choices":[{"index":0,"delta":{"content":"broken\n\n'

    def end(self) -> bytes:
        return b""

    @abstractmethod
    def body(self) -> dict[str, Any]:
        """The whole non-streaming response."""

    def full_text(self) -> str:
        r = self.req
        return text_of(r.text_offset, 0, r.generated)

    def usage(self) -> dict[str, int]:
        r = self.req
        return {"prompt_tokens": r.prompt_tokens,
                "total_tokens": r.prompt_tokens + r.generated,
                "completion_tokens": r.generated}


class ChatEncoder(Encoder):
    """OpenAI ``/v1/chat/completions``."""

    object_chunk = b"chat.completion.chunk"

    def __init__(self, req: SimRequest, model: str, **kw: Any) -> None:
        super().__init__(req, model, **kw)
        self._head = (b'data: {"id":"' + req.id.encode() + b'","object":"' + self.object_chunk
                      + b'","created":' + str(self.created).encode() + b',"model":'
                      + _j(model) + b',"choices":[')
        self._pre = self._head + self._content_open()
        self._post = self._content_close()
        self._usage_pre = b'"usage":{"prompt_tokens":' + str(req.prompt_tokens).encode()

    def _content_open(self) -> bytes:
        return b'{"index":0,"delta":{"content":"'

    def _content_close(self) -> bytes:
        return b'"},"logprobs":null,"finish_reason":null}]'

    def _usage_tail(self, completion: int) -> bytes:
        if not self.continuous_usage:
            return b"}\n\n"
        p = self.req.prompt_tokens
        return (b"," + self._usage_pre + b',"total_tokens":' + str(p + completion).encode()
                + b',"completion_tokens":' + str(completion).encode() + b"}}\n\n")

    def first(self) -> bytes:
        return (self._head + b'{"index":0,"delta":{"role":"assistant","content":null},'
                b'"logprobs":null,"finish_reason":null}]' + self._usage_tail(0))

    def chunk(self, start: int, k: int) -> bytes:
        r = self.req
        return (self._pre + json_text_of(r.text_offset, start, k) + self._post
                + self._usage_tail(start + k))

    def _finish_choice(self) -> bytes:
        return (b'{"index":0,"delta":{},"logprobs":null,"finish_reason":"'
                + self.req.finish_reason.encode() + b'"}]')

    def end(self) -> bytes:
        out = self._head + self._finish_choice() + self._usage_tail(self.req.generated)
        if self.include_usage:
            out += self._head + b"]," + _j({"usage": self.usage()})[1:] + b"\n\n"
        return out + DONE

    def body(self) -> dict[str, Any]:
        r = self.req
        return {
            "id": r.id, "object": "chat.completion", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0,
                         "message": {"role": "assistant", "content": self.full_text()},
                         "logprobs": None, "finish_reason": r.finish_reason}],
            "usage": self.usage(),
        }


class CompletionEncoder(ChatEncoder):
    """OpenAI legacy ``/v1/completions``."""

    object_chunk = b"text_completion"

    def _content_open(self) -> bytes:
        return b'{"index":0,"text":"'

    def _content_close(self) -> bytes:
        return b'","logprobs":null,"finish_reason":null,"stop_reason":null}]'

    def first(self) -> bytes:
        return b""

    def malformed(self) -> bytes:
        return b'data: {"choices":[{"index":0,"text":"broken\n\n'

    def _finish_choice(self) -> bytes:
        return (b'{"index":0,"text":"","logprobs":null,"finish_reason":"'
                + self.req.finish_reason.encode() + b'","stop_reason":null}]')

    def body(self) -> dict[str, Any]:
        r = self.req
        return {
            "id": r.id, "object": "text_completion", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "text": self.full_text(), "logprobs": None,
                         "finish_reason": r.finish_reason, "stop_reason": None}],
            "usage": self.usage(),
        }


class AnthropicEncoder(Encoder):
    """Anthropic ``/v1/messages``."""

    _DELTA_PRE = (b'event: content_block_delta\ndata: {"type":"content_block_delta",'
                  b'"index":0,"delta":{"type":"text_delta","text":"')
    _DELTA_POST = b'"}}\n\n'

    def _stop_reason(self) -> str:
        return "max_tokens" if self.req.finish_reason == "length" else "end_turn"

    def first(self) -> bytes:
        r = self.req
        start = {"type": "message_start", "message": {
            "id": r.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": r.prompt_tokens, "output_tokens": 1}}}
        return (b"event: message_start\ndata: " + _j(start) + b"\n\n"
                b"event: content_block_start\ndata: "
                b'{"type":"content_block_start","index":0,'
                b'"content_block":{"type":"text","text":""}}\n\n'
                b'event: ping\ndata: {"type":"ping"}\n\n')

    def chunk(self, start: int, k: int) -> bytes:
        return (self._DELTA_PRE + json_text_of(self.req.text_offset, start, k)
                + self._DELTA_POST)

    def malformed(self) -> bytes:
        return (b'event: content_block_delta\ndata: {"type":"content_block_delta",'
                b'"index":0,"delta":{"type":"text_del\n\n')

    def end(self) -> bytes:
        delta = {"type": "message_delta",
                 "delta": {"stop_reason": self._stop_reason(), "stop_sequence": None},
                 "usage": {"output_tokens": self.req.generated}}
        return (b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}'
                b"\n\nevent: message_delta\ndata: " + _j(delta) + b"\n\n"
                b'event: message_stop\ndata: {"type":"message_stop"}\n\n')

    def body(self) -> dict[str, Any]:
        r = self.req
        return {
            "id": r.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [{"type": "text", "text": self.full_text()}],
            "stop_reason": self._stop_reason(), "stop_sequence": None,
            "usage": {"input_tokens": r.prompt_tokens, "output_tokens": r.generated},
        }


def _ollama_time() -> bytes:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()


class OllamaChatEncoder(Encoder):
    """Ollama ``/api/chat`` (NDJSON)."""

    content_type = NDJSON
    key = b'"message":{"role":"assistant","content":"'
    close = b'"}'

    def __init__(self, req: SimRequest, model: str, **kw: Any) -> None:
        super().__init__(req, model, **kw)
        self._model = b'{"model":' + _j(model) + b',"created_at":"'

    def chunk(self, start: int, k: int) -> bytes:
        return (self._model + _ollama_time() + b'",' + self.key
                + json_text_of(self.req.text_offset, start, k) + self.close
                + b',"done":false}\n')

    def malformed(self) -> bytes:
        return self._model + _ollama_time() + b'",' + self.key + b"broken\n"

    def _final(self) -> dict[str, Any]:
        r = self.req
        now = time.time()
        admitted = r.admitted if r.admitted is not None else r.arrival
        first = r.first_token if r.first_token is not None else now
        return {
            "done": True,
            "done_reason": "length" if r.finish_reason == "length" else "stop",
            "total_duration": int((now - r.arrival) * 1e9),
            "load_duration": 0,
            "prompt_eval_count": r.prompt_tokens,
            "prompt_eval_duration": int(max(0.0, first - admitted) * 1e9),
            "eval_count": r.generated,
            "eval_duration": int(max(0.0, now - first) * 1e9),
        }

    def end(self) -> bytes:
        return (self._model + _ollama_time() + b'",' + self.key + self.close + b","
                + _j(self._final())[1:] + b"\n")

    def body(self) -> dict[str, Any]:
        return {"model": self.model, "created_at": _ollama_time().decode(),
                "message": {"role": "assistant", "content": self.full_text()},
                **self._final()}


class OllamaGenerateEncoder(OllamaChatEncoder):
    """Ollama ``/api/generate`` (NDJSON)."""

    key = b'"response":"'
    close = b'"'

    def body(self) -> dict[str, Any]:
        return {"model": self.model, "created_at": _ollama_time().decode(),
                "response": self.full_text(), **self._final()}


class TgiEncoder(Encoder):
    """TGI ``/generate_stream`` (one SSE event per token) and ``/generate``."""

    def _reason(self) -> str:
        return "length" if self.req.finish_reason == "length" else "eos_token"

    def _details(self, generated: int) -> dict[str, Any]:
        r = self.req
        return {"finish_reason": self._reason(), "generated_tokens": generated,
                "seed": None, "input_length": r.prompt_tokens}

    def chunk(self, start: int, k: int) -> bytes:
        r = self.req
        n = len(VOCAB)
        parts = []
        for i in range(start, start + k):
            tok = (r.text_offset + i) % n
            last = i + 1 >= r.target
            tail = (b'"generated_text":' + _j(text_of(r.text_offset, 0, r.target))
                    + b',"details":' + (_j(self._details(r.target)) if self.details
                                        else b"null")
                    if last else b'"generated_text":null,"details":null')
            parts.append(b'data:{"index":' + str(i + 1).encode() + b',"token":{"id":'
                         + str(1000 + tok).encode() + b',"text":"'
                         + json_text_of(r.text_offset, i, 1)
                         + b'","logprob":-0.25,"special":false},"top_tokens":null,'
                         + tail + b"}\n\n")
        return b"".join(parts)

    def malformed(self) -> bytes:
        return b'data:{"index":0,"token":{"id":1,"te\n\n'

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"generated_text": self.full_text()}
        if self.details:
            # TGI's ``Details`` (not the stream's ``StreamDetails``: no input_length); the
            # prompt's tokens under ``prefill`` only when decoder_input_details asked
            r = self.req
            n = len(VOCAB)
            out["details"] = {
                "finish_reason": self._reason(), "generated_tokens": r.generated,
                "seed": None,
                "prefill": [{"id": 1 + i, "text": "x", "logprob": None if i == 0 else -1.5}
                            for i in range(r.prompt_tokens)] if self.prefill else [],
                "tokens": [{"id": 1000 + (r.text_offset + i) % n,
                            "text": text_of(r.text_offset, i, 1), "logprob": -0.25,
                            "special": False} for i in range(r.generated)],
            }
        return out
