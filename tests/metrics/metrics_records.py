"""Helpers for the metrics tests: synthetic request records, open streams and a settable
clock."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

from llmtop.events import ActiveRequest, Outcome, RequestRecord

T0 = 1_796_000_000.0
_ids = itertools.count()


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


def record(
    *,
    user: str = "alice",
    model: str | None = "m",
    ttft: float | None = 0.2,
    gaps: Sequence[float] = (0.02,) * 9,
    tokens: Sequence[int] | None = None,
    outcome: Outcome = "ok",
    completion_tokens: int | None = None,
    prompt_tokens: int | None = 10,
    concurrency: int = 1,
    e2e_extra: float = 0.001,
    rid: str | None = None,
    t_start: float = T0,
) -> RequestRecord:
    """A streamed request: first chunk at ``ttft``, then one chunk after each gap."""
    offs: list[float] = []
    if ttft is not None:
        offs.append(ttft)
        for g in gaps:
            offs.append(offs[-1] + g)
    toks = tuple(tokens) if tokens is not None else (1,) * len(offs)
    e2e = (offs[-1] if offs else 0.05) + e2e_extra
    return RequestRecord(
        id=rid or f"req-{next(_ids)}",
        user=user,
        model=model,
        dialect="openai",
        path="/v1/chat/completions",
        stream=True,
        status=200 if outcome == "ok" else 500,
        outcome=outcome,
        t_start=t_start,
        ttft_s=ttft,
        e2e_s=e2e,
        prompt_tokens=prompt_tokens,
        completion_tokens=sum(toks) if completion_tokens is None else completion_tokens,
        token_source="usage",
        chunk_offsets_s=tuple(offs),
        chunk_tokens=toks,
        concurrency_at_start=concurrency,
    )


def open_stream(reg: dict[str, ActiveRequest], rid: str, user: str, t: float, *,
                model: str | None = "m") -> ActiveRequest:
    """A streamed request ``rid`` opened at ``t`` (unix s) whose first token has come,
    registered in ``reg`` as the proxy's live registry holds it."""
    now = time.perf_counter_ns()
    a = ActiveRequest(rid, user, model, "openai", "/v1/chat/completions", True, t, now,
                      first_token_ns=now)
    reg[rid] = a
    return a
