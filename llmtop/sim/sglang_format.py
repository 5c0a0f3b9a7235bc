"""SGLang's native ``POST /generate``, as the simulator answers it.

TGI serves ``/generate`` too; :func:`generate_endpoint` answers a request whose body is
SGLang's (``text``, ``input_ids`` or ``sampling_params``, and no ``inputs``) in SGLang's
format and any other in TGI's, as before.

SGLang's format (its ``http_server.generate_request`` and the tokenizer manager's
outputs; see ``llmtop/proxy/dialects/sglang.py`` for what was read in its source):

* request: ``{"text": "..."}`` or ``{"input_ids": [...]}``, ``sampling_params``
  (``max_new_tokens``; ``n`` other than 1 and batches are not served here), ``stream``
  (default false);
* streamed: ``text/event-stream``, one ``data: {"text", "output_ids", "meta_info"}``
  event per engine chunk (one per ``tokens_per_chunk`` tokens, as ``stream_interval``
  makes SGLang send several tokens an event), ``text`` and ``output_ids`` the whole output
  so far (SGLang's default; not ``--incremental-streaming-output``), ``meta_info``
  ``{"id", "finish_reason", "prompt_tokens", "weight_version", "completion_tokens",
  "cached_tokens"}`` with ``completion_tokens`` counting up; the last event carries the
  ``finish_reason`` (``{"type": "length", "length"}`` or ``{"type": "stop", "matched"}``)
  and ``e2e_latency``; then ``data: [DONE]``;
* not streamed: the last event's object as one JSON body;
* errors: HTTP 400 ``{"error": {"message"}}`` (``_create_error_response``), any other
  status ``{"object": "error", "message", "type", "code"}`` (its ``HTTPException``
  handler).

The ground truth (``/sim/requests``) is the same as for every other format.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from llmtop.sim import handlers
from llmtop.sim.bodies import BadRequest, Parsed
from llmtop.sim.engine import SimRequest
from llmtop.sim.formats import DONE, Encoder
from llmtop.sim.tokens import VOCAB, json_text_of, prompt_tokens

__all__ = ["SGLANG", "SGLangEncoder", "generate_endpoint", "is_sglang_body", "parse_sglang"]

_INPUT_KEYS = ("text", "input_ids", "input_embeds", "sampling_params")
_EOS = 2
"""The token id a ``stop`` finish names as ``matched`` (the simulated end of sequence)."""


def _j(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def is_sglang_body(body: object) -> bool:
    """A decoded ``/generate`` body is SGLang's, not TGI's."""
    return isinstance(body, dict) and "inputs" not in body and any(
        key in body for key in _INPUT_KEYS)


def parse_sglang(body: dict[str, Any]) -> Parsed:
    """SGLang's ``GenerateReqInput``: ``text`` or ``input_ids``, ``sampling_params``
    (``max_new_tokens``, ``n``), ``stream``."""
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list)):
        raise BadRequest("batch requests (a list of prompts) are not supported by llmtop sim")
    if isinstance(text, str):
        tokens = prompt_tokens(text)
    elif isinstance(ids, list) and ids and all(type(i) is int for i in ids):
        tokens = len(ids)
    else:
        raise BadRequest("Either text, input_ids or input_embeds should be provided.")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("'sampling_params' must be an object")
    if params.get("n", 1) not in (None, 1):
        raise BadRequest("'n' other than 1 is not supported by llmtop sim")
    max_new = params.get("max_new_tokens")
    if max_new is not None and (isinstance(max_new, bool) or not isinstance(max_new, int)):
        raise BadRequest(f"'max_new_tokens' must be an integer, got {max_new!r}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be true or false, got {stream!r}")
    return Parsed(tokens, max_new, stream, None)


class SGLangEncoder(Encoder):
    """One SSE event per engine chunk, the output so far in each (see the module
    docstring). The text and ids so far are kept as JSON bytes and grown by each chunk."""

    def __init__(self, req: SimRequest, model: str, **kw: Any) -> None:
        super().__init__(req, model, **kw)
        self._text = bytearray()
        self._ids = bytearray()
        self._meta = (b'{"id":' + _j(req.id) + b',"finish_reason":')
        self._counts = (b',"prompt_tokens":' + str(req.prompt_tokens).encode()
                        + b',"weight_version":"default","completion_tokens":')

    def _grow(self, start: int, k: int) -> None:
        r = self.req
        n = len(VOCAB)
        self._text += json_text_of(r.text_offset, start, k)
        ids = ",".join(str(1000 + (r.text_offset + i) % n) for i in range(start, start + k))
        self._ids += (b"," if self._ids else b"") + ids.encode()

    def _finish(self) -> dict[str, Any]:
        r = self.req
        if r.finish_reason == "length":
            return {"type": "length", "length": r.target}
        return {"type": "stop", "matched": _EOS}

    def _latency(self) -> float:
        return round(time.time() - self.req.arrival, 6)

    def chunk(self, start: int, k: int) -> bytes:
        self._grow(start, k)
        done = start + k
        last = done >= self.req.target
        tail = (_j(self._finish()) if last else b"null") + self._counts + str(done).encode()
        tail += (b',"cached_tokens":0,"e2e_latency":' + _j(self._latency()) + b"}"
                 if last else b',"cached_tokens":0}')
        return (b'data: {"text":"' + self._text + b'","output_ids":[' + self._ids
                + b'],"meta_info":' + self._meta + tail + b"}\n\n")

    def malformed(self) -> bytes:
        return b'data: {"text":"broken\n\n'

    def end(self) -> bytes:
        return DONE

    def body(self) -> dict[str, Any]:
        r = self.req
        n = len(VOCAB)
        return {
            "text": self.full_text(),
            "output_ids": [1000 + (r.text_offset + i) % n for i in range(r.generated)],
            "meta_info": {"id": r.id, "finish_reason": self._finish(),
                          "prompt_tokens": r.prompt_tokens, "weight_version": "default",
                          "completion_tokens": r.generated, "cached_tokens": 0,
                          "e2e_latency": self._latency()},
        }


def _sglang_error(status: int, message: str) -> dict[str, Any]:
    if status == 400:
        return {"error": {"message": message}}
    return {"object": "error", "message": message, "type": str(status), "param": None,
            "code": status}


SGLANG = handlers.Dialect("sglang", "sglang-", parse_sglang, SGLangEncoder, _sglang_error)


def generate_endpoint() -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler of ``POST /generate``: SGLang's format for an SGLang body, else TGI's
    (whose handler also answers a body that is not JSON)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        dialect = handlers.TGI
        try:
            if is_sglang_body(json.loads(await request.read())):
                dialect = SGLANG
        except (ValueError, RecursionError):
            pass
        return await handlers.serve(request, dialect)

    return handler
