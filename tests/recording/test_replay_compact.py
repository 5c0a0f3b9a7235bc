"""The replay's read-ahead holds request records packed (llmtop.packed): the
engine must deliver exactly the records — same order, same values, same element types — and
rebuild exactly the same in-flight picture as it did holding the records themselves, and the
packed form must really be small (bytes a chunk, measured on the objects held)."""

from __future__ import annotations

import itertools
import json
import random
import sys
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rec_helpers import request, soon

import llmtop.recording.replay as replay
from llmtop.events import Event, RequestRecord
from llmtop.packed import PACK_MIN_CHUNKS, HeldRecord, pack
from llmtop.recording.replay import ReplayEngine


def _line(d: dict[str, Any]) -> str:
    return json.dumps(d, separators=(",", ":"))


def _write(path: Path, t0: float, lines: list[tuple[float, dict[str, Any]]]) -> None:
    """A recording of raw lines (so a test can write values no recorder writes), in the
    order given by their times (requests at their end)."""
    head = {"type": "header", "format": "llmtop-recording", "version": 1, "started_at": t0,
            "upstream": "http://127.0.0.1:9/v1", "slo": {"ttft_s": 0.5, "itl_p95_s": 0.05}}
    body = [d for _, d in sorted(lines, key=lambda p: p[0])]
    path.write_text("\n".join(_line(d) for d in [head, *body]) + "\n")


def _req(i: int, t_start: float, n: int, *, gap: float = 0.01, tokens: Any = None,
         ttft: float = 0.05) -> tuple[float, dict[str, Any]]:
    offs = [round(ttft + k * gap, 6) for k in range(n)]
    toks = [1] * n if tokens is None else list(tokens)
    e2e = (offs[-1] + 0.001) if offs else ttft
    d = {"type": "request", "id": f"r{i}", "user": f"u{i % 3}", "model": "m", "dialect": "openai",
         "path": "/v1/chat/completions", "stream": True, "status": 200, "outcome": "ok",
         "t_start": t_start, "ttft_s": ttft if offs else None, "e2e_s": e2e,
         "prompt_tokens": 10, "completion_tokens": min(sum(toks), 1 << 40) if toks else None,
         "token_source": "usage", "chunk_offsets_s": offs, "chunk_tokens": toks,
         "concurrency_at_start": 1 + i % 5, "error": None}
    return t_start + e2e, d


def _mixed_recording(path: Path) -> None:
    """Records of every shape the packing distinguishes, ending out of their start order
    (long answers started early end late), plus readings between them."""
    rnd = random.Random(5)
    t0 = soon()
    lines: list[tuple[float, dict[str, Any]]] = []
    shapes: list[tuple[int, Any]] = [
        (0, None), (1, None), (PACK_MIN_CHUNKS // 2 - 1, None), (PACK_MIN_CHUNKS // 2, None),
        (PACK_MIN_CHUNKS, None), (300, None),
        (300, [1 + k % 3 for k in range(300)]),  # narrow counts ('B')
        (40, [300 + k for k in range(40)]),  # 'H'
        (40, [70_000] * 40),  # 'I'
        (40, [1 << 40] * 40),  # 'q': the largest count a reader accepts
        (40, [0, 1] * 20),  # zero-token chunks
        (40, [1] * 20),  # fewer counts than chunks
        (20, [2] * 30),  # more counts than chunks
        (40, []),  # chunks without counts
        # (JSON true among the counts is a bad line since 87f11ee: no longer a shape here)
    ]
    for i in range(60):
        n, toks = shapes[i % len(shapes)]
        gap = 0.5 if i % 7 == 0 else 0.01 + rnd.random() * 0.02  # every 7th lasts minutes
        lines.append(_req(i, t0 + i * 0.3 + rnd.random() * 0.1, n, gap=gap, tokens=toks))
    for s in range(0, 200, 2):
        t = t0 + s
        lines.append((t, {"type": "engine", "t": t, "kind": "sim", "running": 1.0,
                          "waiting": 0.0, "kv_cache_usage": 0.5, "raw": {}}))
    _write(path, t0, lines)


Played = tuple[list[list[Event]], list[list[tuple[Any, ...]]], dict[str, Any]]


def _play(path: Path, *, lookahead_s: float, max_buffered: int) -> Played:
    """Every batch the engine delivered, the in-flight rows after every tick, the final
    snapshot."""
    eng = ReplayEngine(path, tick_s=0.25, lookahead_s=lookahead_s, max_buffered=max_buffered)
    batches: list[list[Event]] = []
    states: list[list[tuple[Any, ...]]] = []
    on_events = eng.aggregator.on_events

    def spy(events: list[Event]) -> None:
        batches.append(list(events))
        on_events(events)

    eng.aggregator.on_events = spy  # type: ignore[method-assign]

    def on_tick(now: float) -> None:
        states.append([(a.id, a.chunks, a.tokens, a.first_token_ns, a.last_chunk_ns)
                       for a in eng.active.values()])

    eng.run_to_end(on_tick)
    snap = eng.snapshot(None)
    eng.close()
    return batches, states, snap


def _shape(e: Event) -> Any:
    """An event with the types of its chunk values (a bool read back as an int differs)."""
    if isinstance(e, RequestRecord):
        return (e, tuple(map(type, e.chunk_offsets_s)), tuple(map(type, e.chunk_tokens)))
    return e


@pytest.mark.parametrize(("lookahead_s", "max_buffered"), [(600.0, 200_000), (2.0, 200_000),
                                                           (600.0, 7), (0.5, 3)])
def test_packed_read_ahead_delivers_exactly_what_the_records_did(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lookahead_s: float,
        max_buffered: int) -> None:
    path = tmp_path / "mixed.jsonl"
    _mixed_recording(path)
    # the engine holding the records themselves, as it did before packing
    monkeypatch.setattr(replay, "pack", lambda rec: rec)
    old = _play(path, lookahead_s=lookahead_s, max_buffered=max_buffered)
    monkeypatch.undo()
    held: list[RequestRecord | HeldRecord] = []

    def counted(rec: RequestRecord) -> RequestRecord | HeldRecord:
        held.append(pack(rec))
        return held[-1]

    monkeypatch.setattr(replay, "pack", counted)
    new = _play(path, lookahead_s=lookahead_s, max_buffered=max_buffered)
    packed = [h for h in held if isinstance(h, HeldRecord)]
    assert len(held) == 60 and 30 < len(packed) < 60  # both forms went through
    assert {type(h.tokens).__name__ for h in packed} == {"int", "bytes"}
    assert {h.code for h in packed if isinstance(h.tokens, bytes)} == {"B", "H", "I", "Q"}
    old_batches, old_states, old_snap = old
    new_batches, new_states, new_snap = new
    assert [[_shape(e) for e in b] for b in new_batches] == \
        [[_shape(e) for e in b] for b in old_batches]
    delivered = [e for b in new_batches for e in b if isinstance(e, RequestRecord)]
    assert len(delivered) == 60
    ends = [r.t_start + r.e2e_s for r in delivered]
    starts = [r.t_start for r in delivered]
    assert ends == sorted(ends) and starts != sorted(starts)  # out of start order
    assert new_states == old_states
    assert max(len(s) for s in new_states) >= 3  # in-flight rows were really compared
    assert json.dumps(new_snap, sort_keys=True, default=str) == \
        json.dumps(old_snap, sort_keys=True, default=str)


def test_the_engine_holds_the_read_ahead_packed(tmp_path: Path) -> None:
    """A whole file within the read-ahead: every long record is held packed, in under 9
    bytes a chunk all told (as tuples its chunk lists alone take over 30)."""
    t0 = soon()
    lines = [_req(i, t0 + i * 0.1, 2000, gap=0.02,
                  tokens=None if i % 2 else [1 + k % 2 for k in range(2000)])
             for i in range(20)]
    path = tmp_path / "long.jsonl"
    _write(path, t0, lines)
    eng = ReplayEngine(path)
    eng.advance_to(eng.begin + 0.01)
    assert eng.exhausted and eng.events_delivered == 0  # all of it read ahead, none ended
    held = {id(item): item for _, _, _, item in eng._heap}.values()
    assert len(held) == 20 and all(isinstance(h, HeldRecord) for h in held)
    chunks = 20 * 2000
    packed = sum(sys.getsizeof(h) + sys.getsizeof(h.bare) + sys.getsizeof(h.offsets)
                 + (sys.getsizeof(h.tokens) if isinstance(h.tokens, bytes) else 0)
                 for h in held if isinstance(h, HeldRecord))
    assert packed / chunks < 9
    unpacked = [h.unpack() for h in held if isinstance(h, HeldRecord)]
    as_tuples = sum(sys.getsizeof(r.chunk_offsets_s) + sum(map(sys.getsizeof, r.chunk_offsets_s))
                    + sys.getsizeof(r.chunk_tokens) for r in unpacked)
    assert as_tuples / chunks > 30
    eng.run_to_end()
    assert eng.aggregator.snapshot(None)["system"]["requests"] == 20
    eng.close()


def test_pack_unpack_round_trip_and_what_is_left_as_is() -> None:
    t0 = soon()
    small = request(1, t0, n_chunks=PACK_MIN_CHUNKS // 2 - 1)
    assert pack(small) is small
    for toks, code, size in (((1,) * 50, None, 0), ((3,) * 50, "B", 1), ((0, 300) * 25, "H", 2),
                             ((70_000,) * 50, "I", 4), ((1 << 40,) * 50, "Q", 8),
                             ((), None, 0), ((1,) * 20, None, 0), ((2,) * 70, "B", 1)):
        rec = replace(request(2, t0, n_chunks=50), chunk_tokens=toks)
        held = pack(rec)
        assert isinstance(held, HeldRecord)
        assert held.bare.chunk_offsets_s == () and held.bare.chunk_tokens == ()
        if code is None:
            assert held.tokens == len(toks)
        else:
            assert isinstance(held.tokens, bytes) and held.code == code
        back = held.unpack()
        assert back == rec and tuple(map(type, back.chunk_tokens)) == tuple(
            map(type, rec.chunk_tokens))
        assert tuple(map(type, back.chunk_offsets_s)) == (float,) * 50
        assert held.nbytes() == 8 * 50 + size * len(toks)
        assert list(held.offsets_view()) == list(rec.chunk_offsets_s)
        cum = held.cum_tokens()
        assert (cum is None) == (code is None)
        if cum is not None:
            assert list(cum) == list(itertools.accumulate(toks))
    with_bool = replace(request(3, t0, n_chunks=50), chunk_tokens=(True,) + (1,) * 49)
    assert pack(with_bool) is with_bool


def test_the_engine_allocates_a_fraction_for_its_read_ahead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the engine holds once it has read a file of long answers ahead (Python's own
    allocation count, tracemalloc): packed, under 40% of holding the records themselves."""
    t0 = soon()
    path = tmp_path / "long.jsonl"
    _write(path, t0, [_req(i, t0 + i * 0.1, 2000, gap=0.02) for i in range(20)])

    def held_bytes() -> int:
        tracemalloc.start()
        try:
            eng = ReplayEngine(path)
            eng.advance_to(eng.begin + 0.01)
            assert eng.exhausted and eng.events_delivered == 0
            held = tracemalloc.get_traced_memory()[0]
            eng.close()
            return held
        finally:
            tracemalloc.stop()

    packed = held_bytes()
    monkeypatch.setattr(replay, "pack", lambda rec: rec)
    plain = held_bytes()
    assert plain > 20 * 2000 * 30  # the records themselves: over 30 bytes a chunk
    assert packed < 0.4 * plain
