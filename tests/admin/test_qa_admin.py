"""QA of the admin API as a hostile local client, over a real server on 127.0.0.1 port 0:
bad bodies for ``POST /recording`` answered 400 (never a 500), repeated or ambiguous query
parameters refused, and ``/metrics`` label values chosen by clients escaped."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from admin_support import admin_servers
from prometheus_client.parser import text_string_to_metric_families

HOSTILE_USERS = ('q"}\nevil_metric 1\n#', 'back\\slash"quote', "ünïcødé ✓ 🙂", "other")


@pytest.fixture
async def admin() -> AsyncIterator[Callable[[], Any]]:
    async with admin_servers() as servers:
        yield lambda: servers.serve_admin(HOSTILE_USERS, recording=True)


async def post_raw(url: str, body: bytes, headers: dict[str, str] | None = None
                   ) -> tuple[int, str, str]:
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    async with aiohttp.ClientSession() as s, s.post(url + "/llmtop/v1/recording", data=body,
                                                    headers=hdrs) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.text()


async def get(url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.text()


async def test_recording_body_that_cannot_be_decoded_is_a_400(
        admin: Callable[[], Any]) -> None:
    """QA: ``Content-Encoding: gzip`` on a body that is not gzip was a plain-text 500 and a
    traceback on the proxy's stderr."""
    url = await admin()
    status, ctype, text = await post_raw(url, b'{"action": "stop"}',
                                         {"Content-Encoding": "gzip"})
    assert status == 400 and ctype.startswith("application/json")
    assert "body could not be read" in json.loads(text)["error"]
    # a body that really is gzip still works
    status, _, text = await post_raw(url, gzip.compress(b'{"action": "stop"}'),
                                     {"Content-Encoding": "gzip"})
    assert status == 409 and json.loads(text)["error"] == "not recording"


async def test_deeply_nested_json_body_is_a_400(admin: Callable[[], Any]) -> None:
    """QA: 100 000 nested ``[`` made ``json.loads`` raise RecursionError: a 500."""
    url = await admin()
    for body in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000):
        status, ctype, text = await post_raw(url, body)
        assert status == 400 and ctype.startswith("application/json")
        assert json.loads(text)["error"].startswith("body must be a JSON object")


async def test_bad_recording_paths_are_4xx_and_create_nothing(
        admin: Callable[[], Any], tmp_path: Path) -> None:
    url = await admin()
    existing = tmp_path / "old.jsonl"
    existing.write_text("precious\n")
    (tmp_path / "dir").mkdir()
    cases = {
        str(tmp_path / "made") + "/": 400,  # QA: was a file named "made" (the slash dropped)
        str(tmp_path / "dir"): 400,
        str(existing): 400,
        str(tmp_path / "nodir" / "x.jsonl"): 400,
        str(tmp_path / "a\x00b.jsonl"): 400,
        str(tmp_path / "x.zst"): 400,
    }
    for path, want in cases.items():
        status, ctype, text = await post_raw(
            url, json.dumps({"action": "start", "path": path}).encode())
        assert (status, ctype.split(";")[0]) == (want, "application/json"), (path, text)
    assert sorted(os.listdir(tmp_path)) == ["dir", "old.jsonl"]
    assert existing.read_text() == "precious\n"


@pytest.mark.parametrize("query", [
    "/llmtop/v1/snapshot?window=10&window=all",
    "/llmtop/v1/snapshot?max_age=0&max_age=5",
    "/llmtop/v1/snapshot?active=1&active=0",
    "/llmtop/v1/requests?state=active&state=recent",
    "/llmtop/v1/requests?state=recent&limit=1&limit=500",
])
async def test_repeated_parameter_is_a_400(admin: Callable[[], Any], query: str) -> None:
    """QA: ``window=10&window=all`` answered for 10 and ignored ``all`` without a word."""
    url = await admin()
    status, ctype, text = await get(url + query)
    assert status == 400 and ctype.startswith("application/json")
    assert "given more than once" in json.loads(text)["error"]


@pytest.mark.parametrize("query", ["histograms=maybe", "user_histograms=2", "active=%FF",
                                   "active=on!"])
async def test_yes_no_parameter_that_is_neither_is_a_400(admin: Callable[[], Any],
                                                         query: str) -> None:
    """QA: ``histograms=maybe`` meant yes and ``user_histograms=2`` meant no, silently."""
    url = await admin()
    status, _, text = await get(url + "/llmtop/v1/snapshot?" + query)
    assert status == 400, text
    assert "must be 1 or 0" in json.loads(text)["error"]


async def test_yes_no_parameters_still_accepted(admin: Callable[[], Any]) -> None:
    url = await admin()
    _, _, text = await get(url + "/llmtop/v1/snapshot?user_histograms=TRUE&histograms=no"
                                 "&active=1&unknown_param=x")
    snap = json.loads(text)
    assert "histograms" not in snap or not snap["histograms"]
    assert "active_requests" in snap
    assert all("histograms" in u for u in snap["users"])
    _, _, text = await get(url + "/llmtop/v1/snapshot?histograms=&user_histograms=")
    snap = json.loads(text)
    assert snap["histograms"] and not any("histograms" in u for u in snap["users"])


async def test_metrics_escape_client_chosen_user_labels(admin: Callable[[], Any]) -> None:
    url = await admin()
    status, _, text = await get(url + "/metrics")
    assert status == 200
    assert "evil_metric" not in {f.name for f in text_string_to_metric_families(text)}
    users = {s.labels["user"] for f in text_string_to_metric_families(text)
             if f.name == "llmtop_user_requests" for s in f.samples}
    # every hostile value comes back intact; the user named "other" is not the fold
    assert users == {*HOSTILE_USERS[:3], "other_"}
    assert not any(line.startswith("evil_metric") for line in text.splitlines())


async def test_recording_from_the_api_must_be_named_like_a_recording(
        admin: Callable[[], Any], tmp_path: Path) -> None:
    """Whoever reaches the admin API chose any path the proxy could create: a recording at
    ``~/.bash_login`` (absent) would run its lines at the next login — they quote
    client-chosen text such as user names. Only ``.jsonl``/``.jsonl.gz`` names now."""
    url = await admin()
    for name in (".bash_login", "x.txt", "x.JSONL.GZ", "x.jsonl.gz.sh", "x.gz"):
        status, ctype, text = await post_raw(
            url, json.dumps({"action": "start", "path": str(tmp_path / name)}).encode())
        assert status == 400 and ctype.startswith("application/json"), (name, text)
        assert ".jsonl" in json.loads(text)["error"]
    assert os.listdir(tmp_path) == []
    status, _, text = await post_raw(
        url, json.dumps({"action": "start", "path": str(tmp_path / "ok.jsonl.gz")}).encode())
    assert status == 200, text
    status, _, _ = await post_raw(url, json.dumps({"action": "stop"}).encode())
    assert status == 200
    assert os.listdir(tmp_path) == ["ok.jsonl.gz"]


async def test_metrics_answer_in_the_format_the_scraper_asks_for(
        admin: Callable[[], Any]) -> None:
    """Prometheus asks for OpenMetrics first (its Accept header); /metrics answered the text
    format whatever was asked. Now the scraper's choice, with the text format by default."""
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as om_families,
    )

    url = await admin()
    prometheus_accept = ("application/openmetrics-text;version=1.0.0,"
                         "application/openmetrics-text;version=0.0.1;q=0.75,"
                         "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/metrics", headers={"Accept": prometheus_accept}) as r:
            om_type, om_text = r.headers["Content-Type"], await r.text()
        async with s.get(url + "/metrics") as r:
            plain_type, plain_text = r.headers["Content-Type"], await r.text()
    assert om_type.startswith("application/openmetrics-text")
    assert om_text.endswith("# EOF\n")
    om_names = {f.name for f in om_families(om_text)}
    assert "llmtop_requests" in om_names  # (OpenMetrics names counters without _total)
    assert plain_type.startswith("text/plain")
    plain_names = {f.name for f in text_string_to_metric_families(plain_text)}
    assert "llmtop_requests" in plain_names and "# EOF" not in plain_text
