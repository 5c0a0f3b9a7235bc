"""``/metrics`` under every name escaping a Prometheus 3 scraper may negotiate
(``metric_name_escaping_scheme``: its Accept header's ``escaping=``), over a real admin
server on 127.0.0.1 port 0.

Escaping schemes only rewrite names outside the legacy character set (prometheus/common's
``EscapeMetricFamily`` leaves a legacy family name as it is, whatever the scheme); every
llmtop name is legacy, so the answer is the same exposition under every scheme. The
``dots`` and ``values`` answers were prometheus_client's, which escapes each sample name
whole, suffix included: ``U__llmtop__requests__total`` under ``# TYPE llmtop_requests``,
``llmtop__ttft__seconds__bucket`` under ``# TYPE llmtop__ttft__seconds``. No sample
belonged to its family: the OpenMetrics parser refused the scrape ("Clashing name") and the
text parser read ~1,200 untyped families, each histogram line a family of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from admin_support import admin_servers
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse

OM = "application/openmetrics-text; version=1.0.0"
TEXT = "text/plain; version=1.0.0"


@pytest.fixture
async def admin() -> AsyncIterator[Callable[[], Any]]:
    async with admin_servers() as servers:
        yield lambda: servers.serve_admin(("alice", "bob", 'q"uote'))


async def scrape(url: str, accept: str) -> tuple[str, str]:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics",
                                                   headers={"Accept": accept}) as r:
        assert r.status == 200
        return r.headers["Content-Type"], await r.text()


@pytest.mark.parametrize("escaping", ["dots", "values"])
@pytest.mark.parametrize("fmt", [OM, TEXT])
async def test_every_escaping_keeps_llmtops_names_and_parses(
        admin: Callable[[], Any], fmt: str, escaping: str) -> None:
    url = await admin()
    content_type, body = await scrape(url, f"{fmt}; escaping={escaping}")
    assert content_type.startswith(fmt.partition(";")[0])
    assert f"escaping={escaping}" in content_type  # the scheme the answer claims
    # legacy names are left as they are: the same lines as the default scheme's
    _, plain = await scrape(url, f"{fmt}; escaping=underscores")
    assert body == plain
    parse = om_parse if fmt == OM else text_parse
    fams = {f.name: f for f in parse(body)}
    assert fams["llmtop_requests"].type == "counter"
    assert {s.name for s in fams["llmtop_requests"].samples} == {"llmtop_requests_total"}
    ttft = fams["llmtop_ttft_seconds"]
    assert ttft.type == "histogram"
    buckets = [s for s in ttft.samples if s.name == "llmtop_ttft_seconds_bucket"]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == 3.0
    users = {s.labels["user"] for s in fams["llmtop_user_ttft_seconds"].samples}
    assert users == {"alice", "bob", 'q"uote'}
