"""Reading request bodies of each dialect: prompt tokens, output length, streaming options.

Each ``parse_*`` takes the decoded JSON object and returns a :class:`Parsed`, or raises
:class:`BadRequest` (HTTP 400) with a one-line message. Prompt tokens follow the rule in
:mod:`llmtop.sim.tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmtop.sim.tokens import chat_tokens, prompt_tokens


class BadRequest(ValueError):
    """The request body is not acceptable (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class Parsed:
    """What the simulator needs from a request."""

    prompt_tokens: int
    max_tokens: int | None
    stream: bool
    model: str | None
    include_usage: bool = False
    continuous_usage: bool = False
    details: bool = True
    prefill: bool = False
    """TGI's ``parameters.decoder_input_details``: the non-streamed ``details`` list the
    prompt's tokens under ``prefill``."""
    listed: bool = False
    """The non-streamed answer is a one-element list (TGI's ``POST /``)."""


def _opt_int(body: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(f"'{key}' must be an integer, got {value!r}")
        return value
    return None


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    return model if isinstance(model, str) and model else None


def _stream(body: dict[str, Any], default: bool) -> bool:
    value = body.get("stream", default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'stream' must be true or false, got {value!r}")
    return value


def _n(body: dict[str, Any]) -> None:
    n = body.get("n")
    if n not in (None, 1):
        raise BadRequest("'n' other than 1 is not supported by llmtop sim")


def _openai_stream_options(body: dict[str, Any], stream: bool) -> tuple[bool, bool]:
    """(include usage, continuous usage), as vLLM reads them: ``continuous_usage_stats``
    counts only together with ``include_usage``, and options other than an empty object or
    null without ``stream: true`` are refused."""
    opts = body.get("stream_options")
    if opts and not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.")
    if not isinstance(opts, dict):
        return False, False
    usage = opts.get("include_usage") is True
    return usage, usage and opts.get("continuous_usage_stats") is True


def parse_chat(body: dict[str, Any]) -> Parsed:
    """OpenAI ``/v1/chat/completions``: ``messages``, ``max_completion_tokens`` or
    ``max_tokens``, ``stream``, ``stream_options.include_usage`` (and with it
    ``continuous_usage_stats``)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    _n(body)
    stream = _stream(body, False)
    usage, continuous = _openai_stream_options(body, stream)
    return Parsed(chat_tokens(messages), _opt_int(body, "max_completion_tokens", "max_tokens"),
                  stream, _model(body), usage, continuous)


def parse_completion(body: dict[str, Any]) -> Parsed:
    """OpenAI ``/v1/completions``: ``prompt`` (text or token ids, or a list of one of
    those; a batch of several is refused, as ``n`` other than 1 is), ``max_tokens``."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str | list):
        raise BadRequest("'prompt' must be a string or a list")
    if isinstance(prompt, list) and (
            not prompt or (len(prompt) > 1 and not isinstance(prompt[0], int))):
        # a batch answers one choice per prompt: served like n > 1, i.e. not at all
        raise BadRequest("'prompt' must be one prompt: batch requests (a list of prompts) "
                         "are not supported by llmtop sim" if prompt
                         else "'prompt' must not be an empty list")
    _n(body)
    stream = _stream(body, False)
    usage, continuous = _openai_stream_options(body, stream)
    return Parsed(prompt_tokens(prompt), _opt_int(body, "max_tokens"), stream,
                  _model(body), usage, continuous)


def parse_messages(body: dict[str, Any]) -> Parsed:
    """Anthropic ``/v1/messages``: ``messages``, ``system``, ``max_tokens`` (required)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: field required (a non-empty list)")
    max_tokens = _opt_int(body, "max_tokens")
    if max_tokens is None:
        raise BadRequest("max_tokens: field required")
    return Parsed(chat_tokens(messages, body.get("system")), max_tokens,
                  _stream(body, False), _model(body))


def _num_predict(body: dict[str, Any]) -> int | None:
    options = body.get("options")
    if not isinstance(options, dict):
        return None
    value = _opt_int(options, "num_predict")
    return value if value is not None and value > 0 else None


def parse_ollama_chat(body: dict[str, Any]) -> Parsed:
    """Ollama ``/api/chat``: ``messages``, ``options.num_predict``; ``stream`` defaults to
    **true**, as in Ollama."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("'messages' must be a list")
    return Parsed(chat_tokens(messages), _num_predict(body), _stream(body, True), _model(body))


def parse_ollama_generate(body: dict[str, Any]) -> Parsed:
    """Ollama ``/api/generate``: ``prompt`` (+ ``system``), ``options.num_predict``;
    ``stream`` defaults to true."""
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' must be a string")
    system = body.get("system")
    tokens = prompt_tokens(prompt) + (prompt_tokens(system) if isinstance(system, str) else 0)
    return Parsed(tokens, _num_predict(body), _stream(body, True), _model(body))


def _parse_tgi(body: dict[str, Any], stream: bool, listed: bool = False) -> Parsed:
    inputs = body.get("inputs")
    if not isinstance(inputs, str):
        raise BadRequest("'inputs' must be a string")
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("'parameters' must be an object")
    details = params.get("details")
    return Parsed(prompt_tokens(inputs), _opt_int(params, "max_new_tokens"), stream,
                  _model(body), details=details is not False,
                  prefill=params.get("decoder_input_details") is True, listed=listed)


def parse_tgi_stream(body: dict[str, Any]) -> Parsed:
    """TGI ``/generate_stream``: ``inputs``, ``parameters.max_new_tokens``; the final event
    carries ``details`` unless ``parameters.details`` is false."""
    return _parse_tgi(body, True)


def parse_tgi(body: dict[str, Any]) -> Parsed:
    """TGI ``/generate`` (not streamed)."""
    return _parse_tgi(body, False)


def parse_tgi_compat(body: dict[str, Any]) -> Parsed:
    """TGI ``POST /``: ``/generate_stream`` when ``stream`` is true, else ``/generate``
    with its answer in a one-element list (as TGI's ``compat_generate`` answers)."""
    stream = _stream(body, False)
    return _parse_tgi(body, stream, listed=not stream)
