"""An engine /metrics behind credentials (a gateway that guards it) said only
"URL: HTTP 401": nothing told the user that llmtop sends none, or what to change. The
status now says so and names the settings."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from net_support import serving

from llmtop.engines.scraper import EngineScraper, ScrapeError


@pytest.mark.parametrize("status", [401, 403])
async def test_a_guarded_metrics_endpoint_says_what_to_do(status: int) -> None:
    seen: list[str | None] = []

    async def guarded(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.Response(status=status, text="unauthorized")

    async with serving(web.get("/metrics", guarded)) as base, \
            aiohttp.ClientSession() as session:
        sc = EngineScraper(base + "/metrics", session, lambda e: None)
        with pytest.raises(ScrapeError) as caught:
            await sc.scrape_once(session)
    said = str(caught.value)
    assert said.startswith(f"{base}/metrics: HTTP {status} (it wants credentials")
    assert "engine.metrics_url" in said and "engine.enabled = false" in said
    assert seen == [None]  # (and llmtop sent none: no client key is ever forwarded here)
