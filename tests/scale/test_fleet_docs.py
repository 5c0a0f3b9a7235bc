"""The fleet docs against a real proxy: every metric the Grafana dashboard, the PromQL examples
and the alerting rules in docs/fleet.md name is one ``GET /metrics`` really exports.

A proxy runs in front of the simulator; clients (the openai SDK) send traffic as two named
users, one request the simulator fails, and — after the simulator is gone — one that finds
the upstream down, so error series and a ``warning_active`` sample exist. The exposition is
parsed with prometheus_client's own parser; metric names are pulled out of each PromQL
expression by a small tokenizer (tested here too, including that it reports a made-up
name as missing).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from llmtop.config import load_config
from llmtop.server import LlmtopServer
from llmtop.sim.server import running_sim

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "examples" / "grafana" / "llmtop.json"
PROMETHEUS_YML = ROOT / "examples" / "prometheus" / "prometheus.yml"
FLEET_MD = ROOT / "docs" / "fleet.md"
TOKEN = "fleet-test-token"
DOWN = 'llmtop_warning_active{code="UPSTREAM_DOWN"} 1.0'

# -- a small PromQL tokenizer ----------------------------------------------------------------

KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "atan2", "inf", "nan", "sum", "avg", "min", "max", "count", "stddev",
    "stdvar", "topk", "bottomk", "quantile", "count_values", "group",
})
"""Words that are never metric names (aggregators may be written without parentheses
after a ``by (...)`` clause, so they are listed even though calls are skipped)."""
TARGET_LABELS = frozenset({"instance", "job", "replica", "model_pool", "__name__"})
"""Labels Prometheus (or examples/prometheus/prometheus.yml) adds at scrape time."""

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{([^{}]*)\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_GRAFANA_VARS = re.compile(r"\$\{[^}]*\}|\$\w+")
_TOKENS = re.compile(r"\d[\w.]*|[A-Za-z_:][\w:]*")
_LABEL_IN_MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")


def metric_names(expr: str) -> set[str]:
    """Metric names referenced in a PromQL expression (Grafana variables allowed)."""
    s = _GRAFANA_VARS.sub(" ", _RANGES.sub(" ", _STRINGS.sub('""', expr)))
    s = _GROUPING.sub(" ", _MATCHERS.sub(" ", s))
    names = set()
    for m in _TOKENS.finditer(s):
        word = m.group()
        if word[0].isdigit() or word.lower() in KEYWORDS:
            continue
        if s[m.end():].lstrip().startswith("("):  # a function call
            continue
        names.add(word)
    return names


def label_names(expr: str) -> set[str]:
    """Label names used in matchers and in by/without/on/ignoring/group_* clauses."""
    s = _GRAFANA_VARS.sub(" ", _RANGES.sub(" ", expr))
    out = set()
    for body in _MATCHERS.findall(_STRINGS.sub('""', s)):
        out |= set(_LABEL_IN_MATCHER.findall(body))
    for _, body in _GROUPING.findall(s):
        out |= {w.strip() for w in body.split(",") if w.strip()}
    return out


# -- what a proxy exports --------------------------------------------------------------------


class Exposition:
    """Names a scrape exposes: declared (a ``# TYPE`` line) and with at least one sample,
    plus the labels seen on each name's samples."""

    def __init__(self) -> None:
        self.declared: set[str] = set()
        self.sampled: set[str] = set()
        self.labels: dict[str, set[str]] = {}

    def add(self, text: str) -> None:
        for fam in text_string_to_metric_families(text):
            if fam.type == "counter":
                names = [fam.name + "_total"]
            elif fam.type == "histogram":
                names = [fam.name + s for s in ("_bucket", "_sum", "_count")]
            else:
                names = [fam.name]
            self.declared.update(names)
            for smp in fam.samples:
                if smp.name in names:
                    self.sampled.add(smp.name)
                    self.labels.setdefault(smp.name, set()).update(smp.labels)

    def missing(self, expr: str) -> set[str]:
        """Metric names in ``expr`` that no scrape declared."""
        return metric_names(expr) - self.declared

    def unknown_labels(self, expr: str) -> set[str]:
        """Labels in ``expr`` that none of its metrics carry (and Prometheus does not add)."""
        known = set(TARGET_LABELS)
        for name in metric_names(expr):
            known |= self.labels.get(name, set())
        return label_names(expr) - known


# -- where the expressions are ---------------------------------------------------------------


def load_dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def dashboard_panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])  # collapsed rows keep their panels inside


def dashboard_exprs(dash: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard_panels(dash) if p["type"] != "row"
            for t in p["targets"]]


def fenced_blocks(markdown: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", markdown, flags=re.M | re.S)


def doc_exprs() -> list[tuple[str, str]]:
    md = FLEET_MD.read_text(encoding="utf-8")
    out = [("promql block", b.strip()) for b in fenced_blocks(md, "promql")]
    for block in fenced_blocks(md, "yaml"):
        doc = yaml.safe_load(block)
        for group in doc.get("groups", []) if isinstance(doc, dict) else []:
            out += [(f"rule {r['alert']}", str(r["expr"])) for r in group["rules"]]
    return out


# -- the tokenizer on its own -----------------------------------------------------------------


def test_tokenizer_finds_metric_names_and_nothing_else() -> None:
    expr = ('histogram_quantile(0.95, sum by (instance, le) (rate(llmtop_ttft_seconds_bucket'
            '{instance=~"$instance", user!="a b"}[$__rate_interval] offset 5m))) > 0.5 '
            'and on (instance) sum without (gpu) (llmtop_gpu_power_watts) * 2e3 '
            'or max(llmtop_warning_active{code="QUEUEING"}) by (code)')
    assert metric_names(expr) == {"llmtop_ttft_seconds_bucket", "llmtop_gpu_power_watts",
                                  "llmtop_warning_active"}
    assert label_names(expr) == {"instance", "le", "user", "gpu", "code"}
    assert metric_names("up{job=\"llmtop\"} == 0") == {"up"}


def test_a_made_up_metric_is_reported_missing() -> None:
    exp = Exposition()
    exp.add("# TYPE llmtop_ttft_seconds histogram\n"
            'llmtop_ttft_seconds_bucket{le="+Inf"} 1.0\nllmtop_ttft_seconds_count 1.0\n'
            "llmtop_ttft_seconds_sum 0.1\n"
            "# TYPE llmtop_requests_total counter\n"
            'llmtop_requests_total{outcome="ok"} 1.0\n')
    assert exp.missing("rate(llmtop_requests_total[1m])") == set()
    assert exp.missing("sum(rate(llmtop_made_up_tokens_total[1m]))") == {
        "llmtop_made_up_tokens_total"}
    # a histogram has no series under its bare name, a counter none without _total
    assert exp.missing("llmtop_ttft_seconds + llmtop_requests") == {
        "llmtop_ttft_seconds", "llmtop_requests"}
    assert exp.unknown_labels('sum by (user) (rate(llmtop_requests_total[1m]))') == {"user"}


# -- the files' structure --------------------------------------------------------------------


def test_dashboard_structure() -> None:
    dash = load_dashboard()
    assert 38 <= dash["schemaVersion"] <= 41
    ds = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    inst = variables["instance"]
    assert inst["type"] == "query" and inst["datasource"] == ds
    assert re.fullmatch(r"label_values\((llmtop_\w+), instance\)", inst["definition"])
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
    panels = [p for p in dashboard_panels(dash) if p["type"] != "row"]
    assert len(panels) >= 12
    for p in panels:
        assert p["datasource"] == ds, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(set(refs)) == len(refs), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == ds and t["expr"].strip(), p["title"]
            assert 'instance=~"$instance"' in t["expr"], (p["title"], t["expr"])
    titles = " | ".join(p["title"] for p in panels)
    for needed in ("Output tokens/s", "Goodput", "SLO attainment", "TTFT", "ITL", "In flight",
                   "outcome", "Warnings", "GPU memory", "DRAM bandwidth", "Memory busy",
                   "KV-cache"):
        assert needed in titles, needed
    busy = next(p for p in panels if "Memory busy" in p["title"])
    assert "not bandwidth" in busy["title"] and "time" in busy["title"]
    assert all("bandwidth" not in t["expr"] for t in busy["targets"])


def test_prometheus_config() -> None:
    cfg = yaml.safe_load(PROMETHEUS_YML.read_text(encoding="utf-8"))
    assert cfg["global"]["scrape_interval"] == "5s"
    jobs = cfg["scrape_configs"]
    assert jobs
    for job in jobs:
        assert job["metrics_path"] == "/metrics"
        assert job.get("scrape_interval", cfg["global"]["scrape_interval"]) == "5s"
        assert job["authorization"]["type"] == "Bearer"
        assert job["authorization"]["credentials_file"]
        targets = [t for sc in job["static_configs"] for t in sc["targets"]]
        assert targets
        relabels = [r for r in job["relabel_configs"] if r["target_label"] == "replica"]
        assert relabels
        for r in relabels:
            assert r["source_labels"] == ["__address__"]
            for target in targets:  # Prometheus anchors the regex; $1 is group 1
                m = re.fullmatch(r["regex"], target)
                assert m, target
                assert r["replacement"].replace("$1", m.group(1)) == target.rsplit(":", 1)[0]


def test_docs_have_the_promised_queries() -> None:
    exprs = [e for _, e in doc_exprs()]
    assert len(exprs) >= 12
    joined = "\n".join(exprs)
    for needed in ("llmtop_ttft_seconds_bucket", "llmtop_itl_seconds_bucket",
                   "llmtop_output_tokens_total", "llmtop_goodput_output_tokens_total",
                   "llmtop_slo_met_requests_total", "llmtop_slo_judged_requests_total",
                   "llmtop_waiting", "llmtop_streaming",
                   "llmtop_user_output_tokens_total", "llmtop_warning_active"):
        assert needed in joined, needed
    assert "histogram_quantile(0.95, sum by (le) (rate(llmtop_ttft_seconds_bucket" in joined
    assert any(e.startswith("max by (instance, code) (llmtop_warning_active) > 0")
               for e in exprs)


def test_docs_state_the_real_bucket_bounds() -> None:
    """"Histogram bucket bounds (seconds): TTFT 0.005 … 300 (23 bounds; …)": the first and
    last bound and the count of each family are the ones /metrics exports, and the E2E
    bounds step by at most 1.5× from 0.5 s on, as the page says."""
    from llmtop.metrics.prometheus import BUCKETS

    text = " ".join(FLEET_MD.read_text(encoding="utf-8").split())
    para = text[text.index("Histogram bucket bounds (seconds):"):]
    families = {"TTFT": ("ttft",), "ITL, chunk gap and TPOT": ("itl", "chunk_gap", "tpot"),
                "E2E": ("e2e",)}
    for head, names in families.items():
        m = re.search(rf"{head} ([\d.]+) … ([\d.]+) \((\d+) bounds", para[:600])
        assert m, f"fleet.md states no bounds for {head}"
        for name in names:
            bounds = BUCKETS[name]
            assert (float(m[1]), float(m[2]), int(m[3])) == (bounds[0], bounds[-1],
                                                             len(bounds)), head
    e2e = [b for b in BUCKETS["e2e"] if b >= 0.5]
    assert all(b <= 1.5 * a for a, b in itertools.pairwise(e2e))
    assert "1, 1.5, 2, 2.5, 3, 4, 5, 6, 7.5, 10 s" in para
    assert [b for b in BUCKETS["e2e"] if 1 <= b <= 10] == [1, 1.5, 2, 2.5, 3, 4, 5, 6, 7.5, 10]


# -- against a real proxy --------------------------------------------------------------------


async def scrape(session: aiohttp.ClientSession, admin_url: str) -> str:
    async with session.get(admin_url + "/metrics") as resp:
        assert resp.status == 200, await resp.text()
        return await resp.text()


async def traffic(proxy_url: str) -> None:
    async with openai.AsyncOpenAI(base_url=proxy_url + "/v1", api_key="sk-test",
                                  max_retries=0) as c:

        async def one(user: str, n: int) -> None:
            stream = await c.chat.completions.create(
                model="sim-tiny", messages=[{"role": "user", "content": "hello"}],
                max_tokens=n, stream=True, extra_headers={"X-LLMTOP-User": user})
            async for _ in stream:
                pass

        await asyncio.gather(*(one(u, 6 + i) for i, u in enumerate(["alice", "bob"] * 3)))
        with pytest.raises(openai.InternalServerError):
            await c.chat.completions.create(
                model="sim-tiny", messages=[{"role": "user", "content": "hello"}],
                max_tokens=4, extra_headers={"X-Sim-Fault": "status:500",
                                             "X-LLMTOP-User": "alice"})


async def upstream_down(proxy_url: str) -> None:
    async with openai.AsyncOpenAI(base_url=proxy_url + "/v1", api_key="sk-test",
                                  max_retries=0) as c:
        with pytest.raises(openai.APIStatusError) as err:
            await c.chat.completions.create(
                model="sim-tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4)
        assert err.value.status_code == 502


MAY_BE_EMPTY = frozenset({
    "llmtop_capacity_max_concurrency_at_slo",  # needs a load ramp to estimate
    "llmtop_capacity_goodput_tps_at_slo",
    "llmtop_gpu_temperature_celsius",  # the simulated GPU has no thermometer
})


async def test_every_queried_metric_is_exported_by_a_real_proxy() -> None:
    exp = Exposition()
    async with contextlib.AsyncExitStack() as sim_stack:
        sim = await sim_stack.enter_async_context(running_sim("tiny", seed=5, time_scale=0.2))
        cfg = load_config(None, env={}, overrides={
            "upstream": sim.url, "listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
            "admin_token": TOKEN, "gpu.source": "sim", "gpu.interval_s": 0.2,
            "engine.interval_s": 0.2,
        })
        server = LlmtopServer(cfg, out=io.StringIO())
        await server.start()
        try:
            async with aiohttp.ClientSession() as s, s.get(server.admin_url + "/metrics") as r:
                assert r.status == 401  # the token guards /metrics too
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with aiohttp.ClientSession(headers=headers) as s:
                await traffic(server.proxy_url)
                await asyncio.sleep(0.6)  # the bus pump, GPU and engine samplers
                exp.add(await scrape(s, server.admin_url))
                await sim_stack.aclose()  # the engine goes away
                await upstream_down(server.proxy_url)
                for _ in range(40):  # the detectors tick once a second
                    await asyncio.sleep(0.25)
                    text = await scrape(s, server.admin_url)
                    if DOWN in text:
                        break
                exp.add(text)
        finally:
            await server.stop(0)

    assert DOWN in text
    assert {"user", "outcome"} <= exp.labels["llmtop_user_requests_total"]
    exprs = dashboard_exprs(load_dashboard()) + doc_exprs()
    referenced: set[str] = set()
    problems = []
    for where, expr in exprs:
        names = metric_names(expr)
        assert names, (where, expr)
        referenced |= names
        if exp.missing(expr) - {"up"}:  # `up` is Prometheus's own, per target
            problems.append(f"{where}: not exported: {sorted(exp.missing(expr))}: {expr}")
        if exp.unknown_labels(expr):
            problems.append(f"{where}: labels no metric has: "
                            f"{sorted(exp.unknown_labels(expr))}: {expr}")
    assert not problems, "\n".join(problems)
    unsampled = referenced - exp.sampled - MAY_BE_EMPTY - {"up"}
    assert not unsampled, f"declared but never had a sample under traffic: {sorted(unsampled)}"
    assert "llmtop_made_up_tokens_total" not in exp.declared
