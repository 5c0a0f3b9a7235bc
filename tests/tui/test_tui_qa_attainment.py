"""QA: an SLO attainment is never rounded onto its target, nor to 100 %.

Shown as a whole percentage, 94.6 % met read "SLO 95% (target 95%)" (in the colour of a
miss, which then looked like a wrong colour) and 99.96 % read "100%" with requests that
missed. Such a value now keeps the decimal that tells it apart, rounded towards zero."""

from __future__ import annotations

from tui_support import FIXED_NOW, AdminServer, screen_text, until, until_fetched

from llmtop.tui import fmt
from llmtop.tui.app import LlmtopApp
from llmtop.tui.source import AdminSource


def test_attainment_text() -> None:
    assert fmt.attainment(0.946, 0.95) == "94.6%"
    assert fmt.attainment(0.9499, 0.95) == "94.9%"
    assert fmt.attainment(0.949, 0.95) == "94.9%"  # not 94.8: 0.949 * 1000 is 948.99…
    assert fmt.attainment(0.95, 0.95) == "95%"
    assert fmt.attainment(0.9996, 0.95) == "99.9%"
    assert fmt.attainment(1.0, 0.95) == "100%"
    assert fmt.attainment(0.41, 0.95) == "41%"
    assert fmt.attainment(0.004, 0.95) == "0.4%"
    assert fmt.attainment(0.946, None) == "94.6%"  # the default target, 95 %
    assert fmt.attainment(None, 0.95) == fmt.NA


async def test_the_screen_does_not_round_onto_the_target() -> None:
    srv = AdminServer("saturated")
    srv.snapshot["system"]["slo_attainment"] = 0.946
    srv.snapshot["users"][0]["slo_attainment"] = 0.9996
    await srv.start()
    try:
        app = LlmtopApp(AdminSource([srv.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
        async with app.run_test(size=(160, 48)) as pilot:
            await until_fetched(pilot, lambda: "SLO 94.6% (target 95%)" in screen_text(app),
                                what="the header's attainment")
            users = app.dashboard.users
            row = [c.plain for c in users.get_row_at(0)]
            assert users.user_for(users.coordinate_to_cell_key((0, 0)).row_key) == "batch-job"
            assert row[-1] == "99.9%"  # the SLO column, last
            assert "99.9%" in screen_text(app)
            app.open_user("batch-job")
            await until(pilot, lambda: "SLO attainment" in screen_text(app), what="detail")
            assert "99.9%" in screen_text(app)
    finally:
        await srv.stop()
