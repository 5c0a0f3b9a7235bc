"""The header at narrow and tiny sizes: the state (disconnected, proxies down, paused) and
the window stay in view; decorative text and the recording path give way first."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tui_support import (
    FIXED_NOW,
    AdminServer,
    FixtureSource,
    after_keys,
    focused_row,
    screen_text,
    shows,
    until,
)

from llmtop.tui.app import LlmtopApp
from llmtop.tui.source import AdminSource

PROXY, ADMIN = "http://127.0.0.1:8080", "http://127.0.0.1:8081"


class DownSource(FixtureSource):
    """Several proxies, one of them not answering (AdminSource's ``down_label``)."""

    def down_label(self) -> str | None:
        return "1/2 proxies down"

    def describe(self) -> str:
        return "1/2 proxies up · down: http://10.0.0.2:8081"


def make_app(source: FixtureSource, **kw: Any) -> LlmtopApp:
    return LlmtopApp(source, refresh_hz=0, clock=lambda: FIXED_NOW, **kw)


async def first_lines(app: LlmtopApp, size: tuple[int, int], n: int = 2) -> list[str]:
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        return screen_text(app).splitlines()[:n]


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (60, 20), (40, 12)])
async def test_proxies_down_is_shown_at_every_width(size: tuple[int, int]) -> None:
    """QA #4: with one of several proxies down, "1/2 proxies down" is on line 1 below 120
    columns too (it was only in the "via" text, shown when wide)."""
    line1 = (await first_lines(make_app(DownSource("saturated")), size))[0]
    assert "1/2 proxies down" in line1, line1


async def test_a_stopped_proxy_of_two_shows_down_at_80_columns() -> None:
    """QA #4 end to end: two real admin APIs, one stopped: line 1 at 80 columns says so."""
    a, b = AdminServer("saturated"), AdminServer("saturated")
    await a.start()
    await b.start()
    app = LlmtopApp(AdminSource([a.url, b.url], timeout_s=1.0), refresh_hz=10, retry_s=0.1)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.refreshes > 0)
            assert "proxies down" not in screen_text(app).splitlines()[0]
            await b.stop()
            await until(pilot, lambda: "1/2 proxies down" in screen_text(app).splitlines()[0],
                        what="'1/2 proxies down' on line 1")
    finally:
        await a.stop()
        await b.stop()


def demo_source(path: str = "recordings/demo.jsonl") -> FixtureSource:
    src = FixtureSource("saturated")
    src.snapshot["recording"] = {"status": "recording", "path": path}
    src.snapshot["upstream"] = "http://127.0.0.1:9000"
    return src


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (119, 30)])
async def test_demo_header_keeps_the_window_before_the_recording_path(
        size: tuple[int, int]) -> None:
    """QA #5: `make demo` at 80 columns (proxy, admin, recording): the window label is
    shown, the recording path shortened to its file name."""
    app = make_app(demo_source(), proxy=PROXY, admin=ADMIN)
    line1 = (await first_lines(app, size))[0]
    assert "window 60 s" in line1, line1
    assert "● REC demo.jsonl" in line1, line1
    assert f"proxy {PROXY}" in line1 and "admin :8081" in line1, line1


async def test_a_long_recording_path_is_cut_with_an_ellipsis_not_the_window() -> None:
    """QA #5: a recording file name too long for the room left is cut ("…"); the window
    and the addresses stay whole."""
    app = make_app(demo_source("/var/lib/llmtop/llmtop-20261201-143000-a-long-name.jsonl.gz"),
                   proxy=PROXY, admin=ADMIN)
    line1 = (await first_lines(app, (80, 24)))[0]
    assert "window 60 s" in line1, line1
    assert "● REC llmtop-" in line1 and "…" in line1, line1
    assert "/var/lib" not in line1, line1


@pytest.mark.parametrize("size", [(160, 30), (80, 24), (40, 20)])
async def test_a_recording_that_stopped_writing_shows_rec_failed(size: tuple[int, int]) -> None:
    """The recorder stopped writing (its status's ``error``: a full disk, the file
    deleted): the proxy forwards on and still reports a recording, but the header says REC
    FAILED at any width — under the TUI the proxy's stderr line and exit summary are not
    seen until it quits (tests/recording/test_rec_qa_real_disk.py). It showed a plain REC."""
    src = demo_source()
    src.snapshot["recording"] = {"path": "demo.jsonl", "recording": True,
                                 "error": "write failed: File too large"}
    app = make_app(src, proxy=PROXY, admin=ADMIN)
    line1 = (await first_lines(app, size))[0]
    assert "● REC FAILED" in line1, line1
    assert "window 60 s" in line1, line1
    ok = demo_source()
    ok.snapshot["recording"] = {"path": "demo.jsonl", "recording": True, "error": None}
    line1 = (await first_lines(make_app(ok, proxy=PROXY, admin=ADMIN), size))[0]
    assert "● REC" in line1 and "FAILED" not in line1, line1


@pytest.mark.parametrize("size", [(160, 30), (40, 20)])
async def test_a_stem_another_process_writes_shows_rec_shared(size: tuple[int, int]) -> None:
    """Another live process was writing the recording's stem when it started (its status's
    ``others_writing``): the proxy's stderr says so at start, unseen under the TUI, which
    showed a plain REC. A failed recording says FAILED first."""
    src = demo_source()
    src.snapshot["recording"] = {"path": "demo.20261207T010000Z.jsonl", "recording": True,
                                 "error": None, "others_writing": ["demo.20261207T005900Z.jsonl"]}
    line1 = (await first_lines(make_app(src, proxy=PROXY, admin=ADMIN), size))[0]
    assert "● REC SHARED" in line1 and "window 60 s" in line1, line1
    src.snapshot["recording"]["error"] = "write failed: File too large"
    line1 = (await first_lines(make_app(src, proxy=PROXY, admin=ADMIN), size))[0]
    assert "● REC FAILED" in line1 and "SHARED" not in line1, line1
    src.snapshot["recording"].update(error=None, others_writing=[])
    line1 = (await first_lines(make_app(src, proxy=PROXY, admin=ADMIN), size))[0]
    assert "● REC" in line1 and "SHARED" not in line1, line1


async def test_disconnected_and_paused_beat_the_addresses_at_40_columns() -> None:
    """The state is the most important thing line 1 says: at 40 columns a down proxy
    still reads DISCONNECTED, and PAUSED shows too."""
    src = FixtureSource("saturated")
    app = make_app(src, proxy=PROXY, admin=ADMIN)
    async with app.run_test(size=(40, 12)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        src.down = True
        await app.refresh_now()
        await pilot.press("p")
        await pilot.pause()
        line1 = screen_text(app).splitlines()[0]
    assert line1.lstrip().startswith("DISCONNECTED"), line1
    assert "PAUSED" in line1 or "DISCONNECTED — retrying (" in line1, line1


@pytest.mark.parametrize("size", [(40, 12), (60, 20)])
async def test_header_stays_on_screen_at_tiny_sizes(size: tuple[int, int]) -> None:
    """QA #8: at 40×12 the header scrolled away (the users table took the focus and the
    screen scrolled to it); it stays on the first line, the other panes shrink."""
    app = make_app(FixtureSource("saturated"))
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await until(pilot, lambda: "window 60 s" in screen_text(app).splitlines()[0],
                    what="the header drawn")
        assert "window 60 s" in screen_text(app).splitlines()[0]
        await pilot.press("tab", "down", "down", "down")
        await after_keys(pilot, lambda: app.focused is app.dashboard.requests
                         and focused_row(app) == 3, "the requests' cursor on row 3")
        assert "window 60 s" in screen_text(app).splitlines()[0], screen_text(app)


async def test_flight_with_no_figures_says_na_once() -> None:
    """Cosmetic: "flight n/a (n/aw/n/as)" collapses to "flight n/a"."""
    src = FixtureSource("saturated")
    for key in ("in_flight", "waiting", "streaming"):
        src.snapshot["system"][key] = None
    for size in [(80, 24), (160, 48)]:
        line2 = (await first_lines(make_app(src), size))[1]
        assert "n/aw" not in line2 and "n/a wait" not in line2, line2
        assert "flight n/a │" in line2, line2


# -- the window label (QA #9, #14) --------------------------------------------------------


async def test_w_while_paused_keeps_the_shown_window_until_the_data_comes() -> None:
    """QA #9: `p` then `w`: the header said "window 5 min" over the 60 s figures still on
    screen. It names the window of the figures shown and the one asked for as pending;
    `p` again fetches that window and the header says it plainly."""
    src = FixtureSource("saturated")
    app = make_app(src)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.press("p", "w")
        await until(pilot, lambda: "→ 5 min…" in screen_text(app).splitlines()[0],
                    what="the window asked for, pending")
        text = screen_text(app)
        assert src.windows == [60]
        assert "window 60 s → 5 min…" in text.splitlines()[0], text.splitlines()[0]
        assert "latency · 60 s" in text
        await pilot.press("p")
        await shows(pilot, "window 5 min │")
        assert src.windows[-1] == 300
        assert "latency · 5 min" in screen_text(app)


class HangingSource(FixtureSource):
    """Answers the first fetch, then hangs (an admin API that accepts and never replies)
    until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__("saturated")
        self.release = asyncio.Event()

    async def fetch(self, window_s: int | None) -> dict[str, Any]:
        if self.windows:
            self.windows.append(window_s)
            await self.release.wait()
            self.windows.pop()
        return await super().fetch(window_s)


async def test_w_does_not_wait_for_a_hung_admin_api() -> None:
    """QA #14: `w` awaited the fetch in the key handler, so a hung admin API froze every
    key. The switch returns at once, shows the window asked for as pending, keys still
    work, and the figures come when the API answers."""
    src = HangingSource()
    app = make_app(src)
    # a press (and the screen drawn after it) takes 0.5-1.7 s under load here: the old
    # code never returned while the source hung (it answers only once released, below),
    # so the limit is there only to fail rather than hang, and is generous
    press_s = 20.0
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await asyncio.wait_for(pilot.press("w"), press_s)
        await shows(pilot, "window 60 s → 5 min…")
        await asyncio.wait_for(pilot.press("w"), press_s)  # a second press is not queued behind
        await shows(pilot, "window 60 s → all…")
        await asyncio.wait_for(pilot.press("question_mark"), press_s)
        await shows(pilot, "llmtop keys")
        await pilot.press("escape")
        src.release.set()
        await shows(pilot, "window all │")
        assert app.view.window_s is None
