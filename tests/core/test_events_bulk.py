"""The events' JSON shapes for long answers (16k-token reasoning streams): built without
``dataclasses.asdict``'s per-value deep copy (33–82 ms a record: the admin API's recent
list and ``export --parquet`` spent seconds in it), the same dicts as before; and the
per-request ITL spread, vectorised for long records, the same values as the rule."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtop.events import EngineReading, GpuReading, RequestRecord, WarningEvent


def _record(offs: tuple[float, ...], toks: tuple[int, ...]) -> RequestRecord:
    return RequestRecord(
        id="r1", user="alice", model="m", dialect="openai", path="/v1/chat/completions",
        stream=True, status=200, outcome="ok", t_start=1.7e9, ttft_s=offs[0] if offs else None,
        e2e_s=(offs[-1] if offs else 0.0) + 0.01, prompt_tokens=37,
        completion_tokens=sum(toks), token_source="usage", chunk_offsets_s=offs,
        chunk_tokens=toks, concurrency_at_start=4, error=None)


def _long(n: int, seed: int = 7) -> RequestRecord:
    rnd = random.Random(seed)
    offs, t = [], 0.02
    for _ in range(n):
        t += 0.003 + rnd.random() * 0.0003
        offs.append(t)
    toks = [1] * n
    toks[-1] = 2  # the stop token, rescaled into the last chunk
    return _record(tuple(offs), tuple(toks))


def _old_shape(ev: Any, kind: str) -> dict[str, Any]:
    """What ``to_json_dict`` returned when it was built on ``asdict``."""
    d = dataclasses.asdict(ev)
    if kind == "request":
        d["chunk_offsets_s"] = list(ev.chunk_offsets_s)
        d["chunk_tokens"] = list(ev.chunk_tokens)
    return {"type": kind, **d}


def test_a_long_request_dict_is_built_without_a_deep_copy_per_chunk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    r = _long(10_000)
    calls = [0]
    real = copy.deepcopy

    def counting(x: Any, memo: Any = None) -> Any:
        calls[0] += 1
        return real(x, memo)

    monkeypatch.setattr(copy, "deepcopy", counting)
    d = r.to_json_dict()
    monkeypatch.undo()
    assert calls[0] == 0  # asdict made ~20,000 of them (every offset and token count)
    assert d == _old_shape(r, "request")
    assert list(d) == ["type", *(f.name for f in dataclasses.fields(RequestRecord))]
    assert type(d["chunk_offsets_s"]) is list and type(d["chunk_tokens"]) is list
    assert RequestRecord.from_json_dict(json.loads(json.dumps(d))) == r


def test_every_event_dict_equals_the_asdict_shape_key_for_key() -> None:
    g = GpuReading(t=1.0, index=0, name="H200", mem_used_bytes=1, mem_total_bytes=2,
                   util_gpu=50.0, dram_bw_util=55.0, simulated=True, pcie_tx_bytes_s=3.0)
    e = EngineReading(t=2.0, kind="vllm", running=3, waiting=1, kv_cache_usage=0.5,
                      ttft_buckets=((0.1, 2.0), (float("inf"), 3.0)), raw={"a": 1.0})
    w = WarningEvent(t=3.0, code="QUEUEING", severity="critical", message="m", state="raised")
    for ev, kind in ((g, "gpu"), (w, "warning"), (_long(100), "request")):
        d = ev.to_json_dict()
        want = _old_shape(ev, kind)
        if kind == "warning":  # 'since' is written only when set (a carried warning)
            assert want.pop("since") is None
        assert d == want and list(d) == list(want)
    carried = WarningEvent(t=3.0, code="QUEUEING", severity="critical", message="m",
                           state="raised", since=1.5)
    assert carried.to_json_dict() == _old_shape(carried, "warning")
    assert WarningEvent.from_json_dict(carried.to_json_dict()) == carried
    d = e.to_json_dict()
    want = _old_shape(e, "engine")
    want["ttft_buckets"] = [[0.1, 2.0], ["+Inf", 3.0]]
    assert d == want and list(d) == list(want)
    d["raw"]["b"] = 2.0  # the dict is the caller's: the reading is not changed through it
    assert e.raw == {"a": 1.0}


def _rule(offs: tuple[float, ...], toks: tuple[int, ...]) -> list[float]:
    """A chunk with k > 0 tokens: k samples of g/k, g from the previous chunk that carried
    tokens (or chunk 0); a chunk with k <= 0 none, and it takes no time."""
    out: list[float] = []
    a = 0
    for i in range(1, len(offs)):
        k = toks[i] if i < len(toks) else 1
        if k > 0:
            out.extend([(offs[i] - offs[a]) / k] * k)
            a = i
    return out


def _last_token_chunk(offs: tuple[float, ...], toks: tuple[int, ...]) -> int:
    return max((i for i in range(1, len(offs)) if (toks[i] if i < len(toks) else 1) > 0),
               default=0)


def _zero_shapes(n: int) -> dict[str, tuple[int, ...]]:
    """0-token chunks in the middle, at the end, several in a row, right after the first."""
    mid = [1 + i % 3 for i in range(n)]
    mid[n // 2] = 0
    end = [2] * n
    end[-1] = end[-2] = 0
    run = [1] * n
    run[n // 3:n // 3 + 5] = [0] * 5
    run[-1] = 3
    after_first = [1] * n
    after_first[1] = after_first[2] = 0
    after_first[-1] = 2
    return {"middle": tuple(mid), "end": tuple(end), "run": tuple(run),
            "after_first": tuple(after_first)}


@pytest.mark.parametrize("n", [12, 300, 5000])  # the loop, the splice, numpy's repeat
@pytest.mark.parametrize("shape", ["middle", "end", "run", "after_first"])
def test_a_zero_token_chunk_gives_no_sample_and_swallows_no_time(n: int, shape: str) -> None:
    """The gap of the next token-carrying chunk runs from the last one that carried tokens:
    the samples add up to offs[last token chunk] − offs[0], so mean ITL agrees with TPOT."""
    offs = _long(n, seed=n).chunk_offsets_s
    toks = _zero_shapes(n)[shape]
    got = _record(offs, toks).itl_samples_s()
    assert got == _rule(offs, toks)
    assert len(got) == sum(k for k in toks[1:] if k > 0)
    assert sum(got) == pytest.approx(offs[_last_token_chunk(offs, toks)] - offs[0], rel=1e-9)


@pytest.mark.parametrize("shape", ["last2", "every3", "mixed", "zeros", "short", "long",
                                   "none", "negative"])
def test_long_itl_spread_gives_exactly_the_rules_values(shape: str) -> None:
    base = _long(5000, seed=11)
    offs = base.chunk_offsets_s
    n = len(offs)
    rnd = random.Random(shape)
    toks: tuple[int, ...] = {
        "last2": base.chunk_tokens,
        "every3": (3,) * n,
        "mixed": tuple(rnd.choice((1, 1, 2, 5)) for _ in range(n)),
        "zeros": tuple(rnd.choice((0, 1, 1, 4)) for _ in range(n)),
        "short": (1,) * 100 + (2,) * 50,
        "long": (1,) * (n - 1) + (3,) + (7,) * 40,
        "none": (),
        "negative": tuple(-1 if i % 97 == 0 else 2 if i % 5 == 0 else 1 for i in range(n)),
    }[shape]
    got = _record(offs, toks).itl_samples_s()
    assert type(got) is list and all(type(x) is float for x in got[:50])
    assert got == _rule(offs, toks)
    assert sum(got) == pytest.approx(offs[_last_token_chunk(offs, toks)] - offs[0], rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 100), min_size=60, max_size=400).map(lambda xs: tuple(sorted(xs))),
       st.lists(st.sampled_from([1, 1, 1, 1, 1, 1, 2, 3, 0, 17]), max_size=420).map(tuple))
def test_itl_spread_of_any_long_record_follows_the_rule(
        offs: tuple[float, ...], toks: tuple[int, ...]) -> None:
    assert _record(offs, toks).itl_samples_s() == _rule(offs, toks)
