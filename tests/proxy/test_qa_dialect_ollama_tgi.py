"""QA of the Ollama NDJSON and TGI SSE dialects through a running proxy: captured bytes
replayed by a real aiohttp upstream behind an upstream path prefix, split across HTTP
chunks mid-line; the client gets them byte for byte, TTFT starts at the first chunk
carrying output (not at an empty first line / a special token), the counts come from the
engine's final object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_proxy_support import Script, read_chunks, running_proxy, scripted_upstream

from llmtop.proxy.dialects.registry import detect_dialect, make_parser

FIX = Path(__file__).parent.parent / "fixtures" / "dialects"
NDJSON = {"Content-Type": "application/x-ndjson"}
SSE = {"Content-Type": "text/event-stream"}
GAP = 0.05


def nd(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def split_mid(data: bytes, at: list[int]) -> list[bytes]:
    out, prev = [], 0
    for i in at:
        out.append(data[prev:i])
        prev = i
    out.append(data[prev:])
    return [c for c in out if c]


async def _through_proxy(prefix: str, path: str, body: dict[str, Any], chunks: list[bytes],
                         headers: dict[str, str]) -> tuple[list[bytes], Any, str]:
    async with scripted_upstream() as up:
        up.script = Script(chunks=chunks, headers=headers, gap_s=GAP)
        async with running_proxy(up.url + prefix) as (_p, url, records), \
                aiohttp.ClientSession() as s, s.post(url + path, json=body) as r:
            got = await read_chunks(r)
        rec = (await records.wait(1))[0]
        return got, rec, up.seen[0].path_qs


async def test_ollama_chat_empty_first_line_does_not_start_ttft() -> None:
    lines = [
        nd({"model": "qwen3", "message": {"role": "assistant", "content": ""}, "done": False}),
        nd({"model": "qwen3", "message": {"role": "assistant", "content": "",
                                          "thinking": "Hm"}, "done": False}),
        nd({"model": "qwen3", "message": {"role": "assistant", "content": "Ok"},
            "done": False}),
        nd({"model": "qwen3", "message": {"role": "assistant", "content": ""}, "done": True,
            "done_reason": "stop", "prompt_eval_count": 31, "eval_count": 4}),
    ]
    data = b"".join(lines)
    # HTTP chunks: [line0 + half of line1], [rest of line1 + half of 2], [rest]
    a = len(lines[0]) + 10
    b = len(lines[0]) + len(lines[1]) + 7
    chunks = split_mid(data, [a, b])
    got, rec, seen = await _through_proxy(
        "/ollama", "/api/chat?x=1",
        {"model": "qwen3", "messages": [{"role": "user", "content": "x"}]}, chunks, NDJSON)
    assert b"".join(got) == data
    assert seen == "/ollama/api/chat?x=1"
    assert rec.dialect == "ollama" and rec.stream is True and rec.model == "qwen3"
    # the first chunk only completes the empty line: the first content is in chunk 2
    assert rec.ttft_s is not None and rec.ttft_s >= GAP * 0.8
    assert len(rec.chunk_offsets_s) == 2
    assert rec.completion_tokens == 4 and rec.prompt_tokens == 31
    assert rec.token_source == "usage" and rec.outcome == "ok" and rec.error is None


async def test_ollama_generate_fixture_split_one_byte_per_line_end() -> None:
    data = (FIX / "ollama_generate.ndjson").read_bytes()
    cuts = [i for i in range(1, len(data)) if data[i - 1:i] == b"\n"]  # a chunk per line
    cuts = [c + 3 for c in cuts if c + 3 < len(data)]  # ...but 3 bytes into the next
    got, rec, _ = await _through_proxy(
        "", "/api/generate", {"model": "llama3.2", "prompt": "hi"},
        split_mid(data, cuts), NDJSON)
    assert b"".join(got) == data
    assert rec.completion_tokens == 5 and rec.prompt_tokens == 26
    assert len(rec.chunk_offsets_s) >= 1 and rec.ttft_s is not None


async def test_ollama_error_line_mid_stream() -> None:
    data = (FIX / "ollama_error.ndjson").read_bytes()
    got, rec, _ = await _through_proxy("", "/api/generate", {"model": "llama3.2"},
                                       [data], NDJSON)
    assert b"".join(got) == data
    assert rec.error is not None and rec.outcome == "error"


async def test_tgi_special_token_first_does_not_start_ttft() -> None:
    def ev(i: int, text: str, special: bool, last: bool = False) -> bytes:
        return b"data:" + json.dumps({
            "index": i, "token": {"id": i, "text": text, "logprob": -0.1,
                                  "special": special},
            "generated_text": "Hi there" if last else None,
            "details": {"finish_reason": "eos_token", "generated_tokens": 4,
                        "seed": None, "input_length": 7} if last else None}).encode() + b"\n\n"
    events = [ev(0, "<s>", True), ev(1, "Hi", False), ev(2, " there", False),
              ev(3, "</s>", True, last=True)]
    data = b"".join(events)
    chunks = split_mid(data, [len(events[0]), len(events[0]) + len(events[1]) + 9])
    got, rec, seen = await _through_proxy(
        "/tgi/", "/generate_stream", {"inputs": "x", "parameters": {"max_new_tokens": 4}},
        chunks, SSE)
    assert b"".join(got) == data
    assert seen == "/tgi/generate_stream"
    assert rec.dialect == "tgi" and rec.stream is True
    assert rec.ttft_s is not None and rec.ttft_s >= GAP * 0.8
    assert rec.completion_tokens == 4 and rec.prompt_tokens == 7


async def test_tgi_error_fixture_through_the_proxy() -> None:
    data = (FIX / "tgi_error.sse").read_bytes()
    got, rec, _ = await _through_proxy("", "/generate_stream", {"inputs": "x"}, [data], SSE)
    assert b"".join(got) == data
    assert rec.error is not None and rec.outcome == "error"


@pytest.mark.parametrize(("path", "want"), [
    ("/api/chat", "ollama"), ("/API/Chat/", "ollama"), ("/ollama/api/generate?x=/v1", "ollama"),
    ("/v1/chat/completions", "openai"), ("/ollama/v1/completions", "openai"),
    ("/generate_stream?a=b", "tgi"), ("/tgi/generate", "tgi"),
    ("/v1/messages?beta=true", "anthropic"), ("/v1/messages/count_tokens", "other"),
    ("/api/embed", "other"), ("/api/tags", "other"),
])
def test_registry_paths(path: str, want: str) -> None:
    assert detect_dialect("post", path, "Application/JSON; charset=UTF-8") == want
    assert detect_dialect("GET", path, None) == "other"


@pytest.mark.parametrize(("ct", "stream", "kind"), [
    ("application/x-ndjson; charset=utf-8", False, "Stream"),
    ("Application/JSON;charset=utf-8", True, "Body"),
    (None, True, "Stream"), ("", False, "Body"),
])
def test_registry_content_type_decides_the_parser(ct: str | None, stream: bool,
                                                   kind: str) -> None:
    assert type(make_parser("ollama", stream, ct)).__name__ == f"Ollama{kind}Parser"


# -- TGI's POST / route: the same SSE as /generate_stream, told apart by the body ----------

TGI_ROOT_BODY = {"inputs": "What is deep learning?", "parameters": {"max_new_tokens": 20},
                 "stream": True}


async def _root_requests(body: dict[str, Any], chunks: list[bytes],
                         headers: dict[str, str], times: int) -> tuple[list[bytes], list[Any]]:
    """``times`` requests to the proxy's ``/``, one after another on one connection (the
    first through aiohttp, later ones possibly the direct path)."""
    async with scripted_upstream() as up:
        up.script = Script(chunks=chunks, headers=headers, gap_s=GAP)
        async with running_proxy(up.url + "/tgi") as (_p, url, records), \
                aiohttp.ClientSession() as s:
            got: list[bytes] = []
            for _ in range(times):
                async with s.post(url + "/", json=body) as r:
                    assert r.status == 200
                    got.append(b"".join(await read_chunks(r)))
        recs = await records.wait(times)
        assert [seen.path_qs for seen in up.seen] == ["/tgi/"] * times
        return got, recs


async def test_tgi_root_route_stream_is_read_as_tgi_through_the_proxy() -> None:
    data = (FIX / "tgi_generate_stream.sse").read_bytes()
    chunks = split_mid(data, [40, len(data) // 2])
    got, recs = await _root_requests(TGI_ROOT_BODY, chunks, SSE, times=2)
    assert got == [data, data]
    for rec in recs:
        assert rec.dialect == "tgi" and rec.stream is True and rec.outcome == "ok"
        assert rec.completion_tokens == 4 and rec.prompt_tokens == 7
        assert rec.token_source == "usage" and rec.error is None
        assert rec.ttft_s is not None and len(rec.chunk_offsets_s) >= 1


async def test_another_apis_root_route_stays_other_through_the_proxy() -> None:
    # an SSE answer at / to a body that is not TGI's: passed through, timed as 'other'
    data = b'data: {"token": {"id": 1, "text": "x", "special": false}}\n\n'
    got, recs = await _root_requests({"prompt": "hi", "stream": True}, [data], SSE, times=2)
    assert got == [data, data]
    for rec in recs:
        assert rec.dialect == "other" and rec.outcome == "ok"
        assert rec.completion_tokens is None and rec.token_source != "usage"


_OLLAMA_LINE = nd({"model": "llama3", "message": {"role": "assistant", "content": "Hi"},
                   "done": False})


@pytest.mark.parametrize(("path", "headers", "chunks", "error"), [
    # ollama's client raises ResponseError on the error line, text-generation's
    # GenerationError on the error event; every SDK raises on malformed JSON
    ("/api/chat", NDJSON, [_OLLAMA_LINE, nd({"error": "unexpected EOF"})],
     "upstream error event"),
    ("/generate_stream", SSE, [e + b"\n\n" for e in
                               (FIX / "tgi_error.sse").read_bytes().split(b"\n\n")[1:3]],
     "upstream error event (generation)"),
    ("/api/generate", NDJSON, [nd({"model": "m", "response": "Hi", "done": False}),
                               b'{"model":"m","response":"bro\n'],
     "malformed stream: malformed JSON line in stream"),
], ids=["ollama-error-line", "tgi-error-event", "ollama-malformed-line"])
async def test_a_client_that_leaves_on_the_streams_error_records_the_error(
        path: str, headers: dict[str, str], chunks: list[bytes], error: str) -> None:
    # the upstream keeps the stream open after its error (as the sim does after malformed
    # data): the client, which raises on the error and closes, leaves first
    async with scripted_upstream() as up:
        up.script = Script(chunks=[*chunks, b""], headers=headers, gap_s=GAP,
                           hang_after=len(chunks))
        async with running_proxy(up.url) as (_p, url, records), \
                aiohttp.ClientSession() as s:
            async with s.post(url + path, json={"model": "m", "inputs": "x"}) as r:
                got = b""
                async for piece in r.content.iter_any():
                    got += piece
                    if got.endswith(chunks[-1]):
                        break  # what the SDKs do: raise, and close the response
            rec = (await records.wait(1))[0]
    assert got == b"".join(chunks)
    assert rec.status == 200
    assert (rec.outcome, rec.error) == ("error", error)
    assert rec.ttft_s is not None and len(rec.chunk_offsets_s) == 1
