"""Compressed responses: the client gets the upstream's compressed bytes unchanged, the
parser reads an inflated copy (tokens counted as for a plain body), and a request whose body
llmtop edited to ask for usage asks for an uncompressed answer, so the usage event it added
can be removed again."""

from __future__ import annotations

import gzip
import json
import random
import zlib

import aiohttp
import pytest
from test_proxy_support import Script, openai_chunks, running_proxy, scripted_upstream, sha

from llmtop.proxy.dialects.compressed import MAX_INFLATED, InflatingParser
from llmtop.proxy.dialects.registry import make_parser

CHAT = "/v1/chat/completions"
USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
EVENTS = openai_chunks(["a", "b", "c"], usage=USAGE)


def gzip_stream(parts: list[bytes], wbits: int = 31) -> list[bytes]:
    """Each part compressed and sync-flushed (decodable as it arrives), then the trailer."""
    c = zlib.compressobj(6, zlib.DEFLATED, wbits)
    out = [c.compress(p) + c.flush(zlib.Z_SYNC_FLUSH) for p in parts]
    out[-1] += c.flush()
    return out


def _parse(parser: object, reads: list[bytes]) -> tuple[int, int, int | None]:
    events = toks = 0
    for r in reads:
        e, t = parser.feed(r)  # type: ignore[attr-defined]
        events, toks = events + e, toks + t
    e, t = parser.finish()  # type: ignore[attr-defined]
    return events + e, toks + t, parser.usage_completion_tokens  # type: ignore[attr-defined]


@pytest.mark.parametrize(("encoding", "wbits"), [("gzip", 31), ("deflate", 15),
                                                 ("deflate", -15)])
def test_inflated_copy_reads_as_the_plain_body_at_any_split(encoding: str, wbits: int) -> None:
    plain = _parse(make_parser("openai", True, "text/event-stream"), EVENTS)
    body = b"".join(gzip_stream(EVENTS, wbits))
    rng = random.Random(7)
    cuts = [sorted(rng.sample(range(1, len(body)), k)) for k in (1, 3, 12)]
    cuts.append(list(range(1, len(body))))  # every byte its own read
    for cut in cuts:
        reads = [body[i:j] for i, j in zip([0, *cut], [*cut, len(body)], strict=True)]
        p = InflatingParser(make_parser("openai", True, "text/event-stream"), encoding)
        assert _parse(p, reads) == plain == (3, 3, 3)
        assert p.error is None and p.usage_seen


def test_garbage_and_bombs_stop_parsing_with_an_error_not_an_exception() -> None:
    p = InflatingParser(make_parser("openai", True, "text/event-stream"), "gzip")
    assert p.feed(b"this is not gzip at all") == (0, 0)
    assert p.error is not None and "malformed compressed body" in p.error
    assert p.feed(gzip.compress(EVENTS[0])) == (0, 0) and p.finish() == (0, 0)
    bomb = zlib.compress(b"\0" * (MAX_INFLATED + 1024), 9)
    q = InflatingParser(make_parser("openai", False, "application/json"), "deflate")
    assert q.feed(bomb) == (0, 0) and "inflates past" in (q.error or "")


async def test_gzip_json_answer_counts_its_tokens_and_passes_unchanged() -> None:
    answer = json.dumps({"id": "x", "object": "chat.completion", "model": "m1", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "abc"},
         "finish_reason": "stop"}], "usage": USAGE}).encode()
    body = gzip.compress(answer)
    async with scripted_upstream() as up:
        up.script = Script(chunks=[body], content_length=True, headers={
            "Content-Type": "application/json", "Content-Encoding": "gzip"})
        async with running_proxy(up.url) as (_, url, recs), \
                aiohttp.ClientSession(auto_decompress=False) as s:
            async with s.post(url + CHAT, json={"model": "m", "messages": []}) as r:
                got = await r.read()
                assert r.headers["Content-Encoding"] == "gzip"
            (rec,) = await recs.wait(1)
    assert got == body
    assert rec.outcome == "ok" and rec.completion_tokens == 3 and rec.prompt_tokens == 5


async def test_gzip_stream_the_client_asked_usage_for_is_timed_chunk_by_chunk() -> None:
    parts = gzip_stream(EVENTS)
    async with scripted_upstream() as up:
        up.script = Script(chunks=parts, gap_s=0.02, headers={
            "Content-Type": "text/event-stream", "Content-Encoding": "gzip"})
        async with running_proxy(up.url) as (_, url, recs), \
                aiohttp.ClientSession(auto_decompress=False) as s:
            async with s.post(url + CHAT, json={"model": "m", "stream": True, "stream_options":
                                                {"include_usage": True}}) as r:
                got = await r.read()
            (rec,) = await recs.wait(1)
    assert sha([got]) == sha(parts)
    assert rec.outcome == "ok" and rec.completion_tokens == 3 and rec.token_source == "usage"
    assert len(rec.chunk_offsets_s) == 3  # one per content event, as for a plain stream
    assert up.seen[0].headers.count(("Accept-Encoding", "gzip, deflate")) == 1  # untouched


@pytest.mark.parametrize("accept", ["gzip, deflate, br", None])
async def test_injected_usage_asks_for_an_uncompressed_answer(accept: str | None) -> None:
    async with scripted_upstream() as up:
        up.script = Script(chunks=EVENTS, headers={"Content-Type": "text/event-stream"})
        async with running_proxy(up.url) as (_, url, recs), \
                aiohttp.ClientSession(skip_auto_headers=["Accept-Encoding"]) as s:
            headers = {"Accept-Encoding": accept} if accept else {}
            async with s.post(url + CHAT, headers=headers, json={"model": "m",
                                                                 "stream": True}) as r:
                got = await r.read()
            (rec,) = await recs.wait(1)
    sent = dict(up.seen[0].headers)
    assert sent.get("Accept-Encoding") == ("identity" if accept else None)
    assert b'"usage"' not in got and rec.completion_tokens == 3  # the added event removed
