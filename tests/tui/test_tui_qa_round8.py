"""QA round 8, on screen: `llmtop run` never showed its admin address (the listen lines
were read from the proxy child and not printed; the header named it only at ≥ 120
columns); capacity "≈ 0, goodput ≈ 0 tok/s" when even concurrency 1 misses the SLOs; two
different figures both called "goodput" (the header's, for the window, and the output
chart's reference line, at capacity)."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest
from pty_support import llmtop_run_in_pty
from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.sim.server import running_sim
from llmtop.tui.app import LlmtopApp

SIZES = [(160, 48), (120, 40), (80, 24)]


async def _screen(src: FixtureSource, size: tuple[int, int]) -> str:
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        return screen_text(app)


@pytest.mark.parametrize("size", SIZES)
async def test_capacity_none_is_said_as_bench_says_it(size: tuple[int, int]) -> None:
    src = FixtureSource("saturated")
    src.snapshot["capacity"] = {"max_concurrency_at_slo": 0, "goodput_tps_at_slo": 0.0,
                                "first_failing_concurrency": 1}
    text = await _screen(src, size)
    (line,) = [x for x in text.splitlines() if x.lstrip("│ ").startswith("capacity")]
    assert "none — even concurrency 1 misses the SLOs" in line, line
    assert "≈ 0" not in text and "goodput ≈" not in line, line
    assert "over capacity" not in line  # nothing to be over: no level meets the SLOs
    # no reference line at 0 on the charts either ("capacity 0", "goodput 0")
    assert not re.search(r"╌ [a-z ]*capacity 0\b", text), text


def test_capacity_none_above_concurrency_1_names_the_lowest_level_seen() -> None:
    from llmtop.tui.snapview import SnapView
    from llmtop.tui.widgets.capacity import CapacityLine

    line = CapacityLine()
    line.view = SnapView({"capacity": {"max_concurrency_at_slo": 0, "goodput_tps_at_slo": 0.0,
                                       "first_failing_concurrency": 4},
                          "system": {"in_flight": 6}})
    assert line.build(160).plain == (  # type: ignore[union-attr]
        "capacity max concurrency at SLO: none — even concurrency 4, the lowest seen, "
        "misses the SLOs")


@pytest.mark.parametrize("size", SIZES[:2])  # 80×24 has no room for the charts
async def test_only_the_window_goodput_is_called_plain_goodput(size: tuple[int, int]) -> None:
    """The header's "goodput 596" is the window's; the output chart's reference line (the
    goodput at capacity, 1,105) is labelled so the two cannot be taken for one figure."""
    text = await _screen(FixtureSource("saturated"), size)
    assert re.search(r"goodput 596", text), text  # the header's
    assert "╌ goodput 1,105" not in text, text
    assert re.search(r"out(put)? tok/s 1,4[0-9]{2}\s+╌ (goodput at )?capacity 1,105\b", text), text


# -- the admin address (QA: `llmtop run --admin 127.0.0.1:0` never showed it) ---------------

PROXY, ADMIN = "http://127.0.0.1:8080", "http://127.0.0.1:45679"


@pytest.mark.parametrize(("size", "shown"), [((160, 48), f"admin {ADMIN}"),
                                             ((100, 40), "admin :45679"),
                                             ((80, 24), "admin :45679")])
async def test_the_header_names_the_admin_address_at_every_width(
        size: tuple[int, int], shown: str) -> None:
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW,
                    proxy=PROXY, admin=ADMIN)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        line1 = screen_text(app).splitlines()[0]
    assert f"proxy {PROXY} │ {shown} │ " in line1, line1


async def test_an_admin_url_not_beside_the_proxys_is_shown_whole() -> None:
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW,
                    proxy="http://0.0.0.0:8080", admin=ADMIN)
    async with app.run_test(size=(100, 40)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        line1 = screen_text(app).splitlines()[0]
    assert f"│ admin {ADMIN} │" in line1, line1


async def test_run_prints_both_addresses_on_the_main_screen_and_names_the_admin_port(
) -> None:
    """`llmtop run --admin 127.0.0.1:0` in a real pty, 100 columns: the two listen lines
    are printed before the TUI takes the alternate screen (so they are on the main screen,
    and in its scrollback, when the TUI exits; nothing clears it), the header names the
    admin port, and that address is the admin API."""
    async with running_sim("tiny") as sim:
        run = await llmtop_run_in_pty(sim.url, cols=100, rows=30)
        try:
            before, alt, _ = bytes(run.out).partition(b"\x1b[?1049h")
            assert alt, "the TUI did not use the alternate screen"
            proxy = re.search(rb"llmtop: proxy listening on http://127\.0\.0\.1:[0-9]+\r?\n",
                              before)
            admin = re.search(rb"llmtop: admin listening on (http://127\.0\.0\.1:([0-9]+))\r?\n",
                              before)
            assert proxy is not None and admin is not None, before
            url, port = admin[1].decode(), admin[2].decode()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while f"admin :{port}".encode() not in run.screen():
                assert loop.time() < deadline, run.screen()[-3000:]
                await asyncio.sleep(0.2)
            async with aiohttp.ClientSession() as s, \
                    s.get(url + "/llmtop/v1/snapshot") as r:
                assert r.status == 200 and (await r.json())["version"] == 1
            assert await run.press_until_exit(b"q") == 0
            await run.until_written(b"llmtop: served", 10)  # what it prints on its way out
            raw = bytes(run.out)
            _, left, after = raw.rpartition(b"\x1b[?1049l")
            assert left and b"llmtop: served" in after, raw[-2000:]
            for clear in (b"\x1b[2J", b"\x1b[3J", b"\x1bc"):  # the main screen is kept
                assert clear not in before + after, (clear, before + after)
        finally:
            await run.close()
