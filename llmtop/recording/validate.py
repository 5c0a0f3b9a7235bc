"""What a recording's lines may hold: one check for every reader (report, replay, export).

A line is *invalid* when it parses as JSON but its values cannot be what the recorder
wrote: a wrong type (``"ttft_s": "fast"``, ``"user": 12345``), a number that is not finite
(``NaN``/``Infinity``: the writer writes ``null`` for those), a value that cannot be
negative and is, a duration longer than :data:`MAX_DURATION_S`, a GPU or engine figure
outside the range a reading of it can lie in (``power_w: 1e308``), or a required field
missing. The decoders here raise :class:`InvalidLine` (its message names the field); the
reader skips and counts such a line as a bad line, as it does a line that is not JSON.

Times are checked against the recording's span by the reader itself
(:class:`llmtop.recording.reader.RecordingReader`, using :data:`MAX_GAP_S`).

Fields a version-1 writer always writes but that a line can do without (a request's model,
chunk offsets, token counts, ...) take their defaults when missing; the decoders report that
so the reader can count such lines (``defaulted_lines``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

import orjson

from llmtop.config import MAX_DURATION_S as CONFIG_MAX_S
from llmtop.events import OUTCOMES, EngineReading, GpuReading, RequestRecord, WarningEvent

MAX_DURATION_S: Final = 7 * 86400.0
"""Longest a request's E2E, TTFT or a chunk offset may be (one week)."""
MAX_GAP_S: Final = 86400.0
"""How far an event's time may lie before the recording's start, or past every event read
so far without the next event confirming the jump (one day)."""
MAX_TIME_S: Final = 1e10
"""Largest magnitude of a time (unix seconds: about the year 2286). Past ~1e16 a float no
longer holds half-seconds, and a replay stepping its clock by a tick stood still (QA: a
header's ``started_at`` of 1e300 hung ``llmtop report``)."""
MAX_SLO_S: Final = CONFIG_MAX_S
"""Longest time objective (``ttft_s``, ``e2e_s``, …) a header's ``slo`` can hold: what
the proxy's configuration allows (a day)."""
MAX_COUNT: Final = 1 << 40
"""Largest token count, concurrency or byte count taken as real (2^40)."""
MAX_BYTES: Final = 1 << 60
_BIG: Final = 1 << 62

_NUM: Final = frozenset((int, float))
_OPT_NUM: Final = frozenset((int, float, type(None)))
_STATES: Final = ("raised", "cleared")


class InvalidLine(ValueError):
    """A recording line with a value no recorder writes; the message says which."""


def number(v: Any, name: str, *, lo: float | None = None, hi: float | None = None) -> float:
    """``v`` as a finite number (an int or float, never a bool) within ``[lo, hi]``."""
    t = type(v)
    if t is int:
        if not -_BIG < v < _BIG:
            raise InvalidLine(f"{name} is an integer out of range")
    elif t is not float:
        raise InvalidLine(f"{name} is {_what(v)}, not a number")
    elif not math.isfinite(v):
        raise InvalidLine(f"{name} is {v}, not a finite number")
    if lo is not None and v < lo:
        raise InvalidLine(f"{name} is {v:g}, below {lo:g}")
    if hi is not None and v > hi:
        raise InvalidLine(f"{name} is {v:g}, above {hi:g}")
    return v  # type: ignore[no-any-return]


def _opt_number(v: Any, name: str, *, lo: float | None = None,
                hi: float | None = None) -> float | None:
    return None if v is None else number(v, name, lo=lo, hi=hi)


def _integer(v: Any, name: str, *, lo: int = 0, hi: int = MAX_COUNT) -> int:
    if type(v) is not int:
        raise InvalidLine(f"{name} is {_what(v)}, not an integer")
    if not lo <= v <= hi:
        raise InvalidLine(f"{name} is {v}, outside [{lo}, {hi}]")
    return v


def count(v: Any, name: str) -> int:
    """``v`` as a count: an integer (never a bool) in ``[0, MAX_COUNT]``."""
    return _integer(v, name)


def _opt_integer(v: Any, name: str) -> int | None:
    return None if v is None else _integer(v, name)


def _string(v: Any, name: str) -> str:
    if type(v) is not str:
        raise InvalidLine(f"{name} is {_what(v)}, not a string")
    return v


def _opt_string(v: Any, name: str) -> str | None:
    return None if v is None else _string(v, name)


def _what(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f"a string ({v[:20]!r})"
    return f"a {type(v).__name__}" if isinstance(v, list | dict) else repr(v)[:20]


def _numbers(raw: Any, name: str, hi: float) -> tuple[float, ...]:
    """A list of finite numbers in ``[0, hi]`` as a tuple of floats."""
    if type(raw) is not list:
        if raw is None:
            return ()
        raise InvalidLine(f"{name} is {_what(raw)}, not a list")
    if not raw:
        return ()
    try:
        # sum() refuses strings, nulls and lists, and is NaN or inf when one value is
        total = sum(raw)
        if not math.isfinite(total):
            raise InvalidLine(f"{name} holds a value that is not finite")
        if min(raw) < 0 or max(raw) > hi:
            raise InvalidLine(f"{name} holds a value outside [0, {hi:g}]")
        return tuple(map(float, raw))
    except (TypeError, OverflowError):
        raise InvalidLine(f"{name} holds something that is not a number") from None


def _counts(raw: Any, name: str) -> tuple[int, ...]:
    """A list of integers in ``[0, MAX_COUNT]`` as a tuple."""
    if type(raw) is not list:
        if raw is None:
            return ()
        raise InvalidLine(f"{name} is {_what(raw)}, not a list")
    if not raw:
        return ()
    try:
        total = sum(raw)  # an int only when every value is an int (or a bool)
    except TypeError:
        total = None
    if type(total) is not int:
        raise InvalidLine(f"{name} holds something that is not an integer")
    if min(raw) < 0 or max(raw) > MAX_COUNT:
        raise InvalidLine(f"{name} holds a value outside [0, {MAX_COUNT}]")
    # JSON's true/false sum as 1/0: orjson writes them as words and ints (all in range now)
    # as digits, in one pass in C (a 16k-chunk list in 45 us; a type check of each took 300)
    if b"e" in orjson.dumps(raw):
        raise InvalidLine(f"{name} holds something that is not an integer")
    return tuple(raw)


# -- requests ---------------------------------------------------------------------------------

REQUEST_REQUIRED: Final = ("id", "user", "t_start", "e2e_s", "outcome")
"""A request line without one of these is invalid: nothing sensible stands in for them."""
REQUEST_DEFAULTED: Final = frozenset(
    ("model", "dialect", "path", "stream", "status", "ttft_s", "prompt_tokens",
     "completion_tokens", "token_source", "chunk_offsets_s", "chunk_tokens",
     "concurrency_at_start", "error"))
"""Fields a version-1 writer always writes, read with a default when a line lacks them."""


_REAL: Final = (int, float)
_OUTCOME_SET: Final = frozenset(OUTCOMES)


def request_from(d: dict[str, Any]) -> tuple[RequestRecord, bool]:
    """A ``request`` line → ``(record, defaulted)``; ``defaulted`` when a field was missing
    and took its default. :class:`InvalidLine` when a value cannot be right."""
    # the fast path (the reader's hot loop): a complete line of the usual types, checked in
    # one expression; anything else takes the slow path, which says what is wrong
    g: Callable[[str], Any] = d.get
    t0, e2e, ttft, offs, toks = (g("t_start"), g("e2e_s"), g("ttft_s"), g("chunk_offsets_s"),
                                 g("chunk_tokens"))
    conc, pt, ct, model, err, status = (g("concurrency_at_start"), g("prompt_tokens"),
                                        g("completion_tokens"), g("model"), g("error"),
                                        g("status"))
    uid = g("upstream_id")  # (newer: a line without it reads None, not defaulted)
    if (
        type(t0) in _REAL and t0 - t0 == 0 and -MAX_TIME_S <= t0 <= MAX_TIME_S
        and type(e2e) in _REAL and 0 <= e2e <= MAX_DURATION_S
        and (ttft is None or (type(ttft) in _REAL and 0 <= ttft <= MAX_DURATION_S))
        and type(offs) is list and type(toks) is list
        and type(g("id")) is str and type(g("user")) is str
        and type(g("dialect")) is str and type(g("path")) is str
        and type(g("token_source")) is str and type(g("stream")) is bool
        and type(g("outcome")) is str and g("outcome") in _OUTCOME_SET
        and type(status) is int and 0 <= status <= 999
        and type(conc) is int and 0 <= conc <= MAX_COUNT
        and (pt is None or (type(pt) is int and 0 <= pt <= MAX_COUNT))
        and (ct is None or (type(ct) is int and 0 <= ct <= MAX_COUNT))
        and (model is None or type(model) is str)
        and (err is None or type(err) is str)
        and (uid is None or type(uid) is str)
    ):
        times = _numbers(offs, "chunk_offsets_s", MAX_DURATION_S)
        _in_order(ttft, e2e, times)
        return RequestRecord(
            d["id"], d["user"], model, d["dialect"], d["path"], d["stream"], status,
            d["outcome"], t0, ttft, e2e, pt, ct, d["token_source"], times,
            _counts(toks, "chunk_tokens"), conc, err, uid,
        ), False
    for k in REQUEST_REQUIRED:
        if k not in d:
            raise InvalidLine(f"no {k} field")
    defaulted = not d.keys() >= REQUEST_DEFAULTED
    g = d.get
    e2e = number(d["e2e_s"], "e2e_s", lo=0.0, hi=MAX_DURATION_S)
    outcome = d["outcome"]
    if outcome not in OUTCOMES:
        raise InvalidLine(f"outcome is {_what(outcome)}, not one of {', '.join(OUTCOMES)}")
    stream = g("stream", False)
    if type(stream) is not bool:
        raise InvalidLine(f"stream is {_what(stream)}, not true/false")
    conc = g("concurrency_at_start")
    rec = RequestRecord(
        id=_string(d["id"], "id"),
        user=_string(d["user"], "user"),
        model=_opt_string(g("model"), "model"),
        dialect=_string(g("dialect", "other"), "dialect"),  # type: ignore[arg-type]
        path=_string(g("path", ""), "path"),
        stream=stream,
        status=_integer(g("status", 0), "status", hi=999),
        outcome=outcome,
        t_start=number(d["t_start"], "t_start", lo=-MAX_TIME_S, hi=MAX_TIME_S),
        ttft_s=_opt_number(g("ttft_s"), "ttft_s", lo=0.0, hi=MAX_DURATION_S),
        e2e_s=e2e,
        prompt_tokens=_opt_integer(g("prompt_tokens"), "prompt_tokens"),
        completion_tokens=_opt_integer(g("completion_tokens"), "completion_tokens"),
        token_source=_string(g("token_source", "estimate"), "token_source"),  # type: ignore[arg-type]
        chunk_offsets_s=_numbers(g("chunk_offsets_s"), "chunk_offsets_s", MAX_DURATION_S),
        chunk_tokens=_counts(g("chunk_tokens"), "chunk_tokens"),
        concurrency_at_start=0 if conc is None else _integer(conc, "concurrency_at_start"),
        error=_opt_string(g("error"), "error"),
        upstream_id=_opt_string(g("upstream_id"), "upstream_id"),
    )
    _in_order(rec.ttft_s, rec.e2e_s, rec.chunk_offsets_s)
    return rec, defaulted


def _in_order(ttft: float | None, e2e: float, times: tuple[float, ...]) -> None:
    """:class:`InvalidLine` when a request's times contradict each other: its first token
    after its end, chunks out of time order, or one after its end. Read as written, such a
    line put a 5 s TTFT among the slowest of a request that took 318 ms, and an offset of
    30 s in a 0.2 s request a 29.6 s ITL (no writer of ours makes one: a damaged line)."""
    if ttft is not None and ttft > e2e:
        raise InvalidLine(f"ttft_s ({ttft:g} s) is after the request's end (e2e_s {e2e:g} s)")
    if times:
        if times[-1] > e2e:
            raise InvalidLine(f"chunk_offsets_s holds a time ({max(times):g} s) after the "
                              f"request's end (e2e_s {e2e:g} s)")
        if sorted(times) != list(times):  # (timsort on sorted input: one pass, in C)
            raise InvalidLine("chunk_offsets_s is not in time order")


# -- readings and warnings --------------------------------------------------------------------

MAX_PERCENT: Final = 1000.0
"""Largest share (%) a GPU reading's busy times and bandwidth are taken at: 100 is all of
the time or of the peak; up to ten times that is kept as written (a sampler's rounding, a
GPM counter's quirk), past it the value is damage."""
MAX_POWER_W: Final = 1e6
"""Largest GPU power draw or limit taken as real (a megawatt)."""
MAX_CLOCK_MHZ: Final = 1e6
"""Largest GPU clock taken as real (a terahertz)."""
MAX_TEMPERATURE_C: Final = 1000.0
MAX_BYTES_S: Final = 1e15
"""Largest PCIe rate taken as real (a petabyte a second)."""
MAX_FRACTION: Final = 100.0
"""Largest KV-cache usage taken as real: a 0–1 fraction, up to 100 kept (a gauge that is a
percentage would read so); past it the value is damage."""
_GPU_FLOATS: Final[dict[str, tuple[float, float]]] = {
    "util_gpu": (0.0, MAX_PERCENT), "mem_busy": (0.0, MAX_PERCENT),
    "dram_bw_util": (0.0, MAX_PERCENT), "sm_activity": (0.0, MAX_PERCENT),
    "power_w": (0.0, MAX_POWER_W), "power_limit_w": (0.0, MAX_POWER_W),
    "sm_clock_mhz": (0.0, MAX_CLOCK_MHZ), "mem_clock_mhz": (0.0, MAX_CLOCK_MHZ),
    "temperature_c": (-273.15, MAX_TEMPERATURE_C),
    "pcie_rx_bytes_s": (0.0, MAX_BYTES_S), "pcie_tx_bytes_s": (0.0, MAX_BYTES_S),
}
"""Each optional GPU figure and the range a reading of it can lie in (QA: a value of 1e308
was read as it was, and ``llmtop report`` printed its 309 digits). Outside it the line is
damage: skipped and counted as a bad line, its field and value told, as a line with a
negative duration is."""


def gpu_from(d: dict[str, Any]) -> GpuReading:
    """A ``gpu`` line → :class:`GpuReading` (unknown fields ignored, newer ones optional)."""
    for k in ("t", "index", "name", "mem_used_bytes", "mem_total_bytes"):
        if k not in d:
            raise InvalidLine(f"no {k} field")
    g = d.get
    simulated = g("simulated", False)
    if type(simulated) is not bool:
        raise InvalidLine(f"simulated is {_what(simulated)}, not true/false")
    floats = {k: _opt_number(g(k), k, lo=lo, hi=hi) for k, (lo, hi) in _GPU_FLOATS.items()}
    mem = {k: _opt_number(g(k), k, lo=0.0, hi=MAX_BYTES)
           for k in ("mem_used_bytes", "mem_total_bytes")}
    return GpuReading(
        t=number(d["t"], "t", lo=-MAX_TIME_S, hi=MAX_TIME_S),
        index=_integer(d["index"], "index", hi=1 << 16),
        name=_string(d["name"], "name"),
        mem_used_bytes=mem["mem_used_bytes"],  # type: ignore[arg-type]
        mem_total_bytes=mem["mem_total_bytes"],  # type: ignore[arg-type]
        simulated=simulated, **floats,
    )


def _bucket(pair: Any) -> tuple[float, float]:
    if type(pair) is not list or len(pair) != 2:
        raise InvalidLine("ttft_buckets holds something that is not an [le, count] pair")
    le, c = pair
    # JSON has no infinity: the +Inf bound is written as null or as Prometheus spells it
    bound = math.inf if le is None or le == "+Inf" else number(
        le, "ttft_buckets bound", lo=0.0, hi=MAX_DURATION_S)
    return float(bound), float(number(c, "ttft_buckets count", lo=0.0, hi=MAX_COUNT))


def engine_from(d: dict[str, Any]) -> EngineReading:
    """An ``engine`` line → :class:`EngineReading`."""
    for k in ("t", "kind"):
        if k not in d:
            raise InvalidLine(f"no {k} field")
    g = d.get
    buckets = g("ttft_buckets") or []
    if type(buckets) is not list:
        raise InvalidLine(f"ttft_buckets is {_what(buckets)}, not a list")
    raw = g("raw") or {}
    if type(raw) is not dict:
        raise InvalidLine(f"raw is {_what(raw)}, not an object")
    vals = raw.values()
    if not set(map(type, vals)) <= _OPT_NUM:
        raise InvalidLine("raw holds a value that is not a number")
    if any(type(v) is int and not -_BIG < v < _BIG for v in vals):
        # (past a float: OverflowError below; past int64: Parquet's float64 column refuses it)
        raise InvalidLine("raw holds an integer out of range")
    if not math.isfinite(sum(v for v in vals if v is not None)):
        raise InvalidLine("raw holds a value that is not finite")
    return EngineReading(
        t=number(d["t"], "t", lo=-MAX_TIME_S, hi=MAX_TIME_S), kind=_string(d["kind"], "kind"),
        # (bounded as a GPU's figures are: 1e308 running printed 309 digits in a report)
        running=_opt_number(g("running"), "running", lo=0.0, hi=MAX_COUNT),
        waiting=_opt_number(g("waiting"), "waiting", lo=0.0, hi=MAX_COUNT),
        kv_cache_usage=_opt_number(g("kv_cache_usage"), "kv_cache_usage", lo=0.0,
                                   hi=MAX_FRACTION),
        preemptions=_opt_number(g("preemptions"), "preemptions", lo=0.0, hi=MAX_COUNT),
        ttft_buckets=tuple(_bucket(p) for p in buckets),
        raw=dict(raw),
    )


def warning_from(d: dict[str, Any]) -> WarningEvent:
    """A ``warning`` line → :class:`WarningEvent`."""
    for k in ("t", "code"):
        if k not in d:
            raise InvalidLine(f"no {k} field")
    g = d.get
    state = g("state", "raised")
    if state not in _STATES:
        raise InvalidLine(f"state is {_what(state)}, not raised or cleared")
    t = number(d["t"], "t", lo=-MAX_TIME_S, hi=MAX_TIME_S)
    since = _opt_number(g("since"), "since", lo=-MAX_TIME_S, hi=MAX_TIME_S)
    return WarningEvent(
        t=t, code=_string(d["code"], "code"),
        severity=_string(g("severity", "warning"), "severity"),  # type: ignore[arg-type]
        message=_string(g("message", ""), "message"), state=state,
        # (a carried warning's first raise; it can read a few ms after the part's start,
        # the line's ``t``, when it was published late: kept, the report takes the earlier)
        since=since if state == "raised" else None,
    )


def clean_slo(slo: Any) -> tuple[dict[str, Any], list[str]]:
    """A header's ``slo`` object without values that cannot be objectives (non-numbers,
    non-finite, ≤ 0, a target outside (0, 1], a time over :data:`MAX_SLO_S`); returns it
    and what was dropped, each a phrase that says why (``slo ttft_s (nan) is not an
    objective``)."""
    if not isinstance(slo, dict):
        return {}, ([] if slo is None else [f"slo is {_what(slo)}, not an object"])
    out: dict[str, Any] = {}
    dropped: list[str] = []
    for k, v in slo.items():
        ok = (type(v) in _NUM and (-_BIG < v < _BIG if type(v) is int else math.isfinite(v))
              and v > 0
              and (k != "target" or v <= 1))
        if ok and k.endswith("_s") and v > MAX_SLO_S:
            # (QA: a ttft_s of 1e308 printed "TTFT ≤ 1000000000000000010979…" — 309 digits —
            # twice in a report; no proxy runs with one: its config refuses over a day)
            dropped.append(f"slo {k} ({v:g} s) is more than a day, not an objective")
        elif v is None or ok:
            out[k] = v
        else:
            dropped.append(f"slo {k} ({_what(v)}) is not an objective")
    return out, dropped
