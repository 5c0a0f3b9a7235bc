"""The workers' ingest wire format: a record survives worker → coordinator exactly (every
field, floats bit for bit), a backlog goes in several POSTs, a coordinator that is down
costs nothing, and anything that is not a payload of this llmtop version gets 400 (403
without the token) with nothing published — never a traceback, never code run."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pickle
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from llmtop import workers
from llmtop.bus import EventBus
from llmtop.events import ActiveRequest, Event, RequestRecord, WarningEvent
from llmtop.proxy.dialects.registry import make_parser
from llmtop.workers import EventForwarder, FleetActive, IngestClient, ingest_route, next_due
from llmtop.workers_wire import (
    ACTIVE_FIELDS,
    INGEST_PATH,
    RECORD_FIELDS,
    RECORD_ROW,
    TOKEN_HEADER,
    WIRE_VERSION,
    IngestError,
    decode_batch,
    encode_batch,
)

TOKEN = "s3cret-token"


def record(i: int, *, n: int = 5) -> RequestRecord:
    return RequestRecord(
        id=f"w1-{i:06d}", user=f"u-{i % 3}", model=None if i % 2 else "llama-3",
        dialect="anthropic" if i % 2 else "openai", path=f"/v{i}/messages", stream=bool(i % 2),
        status=200 + i, outcome="error" if i % 2 else "ok", t_start=1.7e9 + i / 7,
        ttft_s=None if i % 2 else 0.1 + 0.2, e2e_s=1e-300 + i, prompt_tokens=None if i % 2 else i,
        completion_tokens=n * 2 + i, token_source="usage" if i % 2 else "estimate",
        chunk_offsets_s=tuple(0.1 + k / 3 + i / 1e6 for k in range(n)),
        chunk_tokens=(1 + i % 2,) * n,
        concurrency_at_start=i + 1, error="upstream said no" if i % 2 else None,
        upstream_id=None if i % 2 else f"chatcmpl-{i}",
    )


def active(i: int) -> ActiveRequest:
    return ActiveRequest(
        id=f"w1-a{i}", user="u-x", model=None if i % 2 else "m", dialect="tgi", path="/generate",
        stream=True, t_start=1.7e9 + 1 / 3, t0_ns=123456789 + i, concurrency_at_start=i,
        first_token_ns=None if i % 2 else 123999999, last_chunk_ns=124000000 + i,
        chunks=i, tokens=2 * i, status=None if i % 2 else 200 + i,
        prompt_tokens=None if i % 2 else 40 + i, upstream_id=None if i % 2 else f"req-{i}",
    )


def test_every_field_survives_the_round_trip_exactly() -> None:
    recs = [record(0), record(1), record(2, n=0)]
    # every field of RequestRecord is shipped, and each one differs between the two records
    assert tuple(f.name for f in dataclasses.fields(RequestRecord)) == RECORD_FIELDS
    for f in RECORD_FIELDS:
        assert getattr(recs[0], f) != getattr(recs[1], f), f
    warn = WarningEvent(t=1.7e9, code="QUEUEING", severity="warning", message="m",
                        state="raised")
    events: list[Event] = [recs[0], warn, recs[1], recs[2]]
    opened = [active(0), active(1)]
    batch = decode_batch(encode_batch(3, 7, events, opened, sender="w3", seq=11))
    assert (batch.worker, batch.dropped, batch.sender, batch.seq) == (3, 7, "w3", 11)
    assert batch.events == events  # in order, equal field by field
    assert all(type(a) is type(b) for a, b in zip(batch.events, events, strict=True))
    for got, sent in zip(batch.events[::2], recs[:2], strict=True):
        assert isinstance(got, RequestRecord)
        assert got.chunk_offsets_s == sent.chunk_offsets_s
        assert type(got.chunk_offsets_s) is tuple and type(got.chunk_tokens) is tuple
        assert [x.hex() for x in got.chunk_offsets_s] == [x.hex() for x in sent.chunk_offsets_s]
    assert batch.active == opened
    # every field travels but the stream's parser; the status, prompt size and engine's id
    # too (known in one, not yet in the other)
    wire = tuple(f.name for f in dataclasses.fields(ActiveRequest) if f.name != "usage")
    assert wire == ACTIVE_FIELDS
    assert [(a.status, a.prompt_tokens, a.upstream_id) for a in batch.active] == [
        (200, 40, "req-0"), (None, None, None)]



def test_an_open_request_ships_what_its_stream_has_said_when_the_post_goes() -> None:
    """The prompt's size is read from the request's stream parser when a POST is encoded
    (the relay copies nothing as it parses); the parser stays in the worker. Before, no
    open request carried it: the coordinator's rows said null mid-stream."""
    parser = make_parser("anthropic", True, "text/event-stream")
    a = dataclasses.replace(active(1), status=200, usage=parser)
    before = decode_batch(encode_batch(0, 0, [], [a])).active[0]
    assert (before.status, before.prompt_tokens, before.upstream_id, before.usage) == (
        200, None, None, None)
    parser.feed(b'event: message_start\ndata: {"type": "message_start", "message": '
                b'{"id": "msg_01", "model": "claude", "usage": {"input_tokens": 37}}}\n\n')
    after = decode_batch(encode_batch(0, 0, [], [a])).active[0]
    assert (after.prompt_tokens, after.upstream_id, after.usage) == (37, "msg_01", None)
    assert after.to_json_dict(a.t0_ns) == a.to_json_dict(a.t0_ns)  # the same row there
    assert a.to_json_dict(a.t0_ns)["prompt_tokens"] == 37
    assert a.to_json_dict(a.t0_ns)["upstream_id"] == "msg_01"

def _pickled(obj: object) -> bytes:
    return pickle.dumps(obj, protocol=5)


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /nonexistent-llmtop-pwned",))


def _payload(items: list[object], rows: list[object], *, worker: object = 0) -> bytes:
    return _pickled((WIRE_VERSION, worker, "sender", 1, 0, items, rows))


def _bad_row(field: str, value: object) -> bytes:
    row = list(RECORD_ROW(record(0)))
    row[RECORD_FIELDS.index(field)] = value
    return _payload([RECORD_ROW(record(1)), tuple(row)], [])


BAD_PAYLOADS = {
    "empty": b"",
    "garbage": b"\x80\x05not a pickle at all",
    "truncated": encode_batch(0, 0, [record(0)], [])[:-9],
    "old json format": json.dumps({"worker": 0, "events": [record(0).to_json_dict()],
                                   "active": []}).encode(),
    "other version": _pickled(("llmtop-ingest/1", 0, "sender", 1, 0, [], [])),
    "short payload": _pickled((WIRE_VERSION, 0, 0, [], [])),
    "a global": _payload([_Boom()], []),
    "a class": _payload([record(0)], []),
    "short row": _payload([RECORD_ROW(record(0))[:-1]], []),
    "string e2e": _bad_row("e2e_s", "1.0"),
    "unknown outcome": _bad_row("outcome", "meh"),
    "unknown dialect": _bad_row("dialect", "klingon"),
    "string offset": _bad_row("chunk_offsets_s", (0.1, "0.2")),
    "list offsets": _bad_row("chunk_offsets_s", [0.1, 0.2]),
    "float token count": _bad_row("chunk_tokens", (1, 1.5)),
    "bad open request": _payload([], [("id-only",)]),
    "bad event dict": _payload([{"type": "warning"}], []),
    "worker not int": _payload([], [], worker="0"),
    "seq not int": _pickled((WIRE_VERSION, 0, "sender", "1", 0, [], [])),
}


@pytest.mark.parametrize("name", sorted(BAD_PAYLOADS))
def test_decode_refuses_what_a_worker_does_not_send(name: str) -> None:
    with pytest.raises(IngestError):
        decode_batch(BAD_PAYLOADS[name])
    assert not Path("/nonexistent-llmtop-pwned").exists()


class Coordinator:
    def __init__(self, url: str, bus: EventBus, fleet: FleetActive) -> None:
        self.url, self.bus, self.fleet = url, bus, fleet
        self.got: list[Event] = []
        bus.subscribe(self.got.extend)


@pytest.fixture
async def coordinator() -> AsyncIterator[Coordinator]:
    bus, fleet = EventBus(), FleetActive()
    app = web.Application()
    app.add_routes([ingest_route(bus, fleet, TOKEN)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    c = Coordinator(f"http://127.0.0.1:{port}{INGEST_PATH}", bus, fleet)
    try:
        yield c
    finally:
        await runner.cleanup()


async def test_bad_payloads_get_400_and_publish_nothing(coordinator: Coordinator) -> None:
    async with aiohttp.ClientSession() as s:
        for name, body in BAD_PAYLOADS.items():
            async with s.post(coordinator.url, data=body, headers={TOKEN_HEADER: TOKEN}) as r:
                assert r.status == 400, name
                assert "bad ingest payload" in (await r.json())["error"], name
        good = encode_batch(0, 0, [record(0)], [])
        async with s.post(coordinator.url, data=good, headers={TOKEN_HEADER: "wrong"}) as r:
            assert r.status == 403
        async with s.post(coordinator.url, data=good) as r:
            assert r.status == 403
    coordinator.bus.drain()
    assert coordinator.got == []  # "string e2e" carried a good record too: not published
    assert len(coordinator.fleet) == 0


async def test_forwarder_ships_records_and_open_requests_exactly(
        coordinator: Coordinator) -> None:
    bus = EventBus()
    opened = {a.id: a for a in (active(0), active(1), active(2))}
    fwd = EventForwarder(coordinator.url, TOKEN, 4, opened, interval_s=0.02)
    bus.subscribe(fwd.on_events)
    sent = [record(i, n=i % 40) for i in range(300)]
    for r in sent:
        bus.publish(r)
    task = asyncio.create_task(fwd.run(bus))
    for _ in range(200):
        await asyncio.sleep(0.02)
        coordinator.bus.drain()
        if len(coordinator.got) == len(sent) and fwd.fleet_in_flight:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    coordinator.bus.drain()
    assert coordinator.got == sent
    assert sorted(coordinator.fleet) == sorted(opened)
    assert [coordinator.fleet[k] for k in opened] == list(opened.values())
    assert fwd.fleet_in_flight == 3
    assert fwd.buffer == [] and fwd.dropped == 0


def test_posts_keep_their_cadence_however_slow_the_answers() -> None:
    """A record waits in a worker at most one interval: the next POST is due an interval
    after the last one was due, not after its answer came (a coordinator answering in
    0.2 s made the period 0.7 s, and a record could reach the coordinator's recorder after
    its hold). Past due, it goes at once and the cadence starts again from then."""
    assert next_due(10.0, 0.5, now=10.2) == 10.5  # the answer took 0.2 s: still 10.5
    assert next_due(10.0, 0.5, now=10.7) == 10.7  # took longer than an interval: now
    assert next_due(10.7, 0.5, now=10.7) == 11.2  # and from there on, no catching up
    assert next_due(10.0, 0.5, now=13.0) == 13.0  # a long stall: one POST, not six


async def test_a_backlog_goes_in_several_posts(coordinator: Coordinator,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "BATCH_EVENTS", 7)
    monkeypatch.setattr(workers, "BATCH_CHUNKS", 20)
    fwd = EventForwarder(coordinator.url, TOKEN, 0, {})
    sent = [record(i, n=6) for i in range(30)]
    fwd.on_events(sent)
    first = fwd.take()
    assert len(first) == 4  # 4 records reach 24 chunks ≥ 20
    fwd.buffer[:0] = first
    posts = 0
    while True:
        before = len(fwd.buffer)
        assert await fwd.post()
        posts += 1
        assert before - len(fwd.buffer) <= 4
        if not fwd.buffer:
            break
    fwd.client.close()
    coordinator.bus.drain()
    assert coordinator.got == sent
    assert posts == 8


def _has_pending(fwd: EventForwarder) -> bool:
    return fwd.pending is not None


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{INGEST_PATH}"


async def test_coordinator_down_keeps_the_post_and_bounds_the_rest(
        coordinator: Coordinator) -> None:
    fwd = EventForwarder(_closed_port_url(), TOKEN, 0, {}, max_buffer=10)
    fwd.on_events([record(i) for i in range(8)])
    assert not await fwd.post()
    assert fwd.pending is not None and fwd.buffer == []
    body = fwd.pending[1]
    fwd.on_events([record(i) for i in range(8, 22)])  # 4 over the bound: dropped
    assert fwd.dropped == 4 and len(fwd.buffer) == 10
    assert not await fwd.post()
    assert fwd.pending[1] is body  # sent again as it was: not encoded again
    fwd.client = IngestClient(coordinator.url, TOKEN)  # it is back
    assert await fwd.post()
    assert fwd.buffer and await fwd.post()
    assert not _has_pending(fwd)
    fwd.client.close()
    coordinator.bus.drain()
    got = [e for e in coordinator.got if not isinstance(e, WarningEvent)]
    assert got == [record(i) for i in range(18)]
    (lost,) = [e for e in coordinator.got if isinstance(e, WarningEvent)]  # the 4 dropped
    assert lost.code == "EVENTS_LOST" and lost.message.startswith("4 events")


async def test_a_post_sent_again_is_taken_once(coordinator: Coordinator) -> None:
    fwd = EventForwarder(coordinator.url, TOKEN, 2, {"a": active(0)})
    fwd.on_events([record(0), record(1)])
    _, body = fwd.next_post()
    for _ in range(2):  # e.g. the reply to the first was lost
        assert await fwd.client.post(body) == (200, b'{"in_flight": 1}')
    fwd.on_events([record(2)])
    fwd.pending = None
    assert await fwd.post()
    fwd.client.close()
    coordinator.bus.drain()
    assert coordinator.got == [record(0), record(1), record(2)]
    # another worker process numbers its POSTs from 1 as well: not taken for a repeat
    other = EventForwarder(coordinator.url, TOKEN, 3, {})
    other.on_events([record(3)])
    assert await other.post()
    other.client.close()
    coordinator.bus.drain()
    assert coordinator.got[-1] == record(3)


async def test_refused_payload_is_counted_not_retried(coordinator: Coordinator) -> None:
    fwd = EventForwarder(coordinator.url, "not-the-token", 0, {})
    fwd.on_events([record(0), record(1)])
    assert not await fwd.post()
    fwd.client.close()
    assert fwd.buffer == [] and fwd.pending is None and fwd.dropped == 2


async def test_client_reads_replies_and_reconnects_after_close(
        coordinator: Coordinator) -> None:
    client = IngestClient(coordinator.url, TOKEN)
    good = encode_batch(0, 0, [record(0)], [], sender="x", seq=1)
    assert (await client.post(good))[0] == 200
    status, reply = await client.post(b"junk")  # same connection, 400 with a JSON body
    assert status == 400 and b"bad ingest payload" in reply
    client.close()
    assert (await client.post(encode_batch(0, 0, [], [], sender="x", seq=2)))[0] == 200
    client.close()
    with pytest.raises(ValueError):
        IngestClient("https://127.0.0.1:1/x", TOKEN)


def test_fleet_active_is_the_union_of_the_workers_open_requests() -> None:
    fleet = FleetActive()
    a = [dataclasses.replace(active(i), id=f"w0-{i}") for i in range(3)]
    b = [dataclasses.replace(active(i), id=f"w1-{i}") for i in range(2)]
    fleet.update(0, a)
    fleet.update(1, b)
    assert len(fleet) == 5 and sorted(fleet) == sorted(x.id for x in a + b)
    assert list(fleet.values()) == [fleet[k] for k in fleet] == a + b
    assert dict(fleet.items()) == {x.id: x for x in a + b}
    assert b[1] in fleet.values() and "w1-1" in fleet and "nope" not in fleet
    fleet.update(0, a[:1])  # worker 0's next report replaces its set
    assert list(fleet.values()) == a[:1] + b
    fleet.drop(1)
    assert list(fleet.values()) == a[:1] and len(fleet) == 1
    with pytest.raises(KeyError):
        fleet["w1-0"]
