"""``/metrics`` with an ``Accept`` header whose ``version`` is not a version number, over a
real admin server on 127.0.0.1 port 0.

prometheus_client's ``choose_encoder`` compares the version's parts with ``(1, 0, 0)``:
a part that is not an integer (``version=abc``, ``version=1.x``, a stray byte after
``1.0.0``) raised ``TypeError`` there, a 500 with a traceback on the proxy's stderr for
every such scrape; one that ``int()`` reads but is not ASCII digits (``version=\u0661.0.0``,
``version=1_0.0.0``) was copied into the answer's ``Content-Type``. A media range with
such a version is now one llmtop cannot serve (as prometheus/common's negotiation skips a
version it does not know): the next range in the header decides, else the text format.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from admin_support import admin_servers
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse

TEXT_004 = "text/plain; version=0.0.4; charset=utf-8"
OM_100 = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@pytest.fixture
async def admin() -> AsyncIterator[Callable[[], Any]]:
    async with admin_servers() as servers:
        yield servers.serve_admin


async def scrape(url: str, accept: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics",
                                                   headers={"Accept": accept}) as r:
        return r.status, r.headers["Content-Type"], (await r.read()).decode()


@pytest.mark.parametrize(("accept", "want"), [
    ("application/openmetrics-text; version=abc", TEXT_004),
    ("application/openmetrics-text; version=1.x", TEXT_004),
    ("application/openmetrics-text; version=1.0.0\u00ff", TEXT_004),
    ("text/plain; version=abc", TEXT_004),
    ("text/plain; version=1.0.0-rc1; escaping=underscores", TEXT_004),
    ("application/openmetrics-text; version=\u0661.0.0", TEXT_004),
    ("application/openmetrics-text; version=1_0.0.0", TEXT_004),
    # a range llmtop cannot serve leaves the choice to the next one
    ("application/openmetrics-text; version=x;q=0.9,application/openmetrics-text;"
     "version=1.0.0;q=0.5", OM_100 + "; escaping=underscores"),
    # what served before still does
    ("application/openmetrics-text; version=1.0.0", OM_100 + "; escaping=underscores"),
    ("application/openmetrics-text", OM_100),
    ("text/plain; version=0.0.4", TEXT_004),
])
async def test_an_accept_version_that_is_not_a_number_is_not_a_500(
        admin: Callable[[], Any], accept: str, want: str) -> None:
    url = await admin()
    status, content_type, body = await scrape(url, accept)
    assert status == 200, body
    assert content_type == want
    parse = om_parse if content_type.startswith("application/openmetrics-text") else text_parse
    names = {f.name for f in parse(body)}
    assert {"llmtop_requests", "llmtop_ttft_seconds"} <= names
