"""SGLang labels its scheduler metrics with ``tp_rank``/``pp_rank`` (and ``dp_rank`` with
data-parallel attention). With ``--enable-metrics-for-all-schedulers`` every tensor-
parallel rank exports its own copy of the same batch's figures: 4 TP ranks running 8
requests are 4 series of 8, not 32 requests. Copies that differ only in tp_rank/pp_rank
are one figure; different dp_rank or model_name are different requests and add up.
Scraped over a real socket."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from net_support import serving

from llmtop.engines.recognise import recognise
from llmtop.engines.scraper import EngineScraper


def sglang(rows: list[tuple[dict[str, str], float, float, float]]) -> str:
    out = []
    for labels, running, queued, usage in rows:
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        out += [f"sglang:num_running_reqs{{{inner}}} {running}",
                f"sglang:num_queue_reqs{{{inner}}} {queued}",
                f"sglang:token_usage{{{inner}}} {usage}"]
    return "\n".join(out) + "\n"


M = {"model_name": "q", "engine_type": "unified"}
ALL_TP = sglang([({**M, "tp_rank": str(r), "pp_rank": "0"}, 8, 2, 0.4) for r in range(4)])


async def test_tp_ranks_copies_are_one_figure() -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=ALL_TP, content_type="text/plain")

    async with serving(web.get("/metrics", metrics)) as url, \
            aiohttp.ClientSession() as session:
        sc = EngineScraper(url + "/metrics", session, lambda e: None)
        r = await sc.scrape_once(session)
    assert (r.kind, r.running, r.waiting, r.kv_cache_usage) == ("sglang", 8.0, 2.0, 0.4)


def test_dp_ranks_add_up_their_tp_copies_do_not() -> None:
    rows = [({**M, "tp_rank": "0", "pp_rank": "0", "dp_rank": "0"}, 5, 1, 0.3),
            ({**M, "tp_rank": "1", "pp_rank": "0", "dp_rank": "0"}, 5, 1, 0.3),
            ({**M, "tp_rank": "2", "pp_rank": "0", "dp_rank": "1"}, 7, 3, 0.6),
            ({**M, "tp_rank": "3", "pp_rank": "0", "dp_rank": "1"}, 7, 3, 0.6)]
    r = recognise(sglang(rows), 0.0)
    assert (r.running, r.waiting, r.kv_cache_usage) == (12.0, 4.0, 0.6)


def test_pipeline_stages_are_copies_too() -> None:
    rows = [({**M, "tp_rank": "0", "pp_rank": str(p)}, 6, 0, 0.5) for p in range(2)]
    assert recognise(sglang(rows), 0.0).running == 6.0


def test_models_still_add_up() -> None:
    rows = [({"model_name": "a", "tp_rank": "0", "pp_rank": "0"}, 3, 1, 0.2),
            ({"model_name": "b", "tp_rank": "0", "pp_rank": "0"}, 4, 2, 0.9)]
    r = recognise(sglang(rows), 0.0)
    assert (r.running, r.waiting, r.kv_cache_usage) == (7.0, 3.0, 0.9)
