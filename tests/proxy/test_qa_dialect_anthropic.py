"""QA of the Anthropic Messages dialect against what Anthropic really streams: blocks
that carry output without a non-empty delta (a tool call without arguments, redacted
thinking), checked on the parser and through a running proxy (byte-exact, TTFT set)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from test_proxy_support import Script, read_chunks, running_proxy, scripted_upstream

from llmtop.proxy.dialects.anthropic import AnthropicStreamParser
from llmtop.proxy.dialects.registry import make_parser

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8"}


def ev(name: str, obj: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode()


def start(model: str = "claude-t") -> bytes:
    return ev("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": model,
        "content": [], "usage": {"input_tokens": 9, "output_tokens": 1}}})


def end(output_tokens: int) -> list[bytes]:
    return [
        ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                             "usage": {"output_tokens": output_tokens}}),
        ev("message_stop", {"type": "message_stop"}),
    ]


def tool_start(index: int = 0, name: str = "get_time", tool_id: str = "toolu_1") -> bytes:
    """The block that names a tool (its ``content_block_start``)."""
    return ev("content_block_start", {"type": "content_block_start", "index": index,
                                      "content_block": {"type": "tool_use", "id": tool_id,
                                                        "name": name, "input": {}}})


def tool_args(partial_json: str, index: int = 0) -> bytes:
    return ev("content_block_delta", {"type": "content_block_delta", "index": index,
                                      "delta": {"type": "input_json_delta",
                                                "partial_json": partial_json}})


def block_stop(index: int = 0) -> bytes:
    return ev("content_block_stop", {"type": "content_block_stop", "index": index})


def noarg_tool(index: int = 0) -> list[bytes]:
    """What the API streams for a tool whose input is ``{}``."""
    return [tool_start(index), tool_args("", index), block_stop(index)]


def redacted(index: int = 0) -> list[bytes]:
    return [
        ev("content_block_start", {"type": "content_block_start", "index": index,
                                   "content_block": {"type": "redacted_thinking",
                                                     "data": "EmwKAhgBEgy3va3pzix"}}),
        ev("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def feed_all(chunks: list[bytes]) -> tuple[list[tuple[int, int]], AnthropicStreamParser]:
    p = AnthropicStreamParser()
    out = [p.feed(c) for c in chunks]
    out.append(p.finish())
    return out, p


def test_tool_call_without_arguments_is_content() -> None:
    out, p = feed_all([start(), *noarg_tool(), *end(12)])
    # the tool block's content_block_start (2nd read), which names the tool, is content;
    # its empty partial_json and its stop are not
    assert [o[0] for o in out] == [0, 1, 0, 0, 0, 0, 0]
    assert p.usage_completion_tokens == 12 and p.ended and p.error is None


def test_tool_call_with_arguments_counts_its_start_and_deltas_not_its_stop() -> None:
    chunks = [
        start(),
        tool_start(1, "w", "t"),
        tool_args("", 1),
        tool_args("{\"a\": 1}", 1),
        block_stop(1),
        *end(5),
    ]
    out, _ = feed_all(chunks)
    # start (the tool's name), "" (not content), the arguments, stop (not content)
    assert [o[0] for o in out] == [0, 1, 0, 1, 0, 0, 0, 0]


def test_tool_call_ttft_is_its_name_as_in_the_openai_dialect() -> None:
    # The same answer in both APIs: a tool call named first, its arguments later. OpenAI's
    # first tool_calls delta carries the name and empty arguments and is content; the
    # Anthropic block that names the tool is its content_block_start. TTFT is the same read.
    oa = [
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
        b'"delta":{"role":"assistant","content":null},"finish_reason":null}]}\n\n',
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
        b'"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":'
        b'{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}\n\n',
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
        b'"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"city\\": '
        b'\\"Oslo\\"}"}}]},"finish_reason":null}]}\n\n',
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
        b'"delta":{},"finish_reason":"tool_calls"}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    an = [
        start(),
        tool_start(name="get_weather"),
        tool_args("{\"city\": \"Oslo\"}"),
        block_stop(),
        b"".join(end(9)),
    ]
    o = make_parser("openai", True, "text/event-stream")
    a = make_parser("anthropic", True, "text/event-stream")
    oa_events = [o.feed(c)[0] for c in oa]
    an_events = [a.feed(c)[0] for c in an]
    assert oa_events == an_events == [0, 1, 1, 0, 0]
    assert o.error is None and a.error is None


def test_server_tool_use_start_is_content_and_other_block_starts_are_not() -> None:
    def block(kind: str, **extra: Any) -> bytes:
        return ev("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": kind, **extra}})
    p = AnthropicStreamParser()
    assert p.feed(block("server_tool_use", id="srvtoolu_1", name="web_search",
                        input={})) == (1, 1)
    for quiet in (block("text", text=""), block("thinking", thinking=""),
                  block("web_search_tool_result", tool_use_id="srvtoolu_1", content=[]),
                  block("redacted_thinking", data="")):
        assert p.feed(quiet) == (0, 0)


def test_two_noarg_tools_in_one_read_and_split_bytewise() -> None:
    body = b"".join([start(), *noarg_tool(0), *noarg_tool(1), *end(20)])
    p = AnthropicStreamParser()
    assert p.feed(body)[0] == 2
    q = AnthropicStreamParser()
    assert sum(q.feed(body[i:i + 1])[0] for i in range(len(body))) + q.finish()[0] == 2


def test_redacted_thinking_block_is_reasoning_content() -> None:
    out, p = feed_all([start(), *redacted(0), *end(3)])
    assert [o[0] for o in out] == [0, 1, 0, 0, 0, 0]
    assert p.error is None


def test_hostile_blocks_never_raise() -> None:
    p = make_parser("anthropic", True, "text/event-stream")
    for data in (b'data: {"type":"content_block_start","index":[1],'
                 b'"content_block":{"type":["tool_use"]}}\n\n',
                 b'data: {"type":"content_block_stop","index":{"a":1}}\n\n',
                 b'data: {"type":"content_block_start","content_block":{"type":"tool_use"}}'
                 b'\n\n' * 200):
        p.feed(data)
    p.finish()
    assert p.error is None


async def test_noarg_tool_call_through_the_proxy_has_a_ttft_and_is_byte_exact() -> None:
    chunks = [start(), *noarg_tool(), *end(12)]
    async with scripted_upstream() as up:
        up.script = Script(chunks=chunks, headers=SSE_HEADERS, gap_s=0.01)
        async with running_proxy(up.url) as (_proxy, url, records), \
                aiohttp.ClientSession() as s, \
                s.post(url + "/v1/messages?beta=true",
                       json={"model": "claude-t", "stream": True, "max_tokens": 10,
                             "messages": [{"role": "user", "content": "time?"}]}) as r:
            got = await read_chunks(r)
            assert r.status == 200
        assert b"".join(got) == b"".join(chunks)
        rec = (await records.wait(1))[0]
        assert rec.dialect == "anthropic"
        assert rec.ttft_s is not None
        assert len(rec.chunk_offsets_s) == 1  # the tool's content_block_start
        assert rec.completion_tokens == 12 and rec.token_source == "usage"
        assert rec.prompt_tokens == 9 and rec.error is None and rec.outcome == "ok"


def test_message_delta_with_null_cache_counts_keeps_the_cached_prompt_tokens() -> None:
    # MessageDeltaUsage's prompt fields are each optional; the SDK merges them key by key
    chunks = [
        ev("message_start", {"type": "message_start", "message": {
            "model": "claude-t", "usage": {"input_tokens": 9, "cache_creation_input_tokens": 0,
                                           "cache_read_input_tokens": 100,
                                           "output_tokens": 1}}}),
        ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                             "usage": {"input_tokens": 9, "cache_creation_input_tokens": None,
                                       "cache_read_input_tokens": None,
                                       "output_tokens": 12}}),
    ]
    _, p = feed_all(chunks)
    assert p.usage_prompt_tokens == 109
    assert p.usage_completion_tokens == 12


def test_message_delta_resending_all_prompt_counts_replaces_them() -> None:
    chunks = [
        ev("message_start", {"type": "message_start", "message": {
            "model": "claude-t", "usage": {"input_tokens": 9, "output_tokens": 1}}}),
        ev("message_delta", {"type": "message_delta", "delta": {},
                             "usage": {"input_tokens": 10, "cache_creation_input_tokens": 5,
                                       "cache_read_input_tokens": 0,
                                       "output_tokens": 3}}),
    ]
    _, p = feed_all(chunks)
    assert p.usage_prompt_tokens == 15
    _, q = feed_all([ev("message_delta", {"type": "message_delta",
                                          "usage": {"output_tokens": 3}})])
    assert q.usage_prompt_tokens is None and q.usage_completion_tokens == 3


async def test_tool_call_ttft_through_the_proxy_is_when_the_name_arrives() -> None:
    # the tool's name comes at once; its arguments GAP later: TTFT is the name's chunk
    gap = 0.15
    named = tool_start(name="get_weather")
    args = tool_args("{\"city\": \"Oslo\"}")
    stop = block_stop()
    chunks = [start() + named, args + stop, b"".join(end(9))]
    async with scripted_upstream() as up:
        up.script = Script(chunks=chunks, headers=SSE_HEADERS, gap_s=gap)
        async with running_proxy(up.url) as (_proxy, url, records), \
                aiohttp.ClientSession() as s, \
                s.post(url + "/v1/messages",
                       json={"model": "claude-t", "stream": True, "max_tokens": 10,
                             "messages": [{"role": "user", "content": "weather?"}]}) as r:
            got = await read_chunks(r)
        assert b"".join(got) == b"".join(chunks)
        rec = (await records.wait(1))[0]
    assert rec.dialect == "anthropic" and rec.outcome == "ok" and rec.error is None
    offs = rec.chunk_offsets_s
    assert len(offs) == 2  # the name's chunk, then the arguments' chunk
    assert rec.ttft_s == offs[0]
    assert offs[1] - offs[0] >= gap * 0.8  # TTFT did not wait for the arguments
    assert rec.completion_tokens == 9 and rec.token_source == "usage"
