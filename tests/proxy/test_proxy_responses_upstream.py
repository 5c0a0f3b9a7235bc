"""``POST /v1/responses`` through the proxy against a scripted upstream: the request goes
up byte for byte (no ``stream_options`` injected: the Responses API always sends usage),
the answer comes back byte for byte, and the record is an ``openai`` stream measured from
the API's own events; the API's other routes pass through unmeasured as plain requests."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
from test_proxy_support import Script, read_chunks, running_proxy, scripted_upstream

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dialects"
SSE = {"Content-Type": "text/event-stream"}
RESP = "/v1/responses"


def _events(raw: bytes) -> list[bytes]:
    """The fixture's events, one write each."""
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e]


async def test_stream_request_goes_up_unchanged_and_is_measured() -> None:
    raw = (FIXTURES / "llamacpp_responses_stream.sse").read_bytes()
    # spacing and key order as a client wrote them: any re-encoding would show
    request = (b'{ "model":"smollm2-135m-instruct", "stream": true,\n'
               b' "input": "Say hello to a new colleague.", "max_output_tokens": 24 }')
    async with scripted_upstream() as up:
        up.script = Script(chunks=_events(raw), headers=SSE, gap_s=0.002)
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            async with s.post(url + RESP, data=request,
                              headers={"Content-Type": "application/json"}) as r:
                got = await read_chunks(r)
            (rec,) = await recs.wait(1)
    assert up.seen[0].body == request  # no stream_options.include_usage injected
    assert ("Accept-Encoding", "identity") not in up.seen[0].headers
    assert b"".join(got) == raw
    assert rec.dialect == "openai" and rec.path == RESP and rec.stream is True
    assert rec.outcome == "ok" and rec.error is None
    assert rec.model == "smollm2-135m-instruct"
    # 22 text deltas; the engine's usage counts 23 (its end-of-sequence token)
    assert rec.token_source == "usage"
    assert (rec.prompt_tokens, rec.completion_tokens) == (37, 23)
    assert 1 <= len(rec.chunk_offsets_s) <= 22 and sum(rec.chunk_tokens) == 23
    assert rec.ttft_s is not None and rec.ttft_s <= rec.chunk_offsets_s[0] + 1e-9


async def test_whole_answer_is_measured() -> None:
    raw = (FIXTURES / "llamacpp_responses.json").read_bytes()
    request = json.dumps({"model": "smollm2-135m-instruct", "input": "hi"}).encode()
    async with scripted_upstream() as up:
        up.script = Script(chunks=[raw], content_length=True)
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            async with s.post(url + RESP, data=request) as r:
                assert await r.read() == raw
            (rec,) = await recs.wait(1)
    assert up.seen[0].body == request
    assert rec.dialect == "openai" and rec.stream is False and rec.outcome == "ok"
    assert (rec.prompt_tokens, rec.completion_tokens, rec.token_source) == (37, 23, "usage")


async def test_failed_stream_is_recorded_as_the_engines_error() -> None:
    raw = (FIXTURES / "openai_responses_failed_crlf.sse").read_bytes()
    async with scripted_upstream() as up:
        up.script = Script(chunks=[raw], headers=SSE)
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            async with s.post(url + RESP, json={"model": "m", "input": "x",
                                                "stream": True}) as r:
                assert b"".join(await read_chunks(r)) == raw
            (rec,) = await recs.wait(1)
    assert rec.outcome == "error" and rec.status == 200
    # the record names the engine's error by its kind (its text may quote the prompt)
    assert rec.error == "upstream error event (server_error)"
    assert rec.completion_tokens == 3 and rec.token_source == "usage"


async def test_other_responses_routes_pass_through_as_plain_requests() -> None:
    """input_tokens, retrieve, cancel and delete are answered as they come: the POSTs are
    recorded as dialect ``other`` (nothing to time in them), the GET and DELETE not at
    all (not generations)."""
    stored = {"id": "resp_1", "object": "response", "status": "completed",
              "output": [{"type": "message", "content": [{"type": "output_text",
                                                          "text": "old answer"}]}],
              "usage": {"input_tokens": 3, "output_tokens": 2}}
    answer = json.dumps(stored).encode()
    async with scripted_upstream() as up:
        up.script = Script(chunks=[answer], content_length=True)
        async with running_proxy(up.url) as (_, url, recs), aiohttp.ClientSession() as s:
            for method, path in [("POST", RESP + "/input_tokens"), ("GET", RESP + "/resp_1"),
                                 ("POST", RESP + "/resp_1/cancel"),
                                 ("DELETE", RESP + "/resp_1")]:
                async with s.request(method, url + path, json={"input": "x"}) as r:
                    assert r.status == 200 and await r.read() == answer
            records = await recs.wait(2)
    assert [u.body for u in up.seen] == [b'{"input": "x"}'] * 4
    assert [(r.path, r.dialect) for r in records] == [
        (RESP + "/input_tokens", "other"), (RESP + "/resp_1/cancel", "other")]
    # the stored answer's usage is not this request's output: nothing is read from it
    assert all(r.completion_tokens is None and r.prompt_tokens is None for r in records)
    assert all(r.token_source == "chunks" and r.model is None for r in records)
