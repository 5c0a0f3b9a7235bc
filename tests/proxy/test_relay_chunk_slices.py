"""While a stream is open the relay publishes its chunks in slices (every HOLD_AT chunks or
SLICE_NS), so the metrics can file its ITL samples as they happen: the slices, in order,
are exactly the record's chunks (times and raw counts), without gap or overlap; the
recorder never writes them; and they cross from a ``--workers`` process to the
coordinator intact."""

from __future__ import annotations

import itertools
import pickle
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import pytest
from test_proxy_support import Script, openai_chunks, running_proxy, scripted_upstream

from llmtop.events import ChunkSlice, Event, RequestRecord
from llmtop.proxy import relay
from llmtop.recording.reader import RecordingReader
from llmtop.recording.writer import Recorder
from llmtop.workers import EventForwarder
from llmtop.workers_wire import WIRE_VERSION, IngestError, decode_batch, encode_batch

SSE = {"Content-Type": "text/event-stream"}


async def _stream(
    n: int, gap_s: float, **overrides: object
) -> tuple[RequestRecord, list[ChunkSlice]]:
    slices: list[ChunkSlice] = []

    def take(batch: Sequence[Event]) -> None:
        slices.extend(e for e in batch if isinstance(e, ChunkSlice))

    texts = [f"t{i} " for i in range(n)]
    async with scripted_upstream() as up, running_proxy(up.url) as (proxy, url, records):
        proxy.bus.subscribe(take)
        up.script = Script(
            chunks=openai_chunks(texts, usage={"prompt_tokens": 3, "completion_tokens": n}),
            headers=SSE,
            gap_s=gap_s,
        )
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                url + "/v1/chat/completions",
                json={"model": "m1", "stream": True, "messages": [], **overrides},
            ) as resp,
        ):
            await resp.read()
        rec = (await records.wait(1))[0]
    return rec, slices


def _check_cover(rec: RequestRecord, slices: list[ChunkSlice]) -> int:
    """The slices are the record's first chunks, in order; returns how many."""
    n = 0
    prev: int | None = None
    for sl in slices:
        assert sl.id == rec.id and sl.model == rec.model and sl.first == n
        assert sl.prev_ns == prev
        t0 = sl.t0_ns
        assert (
            tuple((o - t0) / 1e9 for o in sl.offsets_ns)
            == rec.chunk_offsets_s[n : n + len(sl.offsets_ns)]
        )
        assert sl.tokens == rec.chunk_tokens[n : n + len(sl.tokens)]
        assert sl.t == pytest.approx(rec.t_start + rec.chunk_offsets_s[n + len(sl.tokens) - 1])
        n += len(sl.offsets_ns)
        prev = sl.offsets_ns[-1]
    return n


async def test_slices_every_hold_at_chunks_are_the_records_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(relay, "HOLD_AT", 5)
    rec, slices = await _stream(40, 0.003)
    assert rec.outcome == "ok" and rec.token_source == "usage"
    m = len(rec.chunk_offsets_s)
    assert m >= 30  # reads may merge
    assert len(slices) >= m // 5 - 1
    covered = _check_cover(rec, slices)
    assert m - 5 <= covered <= m


async def test_a_slow_stream_publishes_every_slice_ns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Far fewer than HOLD_AT chunks: the time since the last slice sends one."""
    monkeypatch.setattr(relay, "SLICE_NS", 40_000_000)
    rec, slices = await _stream(30, 0.015)
    assert len(slices) >= 4
    covered = _check_cover(rec, slices)
    assert covered >= len(rec.chunk_offsets_s) - 5
    assert all(len(sl.offsets_ns) < relay.HOLD_AT for sl in slices)


async def test_a_non_streamed_answer_publishes_no_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay, "HOLD_AT", 2)
    monkeypatch.setattr(relay, "SLICE_NS", 1)
    slices: list[ChunkSlice] = []
    async with scripted_upstream() as up, running_proxy(up.url) as (proxy, url, records):
        proxy.bus.subscribe(lambda b: slices.extend(e for e in b if isinstance(e, ChunkSlice)))
        up.script = Script(
            chunks=[b'{"choices": [{"message": {"content": "hi there"}}]}'], gap_s=0.01
        )
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                url + "/v1/chat/completions", json={"model": "m1", "stream": False, "messages": []}
            ) as resp,
        ):
            await resp.read()
        rec = (await records.wait(1))[0]
    assert not rec.stream and slices == []


def _slice(i: int = 0, n: int = 600) -> ChunkSlice:
    return ChunkSlice(
        id=f"w1-{i}",
        user="u",
        model=None if i % 2 else "m",
        t=1.7e9 + 1 / 3,
        t0_ns=123_456_789,
        first=512 * i,
        prev_ns=None if i == 0 else 99,
        offsets_ns=tuple(10**12 + 7 * k for k in range(n)),
        tokens=tuple(1 + k % 3 for k in range(n)),
    )


def test_a_slice_crosses_the_workers_wire_intact_and_counts_as_chunks() -> None:
    events: list[Event] = [_slice(0), _slice(1), _slice(2, 3)]
    got = decode_batch(encode_batch(3, 0, events, [], sender="s", seq=1))
    assert got.events == events
    fwd = EventForwarder("http://127.0.0.1:9/x", "t", 1, {})
    fwd.buffer.extend(_slice(i, 200_000) for i in range(4))
    assert len(fwd.take()) == 2  # a POST stops at BATCH_CHUNKS chunks, slices too
    fwd.client.close()


@pytest.mark.parametrize(
    "field,value",
    [
        ("offsets_ns", (1.5, 2.0)),
        ("tokens", (1,)),
        ("first", -1),
        ("prev_ns", "x"),
        ("id", 3),
        ("t0_ns", 1.0),
    ],
)
def test_a_malformed_slice_is_refused(field: str, value: object) -> None:
    d = _slice(1, 2).to_json_dict()
    d[field] = value
    body = pickle.dumps((WIRE_VERSION, 3, "", 0, 0, [d], []), protocol=5)
    with pytest.raises(IngestError):
        decode_batch(body)


def test_the_recorder_writes_no_slice(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    rec = Recorder(path, header={"upstream": "u"}, flush_s=0.2)
    rec.start()
    r = RequestRecord(
        id="a",
        user="u",
        model="m",
        dialect="openai",
        path="/v1/x",
        stream=True,
        status=200,
        outcome="ok",
        t_start=time.time(),
        ttft_s=0.1,
        e2e_s=0.2,
        prompt_tokens=1,
        completion_tokens=2,
        token_source="usage",
        chunk_offsets_s=(0.1, 0.15),
        chunk_tokens=(1, 1),
    )
    rec.on_events([_slice(0, 3), r, _slice(1, 3)])
    status = rec.stop()
    assert status["requests"] == 1 and status["dropped"] == 0
    assert status["lines"] == 3  # header, the request, footer
    with RecordingReader(path) as reader:
        assert list(itertools.islice(reader, 10)) == [r]
