"""Choosing a dialect by path, building parsers by content type, reading requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmtop.config import Config, ConfigError, validate
from llmtop.events import DIALECTS as RECORDED_DIALECTS
from llmtop.proxy.dialects import (
    DIALECTS,
    RequestInfo,
    StreamParser,
    detect_dialect,
    inspect_request,
    make_parser,
)
from llmtop.proxy.dialects.anthropic import AnthropicBodyParser, AnthropicStreamParser
from llmtop.proxy.dialects.ollama import OllamaBodyParser, OllamaStreamParser
from llmtop.proxy.dialects.openai import OpenAIBodyParser, OpenAIStreamParser
from llmtop.proxy.dialects.plain import PlainParser
from llmtop.proxy.dialects.sglang import SGLangBodyParser, SGLangStreamParser
from llmtop.proxy.dialects.tgi import TGIBodyParser, TGIStreamParser


@pytest.mark.parametrize(("path", "want"), [
    ("/v1/chat/completions", "openai"),
    ("/v1/completions", "openai"),
    ("/openai/v1/chat/completions", "openai"),
    ("/openai/deployments/gpt4/chat/completions?api-version=2024-06-01", "openai"),
    ("/v1/chat/completions/", "openai"),
    ("/V1/Chat/Completions", "openai"),
    ("/v1/messages", "anthropic"),
    ("/anthropic/v1/messages?beta=true", "anthropic"),
    ("/api/generate", "ollama"),
    ("/api/chat", "ollama"),
    ("/ollama/api/chat", "ollama"),
    ("/generate_stream", "tgi"),
    ("/generate", "tgi"),
    ("/tgi/generate_stream", "tgi"),
    ("/v1/models", "other"),
    ("/v1/embeddings", "other"),
    ("/completion", "other"),
    ("/", "other"),
    ("", "other"),
    ("/metrics", "other"),
])
def test_detect_by_path(path: str, want: str) -> None:
    assert detect_dialect("POST", path, "application/json") == want


def test_only_post_is_a_generation_request_unless_configured() -> None:
    assert detect_dialect("GET", "/v1/chat/completions", None) == "other"
    assert detect_dialect("post", "/v1/chat/completions", None) == "openai"
    assert detect_dialect("GET", "/anything", None, configured="ollama") == "ollama"


def test_configured_dialect_wins() -> None:
    for name in ("openai", "anthropic", "ollama", "tgi", "sglang", "other"):
        assert detect_dialect("POST", "/v1/messages", None, configured=name) == name
    with pytest.raises(ValueError, match="unknown dialect 'vllm'"):
        detect_dialect("POST", "/", None, configured="vllm")


def test_registry_names_agree_with_config_and_recording() -> None:
    assert set(DIALECTS) == {"auto", *RECORDED_DIALECTS}
    assert DIALECTS["auto"] is None
    for name in DIALECTS:
        validate(Config(dialect=name))  # every registry name is a valid setting
    with pytest.raises(ConfigError):
        validate(Config(dialect="nope"))


@pytest.mark.parametrize(("dialect", "stream", "ctype", "cls"), [
    ("openai", True, "text/event-stream", OpenAIStreamParser),
    ("openai", True, "text/event-stream; charset=utf-8", OpenAIStreamParser),
    ("openai", True, "application/json", OpenAIBodyParser),  # e.g. a JSON error
    ("openai", False, "Application/JSON; charset=utf-8", OpenAIBodyParser),
    ("openai", False, "text/event-stream", OpenAIStreamParser),  # the answer decides
    ("openai", True, None, OpenAIStreamParser),
    ("openai", False, None, OpenAIBodyParser),
    ("openai", True, "text/plain", OpenAIStreamParser),
    ("openai", False, "application/problem+json", OpenAIBodyParser),
    ("anthropic", True, "text/event-stream", AnthropicStreamParser),
    ("anthropic", True, "application/json", AnthropicBodyParser),
    ("ollama", False, "application/x-ndjson", OllamaStreamParser),
    ("ollama", True, "application/json; charset=utf-8", OllamaBodyParser),
    ("ollama", True, None, OllamaStreamParser),
    ("tgi", True, "text/event-stream", TGIStreamParser),
    ("tgi", False, "application/json", TGIBodyParser),
    ("sglang", True, "text/event-stream; charset=utf-8", SGLangStreamParser),
    ("sglang", True, "application/json", SGLangBodyParser),  # e.g. its 400 error
    ("sglang", False, None, SGLangBodyParser),
    ("other", True, "text/event-stream", PlainParser),
    ("other", False, "application/json", PlainParser),
])
def test_make_parser(dialect: str, stream: bool, ctype: str | None, cls: type) -> None:
    p: StreamParser = make_parser(dialect, stream, ctype)  # type: ignore[arg-type]
    assert type(p) is cls
    assert (p.usage_prompt_tokens, p.usage_completion_tokens, p.model, p.error,
            p.usage_seen) == (None, None, None, None, False)


def test_make_parser_gives_fresh_parsers() -> None:
    a = make_parser("openai", True, "text/event-stream")
    b = make_parser("openai", True, "text/event-stream")
    a.feed(b'data: {"model":"x","choices":[{"delta":{"content":"a"}}]}\n\n')
    assert a.model == "x" and b.model is None


def test_inspect_request_per_dialect() -> None:
    oa = json.dumps({"model": "gpt", "user": "u1", "stream": True}).encode()
    assert inspect_request("openai", "/v1/chat/completions", oa) == RequestInfo(
        model="gpt", user="u1", stream=True)
    an = json.dumps({"model": "claude", "stream": True,
                     "metadata": {"user_id": "u2"}}).encode()
    assert inspect_request("anthropic", "/v1/messages", an) == RequestInfo(
        model="claude", user="u2", stream=True)
    assert inspect_request("ollama", "/api/chat", b'{"model": "llama3"}') == RequestInfo(
        model="llama3", stream=True)  # Ollama streams unless told not to
    assert inspect_request("ollama", "/api/chat",
                           b'{"model": "llama3", "stream": false}').stream is False
    assert inspect_request("tgi", "/generate_stream", b'{"inputs": "x"}').stream is True
    assert inspect_request("tgi", "/generate", b'{"inputs": "x"}').stream is False
    assert inspect_request("tgi", "/", b'{"inputs": "x", "stream": true}').stream is True
    assert inspect_request("other", "/completion",
                           b'{"model": "q", "stream": true}') == RequestInfo(model="q",
                                                                              stream=True)
    assert inspect_request("other", "/upload", b"\x89PNG...") == RequestInfo()


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "ollama", "tgi", "sglang", "other"])
def test_inspect_request_never_raises(dialect: str) -> None:
    for body in (b"", b"{", b"\xff" * 10, b"[" * 200000, b'{"model": {"a": 1}}', b"1e999999",
                 b'{"stream": true, "metadata": "x"}', b"\x00{}"):
        info = inspect_request(dialect, "/generate_stream?x", body)  # type: ignore[arg-type]
        assert isinstance(info, RequestInfo)
        assert info.model is None and info.user is None


# -- TGI's POST / (CompatGenerateRequest): the path alone cannot tell, the body does ------

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dialects"
TGI_STREAM = json.dumps({"inputs": "What is deep learning?",
                         "parameters": {"max_new_tokens": 20}, "stream": True}).encode()
TGI_WHOLE = json.dumps({"inputs": "What is deep learning?",
                        "parameters": {"max_new_tokens": 20}, "stream": False}).encode()


@pytest.mark.parametrize("path", ["/", "", "/?x=1", "//", "/?wait_for_model=true"])
@pytest.mark.parametrize("body", [
    TGI_STREAM,
    TGI_WHOLE,
    b'{"inputs": "hi", "parameters": {}}',  # what text_generation.Client sends
    b'{"inputs": "hi", "stream": false}',
    b'  \n{"stream": true, "parameters": {"details": true}, "inputs": "hi"}',
])
def test_tgi_root_route_is_tgi_by_its_body(path: str, body: bytes) -> None:
    assert detect_dialect("POST", path, "application/json", body=body) == "tgi"
    # decided before the body is read (or without it), / says nothing: other
    assert detect_dialect("POST", path, "application/json") == "other"
    assert detect_dialect("POST", path, None, "auto", None) == "other"


@pytest.mark.parametrize("body", [
    b"",
    b'{"model": "m", "prompt": "hi", "stream": true}',  # some other API's /
    b'{"input": "hi", "stream": true}',
    b'{"inputs": "hi"}',  # bare: TEI's / as well (embed/predict) - not told apart
    b'{"inputs": "hi", "normalize": true, "truncate": false}',  # text-embeddings-inference
    b'{"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["hi"]}],'
    b' "parameters": {}}',  # KServe v2 / Triton tensors
    b'{"inputs": ["a", "b"], "parameters": {}}',
    b'{"inputs": {"text": "hi"}, "stream": true}',
    b'{"inputs": null, "stream": true}',
    b'{"inputs": "hi", "parameters": "x", "stream": "yes"}',
    b'["inputs", "parameters"]',
    b'{"inputs": "hi", "stream": tru',  # truncated
    b'\xff\xfe{"inputs": "hi", "stream": true}',
    b'x = {"inputs": "hi", "stream": true}',
])
def test_root_route_with_another_body_stays_other(body: bytes) -> None:
    assert detect_dialect("POST", "/", "application/json", body=body) == "other"


def test_root_route_body_never_overrides_the_path_method_or_setting() -> None:
    # a body like TGI's does not make another path tgi, nor a path's dialect another
    assert detect_dialect("POST", "/v1/chat/completions", None, body=TGI_STREAM) == "openai"
    assert detect_dialect("POST", "/v1/embeddings", None, body=TGI_STREAM) == "other"
    assert detect_dialect("POST", "/tgi/", None, body=TGI_STREAM) == "other"  # see docstring
    assert detect_dialect("POST", "/generate", None, body=TGI_STREAM) == "tgi"
    assert detect_dialect("GET", "/", None, body=TGI_STREAM) == "other"
    assert detect_dialect("PUT", "/", None, body=TGI_STREAM) == "other"
    assert detect_dialect("POST", "/", None, "other", TGI_STREAM) == "other"
    assert detect_dialect("POST", "/", None, "openai", TGI_STREAM) == "openai"
    huge = b'{"stream": true, "parameters": {}, "pad": "' + b"x" * 1_000_000 + b'", "inputs": "hi"}'
    assert detect_dialect("POST", "/", None, body=huge) == "tgi"


def test_tgi_root_route_stream_and_whole_answers_are_read() -> None:
    # as the relay does it: detect (with the body), inspect, then the answer's parser
    sse = (FIXTURES / "tgi_generate_stream.sse").read_bytes()
    dialect = detect_dialect("POST", "/", "application/json", body=TGI_STREAM)
    info = inspect_request(dialect, "/", TGI_STREAM)
    assert (dialect, info.stream) == ("tgi", True)
    p = make_parser(dialect, info.stream, "text/event-stream")
    got = [p.feed(sse[i:i + 7]) for i in range(0, len(sse), 7)]
    got.append(p.finish())
    assert sum(n for n, _ in got) == 3 and sum(t for _, t in got) == 3
    assert (p.usage_completion_tokens, p.usage_prompt_tokens, p.ended) == (4, 7, True)

    whole = (FIXTURES / "tgi_generate.json").read_bytes()
    dialect = detect_dialect("POST", "/", "application/json", body=TGI_WHOLE)
    info = inspect_request(dialect, "/", TGI_WHOLE)
    assert (dialect, info.stream) == ("tgi", False)
    q = make_parser(dialect, info.stream, None)
    assert q.feed(whole) == (0, 0)
    assert q.finish() == (1, 3) and q.usage_completion_tokens == 3
    # the hosted Inference API's one-element list
    r = make_parser(dialect, info.stream, "application/json")
    r.feed(b"[" + whole + b"]")
    assert r.finish() == (1, 3)
