"""The OpenAI Responses API (``POST /v1/responses``) as the simulator serves it.

Requests: ``input`` (a string, or a list of items: messages with ``content`` as text or
parts, tool outputs with ``output``), optional ``instructions``, ``max_output_tokens``,
``stream``, ``model``. Prompt tokens follow :mod:`llmtop.sim.tokens`' chat rule, the
string input being one user message and ``instructions`` the system prompt.

Streams are OpenAI's: every event is ``event: <type>`` + ``data: {…, "sequence_number":
n}`` (numbered from 0), ending with a blank line. ``response.created`` and
``response.in_progress`` go out with the headers, before the engine has produced anything
(so they are never a first token); with the first token come ``response.output_item.added``
(a ``message``) and ``response.content_part.added``; each engine chunk of ``k`` tokens is
one ``response.output_text.delta``; after the last, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done`` and the terminal event
with the whole ``Response`` and its ``usage`` (``input_tokens``, ``output_tokens``): a
request that reached ``max_output_tokens`` ends ``response.incomplete`` (status
``incomplete``, ``incomplete_details.reason: max_output_tokens``) as OpenAI's does, any
other ``response.completed``. No ``[DONE]``. Not streamed: the ``Response`` object.
The shapes follow openai-python's ``types/responses`` closely enough for its
``responses.stream()`` helper, which checks item indexes and response ids.
"""

from __future__ import annotations

import json
from typing import Any

from llmtop.sim.bodies import BadRequest, Parsed
from llmtop.sim.engine import SimRequest
from llmtop.sim.formats import Encoder
from llmtop.sim.tokens import chat_tokens, json_text_of

__all__ = ["ResponsesEncoder", "parse_responses"]


def _j(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def parse_responses(body: dict[str, Any]) -> Parsed:
    """``/v1/responses``: ``input``, ``instructions``, ``max_output_tokens``, ``stream``."""
    given = body.get("input")
    if isinstance(given, str):
        messages: list[Any] = [{"role": "user", "content": given}]
    elif isinstance(given, list) and given:
        messages = [{"content": item.get("content", item.get("output"))}
                    if isinstance(item, dict) else {"content": item} for item in given]
    else:
        raise BadRequest("'input' must be a string or a non-empty list")
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens,
                                                                                  int)):
        raise BadRequest(f"'max_output_tokens' must be an integer, got {max_tokens!r}")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be true or false, got {stream!r}")
    model = body.get("model")
    return Parsed(chat_tokens(messages, body.get("instructions")), max_tokens, stream,
                  model if isinstance(model, str) and model else None)


class ResponsesEncoder(Encoder):
    """OpenAI ``/v1/responses``, streamed (``head``/``first``/``chunk``/``end``) or whole."""

    def __init__(self, req: SimRequest, model: str, **kw: Any) -> None:
        super().__init__(req, model, **kw)
        self._seq = 0
        self._msg_id = "msg_" + req.id.removeprefix("resp_")
        self._delta_pre = (b'event: response.output_text.delta\ndata: {"type":'
                           b'"response.output_text.delta","item_id":"' + self._msg_id.encode()
                           + b'","output_index":0,"content_index":0,"delta":"')

    def _event(self, typ: str, **fields: Any) -> bytes:
        data = {"type": typ, **fields, "sequence_number": self._seq}
        self._seq += 1
        return b"event: " + typ.encode() + b"\ndata: " + _j(data) + b"\n\n"

    def _incomplete(self) -> bool:
        return self.req.finish_reason == "length"

    def _usage(self) -> dict[str, Any]:
        r = self.req
        return {"input_tokens": r.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": r.generated, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": r.prompt_tokens + r.generated}

    def _part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}

    def _message(self, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self._msg_id, "type": "message", "status": status, "role": "assistant",
                "content": content}

    def _response(self, status: str, output: list[dict[str, Any]],
                  usage: dict[str, Any] | None) -> dict[str, Any]:
        r = self.req
        return {
            "id": r.id, "object": "response", "created_at": self.created, "status": status,
            "background": False, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete" else None,
            "instructions": None,
            "max_output_tokens": r.target if self._incomplete() else None,
            "model": self.model, "output": output, "parallel_tool_calls": True,
            "previous_response_id": None, "reasoning": {"effort": None, "summary": None},
            "store": False, "temperature": 1.0, "text": {"format": {"type": "text"}},
            "tool_choice": "auto", "tools": [], "top_p": 1.0, "truncation": "disabled",
            "usage": usage, "user": None, "metadata": {},
        }

    def _final_status(self) -> str:
        return "incomplete" if self._incomplete() else "completed"

    def head(self) -> bytes:
        started = self._response("in_progress", [], None)
        return (self._event("response.created", response=started)
                + self._event("response.in_progress", response=started))

    def first(self) -> bytes:
        return (self._event("response.output_item.added", output_index=0,
                            item=self._message("in_progress", []))
                + self._event("response.content_part.added", item_id=self._msg_id,
                              output_index=0, content_index=0, part=self._part("")))

    def chunk(self, start: int, k: int) -> bytes:
        seq = self._seq
        self._seq += 1
        return (self._delta_pre + json_text_of(self.req.text_offset, start, k)
                + b'","logprobs":[],"sequence_number":' + str(seq).encode() + b"}\n\n")

    def malformed(self) -> bytes:
        return (b'event: response.output_text.delta\ndata: {"type":"response.output_text.'
                b'delta","delta":"broken\n\n')

    def end(self) -> bytes:
        text = self.full_text()
        status = self._final_status()
        message = self._message("completed" if status == "completed" else "incomplete",
                                [self._part(text)])
        out = b""
        if self.req.generated:  # the message was opened with the first token
            out = (self._event("response.output_text.done", item_id=self._msg_id,
                               output_index=0, content_index=0, text=text, logprobs=[])
                   + self._event("response.content_part.done", item_id=self._msg_id,
                                 output_index=0, content_index=0, part=self._part(text))
                   + self._event("response.output_item.done", output_index=0, item=message))
        output = [message] if self.req.generated else []
        return out + self._event("response." + status,
                                 response=self._response(status, output, self._usage()))

    def body(self) -> dict[str, Any]:
        status = self._final_status()
        message = self._message("completed" if status == "completed" else "incomplete",
                                [self._part(self.full_text())])
        return self._response(status, [message], self._usage())
