"""QA (3 a.m., the proxy went away): the last figures stay on screen, but not as live ones.

The proxy stopped answering: line 1 said "DISCONNECTED — retrying", and line 2 went on
showing "RPS 6.60 │ 1,453 tok/s │ flight 48 │ err 3 (red) │ SLO 41% (red)" in bold, for
ten minutes as for ten seconds, exactly as when they were live: nothing said how old they
were. Line 2 now starts "as of 1m15s ago:" and its figures are dim, not bold or coloured;
fresh data takes the label away."""

from __future__ import annotations

import pytest
from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp


@pytest.mark.parametrize("size", [(160, 48), (80, 24), (40, 12)])
async def test_figures_kept_while_disconnected_say_how_old_they_are(
        size: tuple[int, int]) -> None:
    src = FixtureSource("saturated")
    now = [1000.0]  # the app's monotonic clock: it moves only when the test says
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW, monotonic=lambda: now[0])
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        live = screen_text(app).splitlines()[1]
        assert "RPS 6.60" in live and "as of" not in live, live

        src.down = True
        await app.refresh_now()
        await pilot.pause()
        line2 = screen_text(app).splitlines()[1]
        assert line2.lstrip().startswith("as of 0s ago: RPS 6.60"), line2

        now[0] += 75.4  # the proxy has been gone for 75 s
        await app.refresh_now()  # the next retry, still refused
        await pilot.pause()
        lines = screen_text(app).splitlines()
        assert "DISCONNECTED" in lines[0], lines[0]
        assert lines[1].lstrip().startswith("as of 1m15s ago: RPS 6.60"), lines[1]
        # none of the old figures is drawn as a live alarm (red errors, red SLO) or bold
        header = app.dashboard.header
        text = header._line2(size[0] >= 120)
        after_label = [s for s in text.spans if s.start >= len("as of 1m15s ago: ")]
        assert after_label
        assert all(str(s.style) == header.palette.dim for s in after_label), text.spans

        src.down = False
        await app.refresh_now()
        await pilot.pause()
        line2 = screen_text(app).splitlines()[1]
        assert "as of" not in line2 and "RPS 6.60" in line2, line2


async def test_disconnected_before_any_data_still_says_waiting() -> None:
    src = FixtureSource("saturated")
    src.down = True
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: not app.connected)
        await pilot.pause()
        line2 = screen_text(app).splitlines()[1]
    assert "waiting for the first snapshot" in line2 and "as of" not in line2, line2
