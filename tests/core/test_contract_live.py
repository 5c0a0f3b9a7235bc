"""The admin API, the recording and the privacy rules as the outside contract
(interfaces.md) writes them, read from a real ``llmtop run --headless`` in front of
``llmtop sim`` — both subprocesses on real sockets — with the openai SDK and plain HTTP
as clients.

One session (a module fixture) sends the traffic the checks need — every dialect, a
streamed and a whole answer, an upstream error, a client that hangs up, identities from
each source of "the user" — and collects what the proxy said about it: the snapshot at
every window before and after, the request lists, ``/metrics``, a recording started
with ``--record`` and one started and stopped through the admin API.
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from hdrh.histogram import HdrHistogram
from interfaces_example import SNAPSHOT_EXAMPLE
from prometheus_client.parser import text_string_to_metric_families

SECRET = "sk-contract-5ecret-k3y"
PROMPT = "PROMPT-TEXT-ZEBRA-QUOKKA"
# the snapshot example of the page ("itl": {} and the like: the same keys as "ttft")
EXAMPLE: dict[str, Any] = copy.deepcopy(SNAPSHOT_EXAMPLE)
for _k in ("itl", "chunk_gap", "tpot", "e2e"):
    EXAMPLE["latency"][_k] = EXAMPLE["latency"]["ttft"]
LATENCIES = ("ttft", "itl", "chunk_gap", "tpot", "e2e")
WINDOWS = {None: 60, "10": 10, "60": 60, "300": 300, "all": None}

REQUEST_FIELDS = {
    "id": str, "user": str, "model": (str, type(None)), "dialect": str, "path": str,
    "stream": bool, "status": int, "outcome": str, "t_start": float,
    "ttft_s": (float, type(None)), "e2e_s": float, "prompt_tokens": (int, type(None)),
    "completion_tokens": (int, type(None)), "token_source": str, "chunk_offsets_s": list,
    "chunk_tokens": list, "concurrency_at_start": int, "error": (str, type(None)),
}
NUM = (int, float)
GPU_FIELDS = {"t": float, "index": int, "name": str, "mem_used_bytes": int,
              "mem_total_bytes": int, "util_gpu": (*NUM, type(None)),
              "mem_busy": (*NUM, type(None)), "dram_bw_util": (*NUM, type(None)),
              "power_w": (*NUM, type(None)), "simulated": bool}
ENGINE_FIELDS = {"t": float, "kind": str, "running": (*NUM, type(None)),
                 "waiting": (*NUM, type(None)), "kv_cache_usage": (*NUM, type(None)),
                 "raw": dict}
WARNING_FIELDS = {"t": float, "code": str, "severity": str, "message": str, "state": str}


def _env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("LLMTOP_")},
            "LLMTOP_SALT_FILE": os.environ["LLMTOP_SALT_FILE"], "PYTHONUNBUFFERED": "1"}


class _Proc:
    """``python -m llmtop ARGS``; the URLs of its "NAME listening on" lines."""

    def __init__(self, tmp: Path, name: str, *args: str, wait_for: tuple[str, ...]) -> None:
        self.out = tmp / f"{name}.out"
        with open(self.out, "wb") as fh:
            self.proc = subprocess.Popen([sys.executable, "-m", "llmtop", *args], stdout=fh,
                                         stderr=subprocess.STDOUT, env=_env())
        self.urls: dict[str, str] = {}
        deadline = time.monotonic() + 60
        while set(self.urls) < set(wait_for):
            for m in re.finditer(r"llmtop: (\w+) listening on (\S+)", self.out.read_text()):
                self.urls[m[1]] = m[2]
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"{name} did not start: {self.out.read_text()}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGINT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.headers["Content-Type"].startswith(
            "text/plain" if url.endswith("/metrics") else "application/json"), r.headers
        body = r.read()
    return body.decode() if url.endswith("/metrics") else json.loads(body)


def _post(url: str, body: Any, headers: dict[str, str] | None = None,
          timeout: float = 30) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _hang_up_mid_stream(proxy: str) -> None:
    """A client that reads the first bytes of a stream, then closes its connection."""
    host, port = proxy.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"model": "m", "stream": True, "max_tokens": 50,
                       "messages": [{"role": "user", "content": PROMPT}]}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nX-LLMTOP-User: hangs-up\r\n"
                  b"X-Sim-Fault: stall:3000@2\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while b"data:" not in got:
            got += s.recv(4096)


@dataclass
class Session:
    tmp: Path
    sim_url: str = ""
    proxy: str = ""
    admin: str = ""
    empty: dict[str | None, dict[str, Any]] = field(default_factory=dict)
    snaps: dict[str | None, dict[str, Any]] = field(default_factory=dict)
    active: list[dict[str, Any]] = field(default_factory=list)
    recent: list[dict[str, Any]] = field(default_factory=list)
    metrics: str = ""
    users: dict[str, str] = field(default_factory=dict)  # what was sent → request id
    recording: list[dict[str, Any]] = field(default_factory=list)
    admin_recording: list[dict[str, Any]] = field(default_factory=list)
    first_stop_answer: Any = None
    start_answer: Any = None
    stop_answer: Any = None
    rc: int | None = None
    summary: list[str] = field(default_factory=list)
    everything: str = ""  # every byte llmtop wrote or served, for the privacy checks
    completion: str = ""  # the text of one streamed answer


def _wait_for(what: str, check: Any, within_s: float = 60) -> Any:
    deadline = time.monotonic() + within_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


def _traffic(s: Session) -> int:
    """Every kind of request the checks need; how many were sent."""
    base = s.proxy + "/v1"
    sdk = openai.OpenAI(base_url=base, api_key=SECRET, max_retries=0)
    msgs: list[Any] = [{"role": "user", "content": PROMPT}]
    n = 0
    # the API key: a Bearer token (the SDK), then x-api-key with the same key
    stream = sdk.chat.completions.create(model="m", messages=msgs, max_tokens=8, stream=True,
                                         stream_options={"include_usage": True})
    s.completion = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    n += 1
    assert _post(s.proxy + "/v1/messages", {"model": "m", "max_tokens": 6, "messages": msgs},
                 {"x-api-key": SECRET, "anthropic-version": "2023-06-01"})[0] == 200
    n += 1
    # the configured header beats the body's user and the key; the body's user the key
    sdk.chat.completions.create(model="m", messages=msgs, max_tokens=5, user="body-user",
                                extra_headers={"X-LLMTOP-User": "header-user"})
    sdk.completions.create(model="m", prompt=PROMPT, max_tokens=5, user="body-user")
    n += 2
    # no name, no key: the client address (other dialects on the way)
    assert _post(s.proxy + "/api/chat", {"model": "m", "messages": msgs, "stream": False,
                                         "options": {"num_predict": 4}})[0] == 200
    assert _post(s.proxy + "/generate", {"inputs": PROMPT,
                                         "parameters": {"max_new_tokens": 4}})[0] == 200
    # SGLang's native /generate: an API the page does not list, so "other"
    assert _post(s.proxy + "/generate", {"text": PROMPT,
                                         "sampling_params": {"max_new_tokens": 4}})[0] == 200
    n += 3
    # other: a POST nobody's dialect knows (the sim answers 404; it is still recorded)
    _post(s.proxy + "/v1/not-a-generation-route", {"x": 1})
    n += 1
    # an upstream error
    status, _ = _post(base + "/chat/completions", {"model": "m", "messages": msgs},
                      {"X-Sim-Fault": "status:500", "X-LLMTOP-User": "errs"})
    assert status == 500
    n += 1
    # a client that hangs up mid-stream
    _hang_up_mid_stream(s.proxy)
    n += 1
    return n


@pytest.fixture(scope="module", params=[[], ["--workers", "2"]],
                ids=["1 process", "2 workers"])
def session(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """The contract holds the same for ``--workers 2`` (records shipped to a coordinator
    through their own codec) as for one process."""
    tmp = tmp_path_factory.mktemp("contract")
    s = Session(tmp)
    sim = _Proc(tmp, "sim", "sim", "--listen", "127.0.0.1:0", wait_for=("sim",))
    run: _Proc | None = None
    try:
        s.sim_url = sim.urls["sim"]
        run = _Proc(tmp, "run", "run", "--headless", "--upstream", s.sim_url, "--listen",
                    "127.0.0.1:0", "--admin", "127.0.0.1:0", "--record",
                    str(tmp / "rec.jsonl"), "--gpu-source", "sim", "--slo-ttft", "0.5",
                    *request.param, wait_for=("proxy", "admin"))
        s.proxy, s.admin = run.urls["proxy"], run.urls["admin"]
        snap = s.admin + "/llmtop/v1/snapshot"
        for w in WINDOWS:
            s.empty[w] = _get(snap + ("" if w is None else f"?window={w}"))
        # a stream held open (stalled after 2 chunks) while the active list is read
        held = threading.Thread(target=_post, args=(
            s.proxy + "/v1/chat/completions",
            {"model": "m", "stream": True, "max_tokens": 6,
             "messages": [{"role": "user", "content": PROMPT}]},
            {"X-Sim-Fault": "stall:4000@2", "X-LLMTOP-User": "held"}))
        held.start()
        s.active = _wait_for("an active streaming request", lambda: [
            r for r in _get(s.admin + "/llmtop/v1/requests?state=active")
            if r["user"] == "held" and r.get("ttft_s") is not None])
        n = _traffic(s) + 1
        held.join(60)
        _wait_for(f"{n} requests in the snapshot",
                  lambda: _get(snap + "?window=all")["system"]["requests"] >= n)
        # an engine reading and a GPU reading have come (both sampled every second or less)
        _wait_for("engine and GPU readings", lambda: (
            (d := _get(snap))["gpus"] and d["engine"].get("kind") == "sim"))
        for w in WINDOWS:
            s.snaps[w] = _get(snap + ("" if w is None else f"?window={w}"))
        s.recent = _get(s.admin + "/llmtop/v1/requests?state=recent")
        s.metrics = _get(s.admin + "/metrics")
        # the --record recording stopped through the admin API, and a second one started and
        # stopped there, with one request in it
        s.first_stop_answer = _post(s.admin + "/llmtop/v1/recording",
                                    {"path": str(tmp / "rec.jsonl"), "action": "stop"})
        second = tmp / "admin.jsonl.gz"
        s.start_answer = _post(s.admin + "/llmtop/v1/recording",
                               {"path": str(second), "action": "start"})
        _post(s.proxy + "/v1/chat/completions",
              {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]},
              {"X-LLMTOP-User": "in-the-second"})
        _wait_for("the second recording's request", lambda: any(
            r["user"] == "in-the-second"
            for r in _get(s.admin + "/llmtop/v1/requests?state=recent")))
        s.stop_answer = _post(s.admin + "/llmtop/v1/recording",
                              {"path": str(second), "action": "stop"})
        with gzip.open(second, "rt", encoding="utf-8") as fh:
            s.admin_recording = [json.loads(ln) for ln in fh]
        s.rc = run.stop(signal.SIGINT)
        s.summary = [ln for ln in run.out.read_text().splitlines()
                     if ln.startswith("llmtop: served")]
        text = (tmp / "rec.jsonl").read_text(encoding="utf-8")
        s.recording = [json.loads(ln) for ln in text.splitlines()]
        s.everything = "".join([text, json.dumps([s.snaps, s.recent, s.active]), s.metrics,
                                run.out.read_text()])
        yield s
    finally:
        if run is not None:
            run.stop(signal.SIGKILL)
        sim.stop(signal.SIGTERM)


# -- the snapshot ------------------------------------------------------------------------

def _shape_problems(example: Any, got: Any, where: str) -> list[str]:
    """Keys of ``example`` missing from ``got`` at the same nesting, and values whose
    type differs: an int of the example must be an int, a float a float (an int would
    do for JSON, not for a strictly typed reader), a string a string; ``null`` stands for
    a number or null."""
    out: list[str] = []
    if isinstance(example, dict):
        if not isinstance(got, dict):
            return [f"{where}: {type(got).__name__}, not an object"]
        for k, v in example.items():
            if k not in got:
                out.append(f"{where}.{k}: missing")
            else:
                out += _shape_problems(v, got[k], f"{where}.{k}")
    elif isinstance(example, list):
        if not isinstance(got, list):
            return [f"{where}: {type(got).__name__}, not a list"]
        for i, item in enumerate(got):
            out += _shape_problems(example[0], item, f"{where}[{i}]")
    elif isinstance(example, bool):
        if not isinstance(got, bool):
            out.append(f"{where}: {got!r} is not a bool")
    elif type(example) is int:
        if type(got) is not int:
            out.append(f"{where}: {got!r} is not an integer")
    elif isinstance(example, float):
        if type(got) is not float:
            out.append(f"{where}: {got!r} is not a float")
    elif isinstance(example, str):
        if not isinstance(got, str):
            out.append(f"{where}: {got!r} is not a string")
    elif example is None and got is not None and type(got) not in (int, float):
        out.append(f"{where}: {got!r} is neither a number nor null")
    return out


@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"window={w}")
@pytest.mark.parametrize("phase", ["empty", "after traffic"])
def test_snapshot_has_every_key_of_the_example_with_its_type(
        session: Session, window: str | None, phase: str) -> None:
    snap = (session.empty if phase == "empty" else session.snaps)[window]
    example = {**EXAMPLE, "window_s": WINDOWS[window]}
    if phase == "empty":  # the engine's kind: null until its first reading names it
        example["engine"] = {k: v for k, v in EXAMPLE["engine"].items() if k != "kind"}
        assert "kind" in snap["engine"] and isinstance(snap["engine"]["kind"], (str, type(None)))
    problems = _shape_problems(example, snap, "snapshot")
    assert not problems, "\n".join(problems)
    assert snap["version"] == 1
    assert abs(snap["time"] - time.time()) < 3600  # unix seconds
    # all: no window length (the page gives none; null, as where there is no data)
    assert snap["window_s"] == WINDOWS[window]
    assert set(snap["histograms"]) >= set(LATENCIES)
    if phase == "after traffic":
        assert snap["users"] and snap["gpus"] and snap["engine"]["kind"] == "sim"


def test_snapshot_is_null_where_there_is_no_data(session: Session) -> None:
    for window, snap in session.empty.items():
        for name in LATENCIES:
            lat = snap["latency"][name]
            assert lat["count"] == 0, (window, name, lat)
            assert [lat[q] for q in ("p50", "p90", "p95", "p99", "max")] == [None] * 5, (
                window, name, lat)
        assert snap["system"]["slo_attainment"] is None
        assert snap["capacity"]["max_concurrency_at_slo"] is None


def test_latencies_are_seconds_and_histograms_microseconds(session: Session) -> None:
    """The recording's TTFTs (seconds, the page's unit) bound the snapshot's TTFT
    quantiles; the histogram, decoded by the hdrhistogram package, holds the same
    requests in microseconds."""
    requests = [r for r in session.recording if r["type"] == "request"]
    # TTFT: of streamed answers; E2E: of requests that succeeded
    recorded = [r["ttft_s"] for r in requests if r["stream"] and r["ttft_s"] is not None]
    e2e = [r["e2e_s"] for r in requests if r["outcome"] == "ok"]
    snap = session.snaps["all"]
    for name, values in (("ttft", recorded), ("e2e", e2e)):
        lat = snap["latency"][name]
        assert lat["count"] == len(values), (name, lat, len(values))
        lo, hi = min(values), max(values)
        for q in ("p50", "p90", "p95", "p99", "max"):
            assert isinstance(lat[q], float)
            assert lo * 0.99 - 1e-6 <= lat[q] <= hi * 1.01 + 1e-6, (name, q, lat, lo, hi)
        h = HdrHistogram.decode(snap["histograms"][name])
        assert h.get_total_count() == lat["count"]
        assert h.get_max_value() == pytest.approx(lat["max"] * 1e6, rel=0.002, abs=1)
        assert h.get_value_at_percentile(50) == pytest.approx(lat["p50"] * 1e6, rel=0.002,
                                                              abs=1)


@pytest.mark.parametrize("name", LATENCIES)
def test_histograms_decode_and_merge_with_the_hdrhistogram_package(
        session: Session, name: str) -> None:
    """Any window's histogram decodes; two merge (``decode_and_add``) into one whose
    count is the sum — with one of a proxy that saw nothing as well."""
    merged = HdrHistogram(1, 3_600_000_000, 3)
    total = 0
    for snap in (*session.snaps.values(), session.empty["all"]):
        b64 = snap["histograms"][name]
        base64.b64decode(b64, validate=True)
        h = HdrHistogram.decode(b64)
        assert h.get_total_count() == snap["latency"][name]["count"]
        merged.decode_and_add(b64)
        total += h.get_total_count()
    assert merged.get_total_count() == total > 0


def test_users_in_the_snapshot_are_the_recordings(session: Session) -> None:
    users = {u["user"] for u in session.snaps["all"]["users"]}
    recorded = {r["user"] for r in session.recording if r["type"] == "request"}
    assert users == recorded


# -- /requests ------------------------------------------------------------------------------

def test_recent_requests_have_the_recordings_request_shape(session: Session) -> None:
    """Each recent request is the recording's line for it, field for field."""
    lines = {r["id"]: r for r in session.recording if r["type"] == "request"}
    assert len(session.recent) >= len(lines) - 1
    for rec in session.recent:
        if rec["id"] in lines:
            assert rec == lines[rec["id"]]
        else:  # only the one sent after the first recording was read
            assert rec["user"] == "in-the-second"
            assert set(rec) == set(next(iter(lines.values())))


def test_active_requests_have_the_fields_so_far(session: Session) -> None:
    (active,) = session.active
    final = next(r for r in session.recording if r["type"] == "request"
                 and r["user"] == "held")
    for k in ("type", "id", "user", "model", "dialect", "path", "stream", "t_start",
              "concurrency_at_start"):
        assert active[k] == final[k], k
    for k, types in REQUEST_FIELDS.items():
        if k in active and active[k] is not None:
            assert isinstance(active[k], types), (k, active[k])
    assert active["ttft_s"] == pytest.approx(final["ttft_s"], abs=1e-6)
    assert active["outcome"] is None and active["e2e_s"] is None


# -- /metrics -------------------------------------------------------------------------------

def test_metrics_parse_with_prometheus_client(session: Session) -> None:
    families = list(text_string_to_metric_families(session.metrics))
    kinds = {f.type for f in families}
    assert {"histogram", "counter", "gauge"} <= kinds, kinds
    assert all(f.samples for f in families if f.type == "histogram")


# -- POST /llmtop/v1/recording ----------------------------------------------------------------

def test_recording_started_and_stopped_through_the_admin_api(session: Session) -> None:
    assert session.first_stop_answer[0] == 200, session.first_stop_answer
    assert session.start_answer[0] == 200, session.start_answer
    assert session.stop_answer[0] == 200, session.stop_answer
    lines = session.admin_recording
    assert lines[0]["type"] == "header" and lines[-1]["type"] == "footer"
    requests = [r for r in lines if r["type"] == "request"]
    assert [r["user"] for r in requests] == ["in-the-second"]
    assert lines[-1]["requests"] == 1


# -- the recording --------------------------------------------------------------------------

def test_recording_header(session: Session) -> None:
    header = session.recording[0]
    assert header["type"] == "header"
    assert header["format"] == "llmtop-recording" and header["version"] == 1
    assert type(header["started_at"]) is float and abs(header["started_at"] - time.time()) < 3600
    assert header["upstream"] == session.sim_url
    assert isinstance(header["slo"], dict) and header["slo"]["ttft_s"] == 0.5
    assert isinstance(header["llmtop_version"], str) and header["llmtop_version"]
    assert sum(1 for r in session.recording if r["type"] == "header") == 1


def test_recording_request_fields_and_their_values(session: Session) -> None:
    requests = [r for r in session.recording if r["type"] == "request"]
    for r in requests:
        for k, types in REQUEST_FIELDS.items():
            assert k in r, (k, r)
            assert isinstance(r[k], types) and not (types is int and isinstance(r[k], bool)), (
                k, r[k])
        assert r["dialect"] in ("openai", "anthropic", "ollama", "tgi", "other"), r
        assert r["outcome"] in ("ok", "error", "cancelled", "timeout"), r
        assert r["token_source"] in ("usage", "chunks", "estimate"), r
        assert r["path"].startswith("/")
        assert len(r["chunk_offsets_s"]) == len(r["chunk_tokens"])
        assert all(type(x) is float and 0 <= x <= r["e2e_s"] + 1e-9
                   for x in r["chunk_offsets_s"]), r
        assert r["chunk_offsets_s"] == sorted(r["chunk_offsets_s"])
        assert all(type(x) is int and x >= 0 for x in r["chunk_tokens"]), r
        if r["ttft_s"] is not None and r["chunk_offsets_s"]:
            assert r["chunk_offsets_s"][0] == pytest.approx(r["ttft_s"])
        assert (r["error"] is None) == (r["outcome"] == "ok"), r
    by_user = {r["user"]: r for r in requests}
    assert by_user["errs"]["status"] == 500 and by_user["errs"]["outcome"] == "error"
    assert by_user["hangs-up"]["outcome"] == "cancelled"
    assert {r["dialect"] for r in requests} == {"openai", "anthropic", "ollama", "tgi",
                                                "other"}
    # TGI's /generate and SGLang's: tgi, and other (an API the page does not list)
    assert [r["dialect"] for r in requests if r["path"] == "/generate"] == ["tgi", "other"]
    assert {r["stream"] for r in requests} == {True, False}
    assert {r["outcome"] for r in requests} >= {"ok", "error", "cancelled"}


def test_recording_gpu_engine_footer_fields(session: Session) -> None:
    kinds = {r["type"] for r in session.recording}
    assert {"header", "request", "gpu", "engine", "footer"} <= kinds, kinds
    for r in session.recording:
        want = {"gpu": GPU_FIELDS, "engine": ENGINE_FIELDS, "warning": WARNING_FIELDS}.get(
            r["type"], {})
        for k, types in want.items():
            assert k in r and isinstance(r[k], types), (k, r)
        if r["type"] == "gpu":
            assert r["simulated"] is True
        if r["type"] == "engine":  # the raw scraped values: the sim's vLLM names
            assert r["raw"] and any(k.startswith("vllm:") for k in r["raw"]), r["raw"]
        if r["type"] == "warning":
            assert r["state"] in ("raised", "cleared")
            assert r["severity"] in ("info", "warning", "critical")
    footer = session.recording[-1]
    assert footer["type"] == "footer"
    # SIGINT: a graceful shutdown, exit 0, and a summary
    assert type(footer["ended_at"]) is float
    assert footer["requests"] == sum(1 for r in session.recording if r["type"] == "request")
    assert session.rc == 0
    assert len(session.summary) == 1 and re.match(r"llmtop: served [0-9]+ requests",
                                                  session.summary[0]), session.summary


def test_recording_lines_come_in_time_order(session: Session) -> None:
    """After the header, in time order: a reading or warning at its ``t``, a request when it
    ended. The writer holds lines to write them so (tests/recording/test_recording_order.py
    pins the hold exactly); live, a line that reaches it later than the hold — an engine
    scrape slower than 0.25 s, a worker's record the coordinator took late, either held up
    by a pause of the machine — is written when it comes, after a later line, and the
    footer counts it (``out_of_order``). So the file steps back exactly as often as the
    footer says. (A bound instead — at most one line back — failed on a CI machine that
    paused twice in one session; without the hold this session steps back 0-3 times with
    --workers 2, never in one process, and the footer says so.)"""
    times = []
    for r in session.recording[1:-1]:
        times.append(r["t_start"] + r["e2e_s"] if r["type"] == "request" else r["t"])
    assert len(times) > 10
    newest, back = times[0], []
    for t in times[1:]:
        if t < newest:
            back.append(round(newest - t, 6))
        newest = max(newest, t)
    footer = session.recording[-1]
    assert footer["out_of_order"] == len(back), f"lines earlier than one before them: {back}"


def test_a_cut_off_last_line_is_accepted(session: Session, tmp_path: Path) -> None:
    """The recording cut in the middle of a request line (a crash while writing): report
    and replay's reader take it, with every whole line before."""
    lines = (session.tmp / "rec.jsonl").read_bytes().splitlines(keepends=True)
    last_request = max(i for i, ln in enumerate(lines) if b'"type":"request"' in ln)
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(lines[:last_request]) + lines[last_request][:40])
    proc = subprocess.run([sys.executable, "-m", "llmtop", "report", str(cut), "--format",
                           "json", "-q"], capture_output=True, text=True, timeout=120,
                          env=_env())
    assert proc.returncode == 0, proc.stderr
    whole = sum(1 for ln in lines[:last_request] if b'"type":"request"' in ln)
    report = json.loads(proc.stdout)
    assert report["outcomes"]["requests"] == whole, proc.stdout[:2000]
    assert report["source"]["complete"] is False and report["source"]["truncated_lines"] == 1


# -- privacy and "the user" -----------------------------------------------------------------

def test_no_prompt_text_and_no_raw_key_anywhere(session: Session) -> None:
    """Neither the prompt, nor an answer's text, nor the API key, in the recording, the
    snapshot, the request lists, /metrics or the process's output."""
    assert PROMPT not in session.everything
    assert len(session.completion) > 20 and session.completion not in session.everything
    assert SECRET not in session.everything
    assert SECRET[3:] not in session.everything


def test_who_is_the_user(session: Session) -> None:
    """Header, then the body's ``user``, then the key (Bearer or x-api-key: the same key,
    the same pseudonym ``key:`` + hex), then the client address."""
    requests = [r for r in session.recording if r["type"] == "request"]
    by_path = {}
    for r in requests:
        by_path.setdefault(r["path"], []).append(r["user"])
    chat = by_path["/v1/chat/completions"]
    key_users = {u for u in chat if u.startswith("key:")}
    (pseudonym,) = key_users
    assert re.fullmatch(r"key:[0-9a-f]{8,}", pseudonym), pseudonym
    assert by_path["/v1/messages"] == [pseudonym]  # x-api-key
    assert "header-user" in chat and "body-user" not in chat
    assert by_path["/v1/completions"] == ["body-user"]
    assert by_path["/api/chat"] == ["127.0.0.1"]
    assert by_path["/generate"] == ["127.0.0.1", "127.0.0.1"]


def test_the_pseudonym_is_stable_across_a_restart(session: Session, tmp_path: Path) -> None:
    """A second proxy process with the same salt (the stored one) names the key alike."""
    pseudonym = next(r["user"] for r in session.recording
                     if r["type"] == "request" and r["user"].startswith("key:"))
    run = _Proc(tmp_path, "again", "run", "--headless", "--upstream", session.sim_url,
                "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--gpu-source", "none",
                wait_for=("proxy", "admin"))
    try:
        status, _ = _post(run.urls["proxy"] + "/v1/chat/completions",
                          {"model": "m", "max_tokens": 2,
                           "messages": [{"role": "user", "content": "hi"}]},
                          {"Authorization": f"Bearer {SECRET}"})
        assert status == 200
        users = _wait_for("the request listed", lambda: [
            r["user"] for r in _get(run.urls["admin"] + "/llmtop/v1/requests?state=recent")])
        assert users == [pseudonym]
        assert run.stop(signal.SIGTERM) == 0  # SIGTERM: graceful as SIGINT, with a summary
        assert "llmtop: served 1 request" in run.out.read_text()
    finally:
        run.stop()


def test_warnings_in_the_snapshot_and_the_recording(tmp_path: Path) -> None:
    """An upstream nobody answers: UPSTREAM_DOWN is raised at once — in the snapshot with
    the example's keys, in the recording as a ``warning`` line with the page's fields."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    rec = tmp_path / "down.jsonl"
    run = _Proc(tmp_path, "down", "run", "--headless", "--upstream", dead, "--listen",
                "127.0.0.1:0", "--admin", "127.0.0.1:0", "--gpu-source", "none",
                "--record", str(rec), wait_for=("proxy", "admin"))
    try:
        status, _ = _post(run.urls["proxy"] + "/v1/chat/completions",
                          {"model": "m", "messages": [{"role": "user", "content": PROMPT}]})
        assert status == 502
        snap = _wait_for("a warning", lambda: (
            d if (d := _get(run.urls["admin"] + "/llmtop/v1/snapshot"))["warnings"] else None))
        problems = _shape_problems({"warnings": EXAMPLE["warnings"]}, snap, "snapshot")
        assert not problems, "\n".join(problems)
        assert "UPSTREAM_DOWN" in {w["code"] for w in snap["warnings"]}
        assert all(w["severity"] in ("info", "warning", "critical") for w in snap["warnings"])
        assert run.stop() == 0
    finally:
        run.stop(signal.SIGKILL)
    lines = [json.loads(ln) for ln in rec.read_text().splitlines()]
    warnings = [ln for ln in lines if ln["type"] == "warning"]
    assert warnings and warnings[0]["code"] == "UPSTREAM_DOWN"
    for w in warnings:
        for k, types in WARNING_FIELDS.items():
            assert k in w and isinstance(w[k], types), (k, w)
        assert w["state"] in ("raised", "cleared")
        assert w["severity"] in ("info", "warning", "critical")
    assert lines[-1]["type"] == "footer"


def _fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_admin_api_is_not_on_the_proxy_address(session: Session, tmp_path: Path) -> None:
    """The proxy address forwards the admin paths to the upstream like any other: what
    answers there is the engine (the simulator's /metrics, in vLLM's names; its 404 for
    the snapshot), never llmtop's admin API."""
    assert b"vllm:" in _fetch(session.sim_url + "/metrics")[1]
    run = _Proc(tmp_path, "noadmin", "run", "--headless", "--upstream", session.sim_url,
                "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--gpu-source", "none",
                wait_for=("proxy", "admin"))
    try:
        proxy, admin = run.urls["proxy"], run.urls["admin"]
        own = {f.name for f in text_string_to_metric_families(
            _fetch(admin + "/metrics")[1].decode())}
        assert own
        status, body = _fetch(proxy + "/metrics")
        assert status == 200 and b"vllm:" in body
        assert not own & {f.name for f in text_string_to_metric_families(body.decode())}
        assert _fetch(admin + "/llmtop/v1/snapshot")[0] == 200
        status, body = _fetch(proxy + "/llmtop/v1/snapshot")
        assert status == 404 and b'"histograms"' not in body
        assert _fetch(proxy + "/llmtop/v1/requests?state=recent")[0] == 404
    finally:
        run.stop()
