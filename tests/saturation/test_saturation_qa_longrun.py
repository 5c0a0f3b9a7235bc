"""QA: the saturation detectors of a proxy left running for a week stay bounded: their
signals keep a few windows of requests and samples, whatever the time run and however
many request ids (open ones whose records never come included) or outages they saw."""

from __future__ import annotations

from llmtop.config import Config
from llmtop.events import ActiveRequest, Event, RequestRecord
from llmtop.saturation.monitor import SaturationMonitor

T0 = 1_796_000_000.0
STEP_S = 30.0
DAY_STEPS = int(86_400 / STEP_S)


def record(rid: str, user: str, model: str, t_start: float, prompt_tokens: int
           ) -> RequestRecord:
    offs = tuple(0.2 + 0.02 * k for k in range(10))
    return RequestRecord(
        id=rid, user=user, model=model, dialect="openai", path="/v1/chat/completions",
        stream=True, status=200, outcome="ok", t_start=t_start, ttft_s=offs[0],
        e2e_s=offs[-1] + 0.001, prompt_tokens=prompt_tokens, completion_tokens=10,
        token_source="usage", chunk_offsets_s=offs, chunk_tokens=(1,) * 10,
        concurrency_at_start=4)


def _sizes(mon: SaturationMonitor) -> dict[str, int]:
    sig = mon.signals
    out = {name: len(v) for name, v in vars(sig).items()
           if isinstance(v, (list, dict, set)) or hasattr(v, "popleft")}
    out["states"] = len(mon.states)
    out["outages"] = len(mon.outages)
    return out


def test_a_week_of_requests_and_outages_keeps_the_detectors_bounded() -> None:
    active: dict[str, ActiveRequest] = {}
    down = [False]
    said: list[Event] = []
    mon = SaturationMonitor(Config(), said.append, active, lambda: down[0])
    at: dict[int, dict[str, int]] = {}
    for i in range(7 * DAY_STEPS):
        t = T0 + i * STEP_S
        ns = int(i * STEP_S * 1e9)
        down[0] = i % 240 < 4  # the upstream down for 2 minutes every 2 hours
        active.clear()
        for n in range(4):  # open now, gone by the next tick without a record
            rid = f"open-{i}-{n}"
            active[rid] = ActiveRequest(
                id=rid, user=f"u{i}", model=f"m{i % 50}", dialect="openai",
                path="/v1/chat/completions", stream=True, t_start=t - 1, t0_ns=ns - 10**9,
                first_token_ns=ns - 5 * 10**8, chunks=5, tokens=5, prompt_tokens=4_000)
        mon.on_events([record(f"r-{i}-{n}", f"u{i}-{n}", f"m{i % 50}", t - 1, 2_000 + n)
                       for n in range(6)])
        mon.tick(t, ns)
        if (i + 1) % DAY_STEPS == 0 and (i + 1) // DAY_STEPS in (1, 7):
            at[(i + 1) // DAY_STEPS] = _sizes(mon)
    day1, day7 = at[1], at[7]
    print("day 1:", day1)
    print("day 7:", day7)
    for name, n in day1.items():
        assert day7[name] <= 2 * n + 8, (name, n, day7[name])
    assert day7["_ttft_noted"] <= 2 * 4 + 1024 + 4
    assert any(e.code == "UPSTREAM_DOWN" for e in said if hasattr(e, "code"))
