"""QA: with NO_COLOR set, what the colours say is still on screen.

Textual draws every colour as a grey under NO_COLOR, so a TTFT p95 of 5.05 s against a
500 ms SLO (red), one close to its SLO (yellow) and one within it (green) looked alike:
three greys of about the same shade. The palette now tells them by attributes when
NO_COLOR is set: over the target bold and underlined, close to it underlined, within it
plain; and a theme switch (d) keeps it so."""

from __future__ import annotations

import pytest
from tui_support import FIXED_NOW, FixtureSource, until

from llmtop.tui.app import LlmtopApp


def underlined_texts(app: LlmtopApp) -> list[str]:
    """The texts drawn underlined on the screen now."""
    return [seg.text for strip in app.screen._compositor.render_strips() for seg in strip
            if seg.style is not None and seg.style.underline]


def drawn_light(app: LlmtopApp) -> bool:
    """Whether the frame on screen now is drawn in the light theme (its backgrounds are
    light greys): the frame after `d`, not the one before it."""
    greys = sorted(sum(seg.style.bgcolor.get_truecolor()) / 3
                   for strip in app.screen._compositor.render_strips() for seg in strip
                   if seg.style is not None and seg.style.bgcolor is not None)
    return bool(greys) and greys[len(greys) // 2] > 128


@pytest.mark.parametrize("theme_switch", [False, True])
async def test_slo_judgements_read_without_colour(monkeypatch: pytest.MonkeyPatch,
                                                  theme_switch: bool) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        if theme_switch:
            await pilot.press("d")
            await until(pilot, lambda: app.theme == "textual-light" and drawn_light(app),
                        what="the light theme drawn")
        await until(pilot, lambda: all(t in "".join(underlined_texts(app))
                                       for t in ("5.05 s", "41%", "SLO_TTFT")),
                    what="the judgements drawn underlined")
        assert app.no_color
        pal = app.palette
        assert pal.latency(5.05, 0.5) == "bold underline"  # over the SLO
        assert pal.latency(0.45, 0.5) == "underline"  # close to it
        assert pal.latency(0.1, 0.5) == ""  # within it
        assert pal.attainment(0.41, 0.95) == "bold underline"
        marked = "".join(underlined_texts(app))
    # on screen: the TTFT p95 over its SLO, the SLO attainment 41%, the critical warning
    assert "5.05 s" in marked and "41%" in marked and "SLO_TTFT" in marked, marked


async def test_with_colour_the_palette_is_the_themes() -> None:
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        assert not app.no_color
        assert "underline" not in app.palette.bad and app.palette.bad.startswith("#")


@pytest.mark.parametrize("no_color", [False, True])
async def test_help_says_how_the_judgements_look(monkeypatch: pytest.MonkeyPatch,
                                                 no_color: bool) -> None:
    """`?` said "green ≤ 80% of the SLO, yellow up to it, red over it" with NO_COLOR set
    too, where there is no green, yellow or red."""
    from llmtop.tui.screens.help import HelpScreen

    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
    app = LlmtopApp(FixtureSource("saturated"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        notes = str(app.screen.query_one("#help-notes").render())
    if no_color:
        assert "bold and underlined" in notes and "green" not in notes, notes
    else:
        assert "green ≤ 80% of the SLO" in notes and "underlined" not in notes, notes
