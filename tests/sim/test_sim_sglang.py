"""SGLang's native ``POST /generate`` from the simulator, read the way SGLang's own
``bench_serving`` (``--backend sglang``) reads it: lines, ``data: `` stripped, ``[DONE]``
skipped, ``meta_info.completion_tokens`` for the tokens so far. TGI's ``/generate`` on the
same path is unchanged (tests/sim/test_sim_dialects.py)."""

from __future__ import annotations

import itertools
import json
from typing import Any

from sim_support import get_json, post_raw

from llmtop.sim.server import running_sim
from llmtop.sim.tokens import prompt_tokens

FAST = {"time_scale": 0.3}


def outputs(raw: bytes) -> tuple[list[dict[str, Any]], bool]:
    """(the stream's outputs, whether it ended with ``data: [DONE]``)."""
    events, done = [], False
    for line in raw.split(b"\n"):
        line = line.strip()
        if not line:
            continue
        assert line.startswith(b"data: ") and not done, line
        chunk = line.removeprefix(b"data: ")
        if chunk == b"[DONE]":
            done = True
        else:
            events.append(json.loads(chunk))
    return events, done


async def test_stream_counts_up_in_meta_info_with_the_whole_output_so_far() -> None:
    """One event per engine chunk (``tokens_per_chunk`` 3: three tokens an event, as
    SGLang's ``stream_interval`` sends), cumulative ``text``/``output_ids``, the last
    event with the ``finish_reason``, then ``[DONE]``; the same tokens as the ground
    truth."""
    text = "abcdefghijklmnop"
    async with running_sim("tiny", tokens_per_chunk=3, **FAST) as sim:
        status, headers, raw = await post_raw(
            sim.url + "/generate", {"text": text, "stream": True,
                                    "sampling_params": {"max_new_tokens": 8}})
        (truth,) = await get_json(sim.url + "/sim/requests")
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events, done = outputs(raw)
    assert done
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts[-1] == truth["completion_tokens"] == 8
    steps = [b - a for a, b in itertools.pairwise([0, *counts])]
    assert min(steps) >= 1 and max(steps) == 3  # several tokens an event
    assert len(events) == len(truth["chunks"])  # one event per engine chunk
    assert all(len(e["output_ids"]) == e["meta_info"]["completion_tokens"] for e in events)
    assert all(b["text"].startswith(a["text"]) and len(b["text"]) > len(a["text"])
               for a, b in itertools.pairwise(events))
    metas = [e["meta_info"] for e in events]
    assert {m["prompt_tokens"] for m in metas} == {prompt_tokens(text), truth["prompt_tokens"]}
    assert {m["id"] for m in metas} == {truth["id"]}
    assert all(m["finish_reason"] is None for m in metas[:-1])
    assert metas[-1]["finish_reason"] == {"type": "length", "length": 8}
    assert metas[-1]["e2e_latency"] > 0 and "e2e_latency" not in metas[0]


async def test_not_streamed_input_ids_and_a_sampled_length() -> None:
    async with running_sim("tiny", output_tokens_dist="fixed", output_tokens_mean=5,
                           **FAST) as sim:
        status, headers, raw = await post_raw(sim.url + "/generate",
                                              {"input_ids": [11, 12, 13, 14]})
        (truth,) = await get_json(sim.url + "/sim/requests")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    body = json.loads(raw)
    meta = body["meta_info"]
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (4, 5)
    assert meta["finish_reason"] == {"type": "stop", "matched": 2}
    assert len(body["output_ids"]) == 5 and body["text"].strip()
    assert truth["stream"] is False and truth["completion_tokens"] == 5


async def test_errors_in_sglang_shapes() -> None:
    async with running_sim("tiny", **FAST) as sim:
        status, _, raw = await post_raw(sim.url + "/generate",
                                        {"sampling_params": {"max_new_tokens": 2}})
        assert status == 400
        assert json.loads(raw) == {"error": {
            "message": "Either text, input_ids or input_embeds should be provided."}}
        status, _, raw = await post_raw(sim.url + "/generate", {"text": ["a", "b"]})
        assert status == 400 and "batch" in json.loads(raw)["error"]["message"]
        status, _, raw = await post_raw(sim.url + "/generate", {"text": "a"},
                                        headers={"X-Sim-Fault": "status:503"})
        assert status == 503
        assert json.loads(raw) == {"object": "error", "type": "503", "param": None,
                                   "code": 503,
                                   "message": "simulated error 503 (X-Sim-Fault)"}


async def test_malformed_fault_mid_stream() -> None:
    async with running_sim("tiny", **FAST) as sim:
        _, _, raw = await post_raw(sim.url + "/generate",
                                   {"text": "a", "stream": True,
                                    "sampling_params": {"max_new_tokens": 4}},
                                   headers={"X-Sim-Fault": "malformed-after:2"})
    lines = [ln for ln in raw.split(b"\n") if ln.strip()]
    assert lines[2] == b'data: {"text":"broken'
    assert lines[-1] == b"data: [DONE]"
