"""Helpers for the simulator's tests: parsing streams the way real clients do."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


def sse_events(raw: bytes) -> list[tuple[str | None, str]]:
    """Server-sent events as (event name, data) pairs, by the WHATWG rules: lines end in
    \\n or \\r\\n, a blank line ends an event, ``data:`` lines join with \\n, one leading
    space after the colon is dropped, ``:`` lines are comments."""
    events: list[tuple[str | None, str]] = []
    name: str | None = None
    data: list[str] = []
    for line in raw.decode().replace("\r\n", "\n").split("\n"):
        if line == "":
            if data:
                events.append((name, "\n".join(data)))
            name, data = None, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            data.append(value)
        elif field == "event":
            name = value
    if data:
        events.append((name, "\n".join(data)))
    return events


async def post_raw(url: str, body: dict[str, Any], headers: dict[str, str] | None = None
                   ) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=headers) as r:
        return r.status, dict(r.headers), await r.read()


async def metric_values(url: str) -> dict[str, float]:
    """``/metrics`` parsed by prometheus_client's own parser: sample name → value (labels
    other than model_name folded into the name as ``name{k=v}``)."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            extra = {k: v for k, v in sample.labels.items() if k != "model_name"}
            key = sample.name + ("" if not extra else "{" + ",".join(
                f"{k}={v}" for k, v in sorted(extra.items())) + "}")
            out[key] = sample.value
    return out


async def get_json(url: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200
        return json.loads(await r.read())


def chat_body(max_tokens: int | None = 8, stream: bool = True, content: str = "hello",
              **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": content}],
                            "stream": stream, **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body
