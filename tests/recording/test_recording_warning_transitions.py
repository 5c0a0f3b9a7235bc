"""QA round 8: a raised warning is published again every few seconds with its new figures
(for the live view), and the recording wrote each of those as another ``raised`` line — 9
"raised" SLO_TTFT lines with no "cleared" between, so a tool pairing raise and clear lines
counted 9 episodes. The recorder now writes only the transitions; the live bus, the
report and replay are unchanged."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any

from llmtop.bus import EventBus
from llmtop.cli import main
from llmtop.config import load_config
from llmtop.events import ActiveRequest, Event, RequestRecord, WarningEvent
from llmtop.metrics.aggregator import Aggregator
from llmtop.recording.replay import ReplayEngine
from llmtop.recording.report.analyse import analyse
from llmtop.recording.writer import Recorder, RecordingController
from llmtop.saturation import SaturationMonitor


def _record(i: int, t_start: float, ttft: float) -> RequestRecord:
    offs = tuple(ttft + 0.02 * k for k in range(10))
    return RequestRecord(
        id=f"r{i}", user="u", model="m", dialect="openai", path="/v1/chat/completions",
        stream=True, status=200, outcome="ok", t_start=t_start, ttft_s=ttft,
        e2e_s=offs[-1], prompt_tokens=50, completion_tokens=len(offs), token_source="usage",
        chunk_offsets_s=offs, chunk_tokens=(1,) * len(offs), concurrency_at_start=1)


class Session:
    """A real SaturationMonitor and a real recorder on one bus, on a virtual clock that
    starts now (a recording's events come after its header's start)."""

    def __init__(self, path: Path) -> None:
        self.bus = EventBus()
        self.seen: list[Event] = []
        self.active: dict[str, ActiveRequest] = {}
        self.mon = SaturationMonitor(load_config(None, env={}), self.bus.publish, self.active)
        self.live = Aggregator(load_config(None, env={}))
        self.bus.subscribe(self.mon.on_events)
        self.bus.subscribe(self.live.on_events)
        self.bus.subscribe(self.seen.extend)
        self.rec = RecordingController(self.bus, header={"upstream": "http://e:8000"},
                                       flush_s=0.05)
        self.rec.start(str(path))
        self.now = time.time() + 1.0
        self.n = 0

    def second(self, *, waiting: int, ttft: float) -> None:
        self.active.clear()
        for i in range(waiting):
            t0 = self.now - 1.5
            self.active[f"w{i}"] = ActiveRequest(
                id=f"w{i}", user="u", model="m", dialect="openai", path="/", stream=True,
                t_start=t0, t0_ns=int(t0 * 1e9))
        for k in range(3 if waiting else 5):
            self.n += 1
            self.bus.publish(_record(self.n, self.now - 1.0 + 0.1 * k, ttft))
        self.bus.drain()
        self.now += 1.0
        self.mon.tick(self.now, int(self.now * 1e9))
        self.bus.drain()


def _lines(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_the_recording_keeps_transitions_not_figure_refreshes(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl.gz"
    s = Session(path)
    for _ in range(30):
        s.second(waiting=0, ttft=0.1)
    for waiting in (3, 12):  # saturated, then worse: the figures change while raised
        for _ in range(30):
            s.second(waiting=waiting, ttft=1.2)
    for _ in range(120):  # calm again: every warning clears
        s.second(waiting=0, ttft=0.1)
    s.rec.stop()

    published = [e for e in s.seen if isinstance(e, WarningEvent)]
    raises = [e.code for e in published if e.state == "raised"]
    clears = [e.code for e in published if e.state == "cleared"]
    # the live bus: QUEUEING re-published with new figures while raised, once cleared
    assert raises.count("QUEUEING") > 1 and clears.count("QUEUEING") == 1, raises
    assert not s.live.warnings  # live view: all cleared

    written = [d for d in _lines(path) if d["type"] == "warning"]
    by_code: dict[str, list[str]] = {}
    for d in written:
        by_code.setdefault(d["code"], []).append(d["state"])
    assert set(by_code) == {e.code for e in published}
    for code, states in by_code.items():  # raised, cleared, raised, cleared, …
        assert states == ["raised", "cleared"] * (len(states) // 2), (code, states)
    # what was written is the first raise of each episode, with its time and message
    first = next(e for e in published if e.code == "QUEUEING" and e.state == "raised")
    q = next(d for d in written if d["code"] == "QUEUEING")
    assert (q["t"], q["message"]) == (first.t, first.message)

    # the report pairs them into one episode each, every one cleared
    episodes = analyse(path)["warnings"]
    assert sorted(ep["code"] for ep in episodes) == sorted(
        c for c, states in by_code.items() for _ in range(len(states) // 2))
    assert all(ep["cleared_at"] is not None for ep in episodes), episodes
    out = tmp_path / "r.txt"
    assert main(["report", str(path), "-o", str(out)]) == 0
    assert "QUEUEING" in out.read_text("utf-8")

    # replay shows the warning while it was raised, and nothing once it cleared
    eng = ReplayEngine(path)
    eng.advance_to(q["t"] + 1.0)
    assert "QUEUEING" in {w["code"] for w in eng.snapshot(60)["warnings"]}
    eng.run_to_end()
    assert eng.snapshot(60)["warnings"] == []
    eng.close()


def test_a_warning_raised_before_the_recording_started_is_written_once(
        tmp_path: Path) -> None:
    """Recording started while a warning was raised: its next re-publication is this
    recording's raise; later ones are not written, its clear is."""
    path = tmp_path / "late.jsonl"
    rec = Recorder(path, header={}, flush_s=0.05)
    rec.start()
    t = time.time() + 1.0
    evs = [WarningEvent(t + i, "SLO_TTFT", "warning", f"met by {90 - i}%", "raised")
           for i in range(5)]
    evs.append(WarningEvent(t + 6, "SLO_TTFT", "info", "cleared: met by 86%", "cleared"))
    evs.append(WarningEvent(t + 9, "SLO_TTFT", "warning", "met by 80%", "raised"))
    rec.on_events(evs)
    rec.stop()
    lines = [json.loads(x) for x in path.read_text("utf-8").splitlines()]
    got = [(d["t"] - t, d["state"], d["message"]) for d in lines if d["type"] == "warning"]
    assert got == [(0.0, "raised", "met by 90%"), (6.0, "cleared", "cleared: met by 86%"),
                   (9.0, "raised", "met by 80%")]
    assert lines[-1]["type"] == "footer" and lines[-1]["lines"] == len(lines)


def test_a_severity_change_while_raised_is_written_and_reported(tmp_path: Path) -> None:
    """KV_CACHE warning → critical → warning while raised: each change is a line (the
    recording used to keep only the first severity), the report's episode says the worst
    severity and when it was reached, and the clear still ends one episode."""
    path = tmp_path / "esc.jsonl"
    rec = Recorder(path, header={}, flush_s=0.05)
    rec.start()
    t = time.time() + 1.0
    evs = [WarningEvent(t, "KV_CACHE", "warning", "KV cache 91%", "raised"),
           WarningEvent(t + 1, "KV_CACHE", "warning", "KV cache 93%", "raised"),
           WarningEvent(t + 2, "KV_CACHE", "critical", "KV cache 99%", "raised"),
           WarningEvent(t + 3, "KV_CACHE", "critical", "KV cache 99.5%", "raised"),
           WarningEvent(t + 4, "KV_CACHE", "warning", "KV cache 92%", "raised"),
           WarningEvent(t + 8, "KV_CACHE", "info", "cleared", "cleared")]
    rec.on_events(evs)
    rec.stop()
    lines = [json.loads(x) for x in path.read_text("utf-8").splitlines()]
    got = [(d["t"] - t, d["state"], d["severity"]) for d in lines if d["type"] == "warning"]
    assert got == [(0.0, "raised", "warning"), (2.0, "raised", "critical"),
                   (4.0, "raised", "warning"), (8.0, "cleared", "info")]

    episodes = analyse(path)["warnings"]
    assert len(episodes) == 1
    ep = episodes[0]
    assert (ep["severity"], ep["message"]) == ("critical", "KV cache 99%")
    assert ep["raised_at"] == t and ep["escalated_at"] == t + 2
    assert ep["duration_s"] == 8.0
    out = tmp_path / "r.txt"
    assert main(["report", str(path), "-o", str(out)]) == 0
    text = out.read_text("utf-8")
    assert "KV_CACHE (critical from +" in text, text
