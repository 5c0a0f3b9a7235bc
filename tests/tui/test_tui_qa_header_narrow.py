"""QA: the header's second line keeps the alarms (errors, SLO attainment) in view at
any width.

Line 2 was cut at its end: the saturated proxy (3 errors, SLO attainment 41%, critical)
read "RPS 6.60 │ 1,453 tok/s │ flight 48 (31w/17s) │ err 3 │ …" at 60 columns, the
SLO gone, and "RPS 6.60 │ 1,453 tok/s │ flight 48 …" at 40, the errors gone too; at 80
while disconnected ("as of 1m15s ago: ..." first) the SLO went. The least telling
figures now give way first (the in-flight breakdown, the target, goodput, in flight,
output tok/s), whole."""

from __future__ import annotations

import pytest
from tui_support import FIXED_NOW, FixtureSource, screen_text, until

from llmtop.tui.app import LlmtopApp


@pytest.mark.parametrize(("size", "kept"), [
    ((60, 20), ("RPS 6.60", "1,453 tok/s", "flight 48", "err 3", "SLO 41%")),
    ((40, 12), ("RPS 6.60", "err 3", "SLO 41%")),
    ((80, 24), ("RPS 6.60", "1,453 tok/s", "flight 48 (31w/17s)", "err 3", "goodput 596",
                "SLO 41%")),
    ((160, 48), ("RPS 6.60", "out 1,453 tok/s", "in flight 48 (31 wait / 17 stream)",
                 "errors 3", "goodput 596 tok/s", "SLO 41% (target 95%)")),
])
async def test_errors_and_the_slo_stay_on_line_2(size: tuple[int, int],
                                                 kept: tuple[str, ...]) -> None:
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        line2 = screen_text(app).splitlines()[1]
        for figure in kept:
            assert figure in line2, (figure, line2)
        assert "…" not in line2, line2  # figures are left out whole, never cut


async def test_the_slo_stays_while_disconnected_at_80_columns() -> None:
    src = FixtureSource("saturated")
    now = [1000.0]
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW, monotonic=lambda: now[0])
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        src.down = True
        now[0] += 75.4
        await app.refresh_now()
        await pilot.pause()
        line2 = screen_text(app).splitlines()[1]
        assert line2.lstrip().startswith("as of 1m15s ago: RPS 6.60"), line2
        assert "err 3" in line2 and "SLO 41%" in line2, line2
        assert "…" not in line2, line2
