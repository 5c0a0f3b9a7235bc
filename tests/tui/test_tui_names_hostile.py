"""Client-chosen names in the TUI: no name crashes the users table or opens another
user's detail; none reaches the terminal as a control sequence; wide (CJK) names are cut
by terminal cells, with the "…"."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console
from tui_support import FIXED_NOW, FixtureSource, screen_text, shows, until

from llmtop.textsafe import printable
from llmtop.tui import fmt
from llmtop.tui.app import LlmtopApp
from llmtop.tui.screens.user_detail import UserDetail
from llmtop.tui.snapview import FOLD_KEY, SnapView
from llmtop.tui.widgets.users import UsersTable, user_label

WIDE = (160, 48)
ESCAPES = {
    "osc-title": "\x1b]0;PWNED-TITLE\x1b\\",
    "osc-clipboard": "\x1b]52;c;cHduZWQ=\x07",
    "clear": "\x1b[2J\x1b[Hclear",
    "c1-csi": "\x9b2Jc1",
    "bidi": "abc\u202eevil\u202c",
    "bell": "bell\x07\x07",
    "nul": "\x00nul",
}
CONTROL = frozenset([*range(0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F),
                     *range(0x2066, 0x206A)]) - {ord("\n")}


def make_app(source: FixtureSource) -> LlmtopApp:
    return LlmtopApp(source, refresh_hz=0, clock=lambda: FIXED_NOW)


def row(user: str, tps: float, *, tracked: bool = True) -> dict[str, Any]:
    return {"user": user, "requests": 10, "in_flight": 1, "output_tps": tps,
            "ttft_p95": 0.2, "itl_p95": 0.02, "slo_attainment": 1.0, "tracked": tracked}


def request(rid: str, user: str, model: str = "sim-8b") -> dict[str, Any]:
    return {"id": rid, "user": user, "model": model, "state": "streaming", "age_s": 1.0,
            "completion_tokens": 10, "tps": 10.0}


def terminal_text(app: LlmtopApp) -> str:
    """Every character the composited screen sends to the terminal (its own cursor moves
    and styles aside)."""
    console = Console(width=app.size[0], height=app.size[1], file=io.StringIO(),
                      force_terminal=True, color_system="truecolor", legacy_windows=False)
    update = app.screen._compositor.render_update(full=True,
                                                  screen_stack=app._background_screens)
    return "".join(seg.text for seg in console.render(update) if not seg.control)


def table_users(table: UsersTable) -> list[str | None]:
    return [table.user_for(table.coordinate_to_cell_key((i, 0)).row_key)
            for i in range(table.row_count)]


# -- P1 #1: row keys and the detail screen -----------------------------------------------


async def test_users_named_like_the_fold_key_neither_crash_nor_open_the_fold() -> None:
    """Users named "\\x00other", "(others)", "fold", "u1:alice", "alice\\x00evil" next to
    "alice" and the fold row: every row drawn (no DuplicateKey), each row's user_for is
    exactly its user, and enter on "\\x00other" or "alice\\x00evil" opens that user's
    detail, not the fold's nor alice's."""
    src = FixtureSource("saturated")
    names = ["\x00other", "(others)", "fold", "u1:alice", "alice\x00evil", "alice"]
    src.snapshot["users"] = [row(n, 100.0 - i) for i, n in enumerate(names)]
    src.snapshot["users"].append(row("other", 1.0, tracked=False))
    src.requests = [request(f"r-{i}", n) for i, n in enumerate(names)]
    app = make_app(src)
    async with app.run_test(size=WIDE) as pilot:
        table = app.dashboard.users
        await until(pilot, lambda: table.row_count == 7, what="7 rows")
        users = table_users(table)
        assert users[:6] == names  # sorted by out tok/s: the order they were given
        assert users[6] is FOLD_KEY
        assert FOLD_KEY not in users[:6] and all(u != FOLD_KEY for u in names)
        for target in ("\x00other", "alice\x00evil"):
            table.move_cursor(row=users.index(target))
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, UserDetail), what="detail")
            screen = app.screen
            assert isinstance(screen, UserDetail) and screen.user == target
            shown = printable(target)
            await shows(pilot, f"user {shown}")
            await shows(pilot, f"active requests of {shown}")
            text = screen_text(app)
            assert "every user past" not in text
            rid = f"r-{names.index(target)}"
            assert rid in text
            others = {f"r-{i}" for i in range(len(names))} - {rid}
            assert not any(f"{r} " in text for r in others), text
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, UserDetail), what="back")


async def test_the_fold_row_opens_the_fold_even_beside_a_user_named_like_it() -> None:
    """The fold row opens "(others)": every user's requests but the tracked ones'."""
    src = FixtureSource("saturated")
    src.snapshot["users"] = [row("\x00other", 5.0), row("(others)", 4.0),
                             row("other", 1.0, tracked=False)]
    src.snapshot["top_users"] = 2
    src.requests = [request("r-nul", "\x00other"), request("r-par", "(others)"),
                    request("r-folded", "zed")]
    app = make_app(src)
    async with app.run_test(size=WIDE) as pilot:
        table = app.dashboard.users
        await until(pilot, lambda: table.row_count == 3, what="3 rows")
        table.move_cursor(row=2)
        await pilot.press("enter")
        await shows(pilot, "every user past the top 2, in one row")
        text = screen_text(app)
        assert "r-folded" in text and "r-nul" not in text and "r-par" not in text
        assert app.view.user(FOLD_KEY) == src.snapshot["users"][2]


def test_fold_key_equals_no_user_id() -> None:
    """FOLD_KEY is a str that equals (and hashes like) no plain str, whatever it holds."""
    for name in ("\x00other", "(others)", "other", str(FOLD_KEY), ""):
        assert name != FOLD_KEY and FOLD_KEY != name  # noqa: SIM300 (both sides)
        assert name not in {FOLD_KEY} and FOLD_KEY not in {name: 1}
    view = SnapView({"users": [row("(others)", 2.0), row("other", 1.0, tracked=False)]})
    assert view.user("(others)") == row("(others)", 2.0)
    assert view.user(FOLD_KEY) == row("other", 1.0, tracked=False)
    assert view.user("\x00other") is None


# -- P1 #2: control sequences never reach the terminal -----------------------------------


@pytest.mark.parametrize("size", [WIDE, (80, 24)], ids=["160x48", "80x24"])
async def test_escape_sequences_in_names_are_shown_not_sent(size: tuple[int, int]) -> None:
    """Users, models and request ids carrying OSC (title, clipboard), CSI, C1, BEL, NUL
    and bidi overrides: not one control character in what the screen sends to the
    terminal; the names show with their escapes visible."""
    src = FixtureSource("saturated")
    src.snapshot["users"] = [row(n, 50.0 - i) for i, n in enumerate(ESCAPES.values())]
    src.requests = [request(f"r{i}\x1b[8m", n, model=f"\x1b]52;c;{i}\x07m")
                    for i, n in enumerate(ESCAPES.values())]
    app = make_app(src)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.dashboard.users.row_count == len(ESCAPES))
        await pilot.pause()
        if size[0] < 120:
            await pilot.press("tab")  # the requests table instead of the users
            await pilot.pause()
            seen = terminal_text(app)
            assert not CONTROL & set(map(ord, seen))
            await pilot.press("tab")
            await pilot.pause()
        seen = terminal_text(app)
        assert not CONTROL & set(map(ord, seen)), sorted(CONTROL & set(map(ord, seen)))
        text = screen_text(app)
        assert "\\x1b[2J\\x1b[Hcl" in text
        assert "abcevil" in text
        if size[0] >= 120:
            assert "\\x1b]52;c;" in text  # the model column
        app.open_user(ESCAPES["osc-title"])
        await until(pilot, lambda: isinstance(app.screen, UserDetail), what="detail")
        await pilot.pause()
        seen = terminal_text(app)
        assert not CONTROL & set(map(ord, seen))
        assert "user \\x1b]0;PWNED-TITLE\\x1b\\" in screen_text(app)


@pytest.mark.parametrize("size", [WIDE, (80, 24)])
async def test_escape_sequences_in_the_proxys_own_fields_are_shown_not_sent(
        size: tuple[int, int]) -> None:
    """The upstream URL, the recording path and the capacity note come from the proxy's
    snapshot (or a recording being replayed), not from clients, but reach the same
    terminal: none of them sends a control sequence either."""
    src = FixtureSource("saturated")
    src.snapshot["upstream"] = "http://gpu-1:8000/\x1b]0;PWNED\x07v1"
    src.snapshot["recording"] = {"active": True, "path": "rec\x1b[2J\u202e.jsonl"}
    src.snapshot.setdefault("capacity", {})["note"] = "note\x9b2J"
    app = make_app(src)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: "REC" in screen_text(app), what="the header")
        await pilot.pause()
        seen = terminal_text(app)
        assert not CONTROL & set(map(ord, seen)), sorted(CONTROL & set(map(ord, seen)))
        text = screen_text(app)
        assert "\\x1b" in text  # shown, escaped
        if size[0] >= 120:
            assert "gpu-1:8000/\\x1b]0;PWNED\\x07v1" in text


def test_printable() -> None:
    """C0 (tab and newline too), DEL and C1 become visible \\xNN escapes, bidi controls go,
    lone surrogates become U+FFFD; CJK, emoji, combining marks and markup are kept."""
    assert printable("\x1b]52;c;cHduZWQ=\x07") == "\\x1b]52;c;cHduZWQ=\\x07"
    assert printable("a\tb\nc\rd\x00e\x7ff\x9bg\x85") == \
        "a\\x09b\\x0ac\\x0dd\\x00e\\x7ff\\x9bg\\x85"
    assert printable("\u202ea\u202cb\u2066c\u2069\u202a\u202b\u202d\u2067\u2068") == "abc"
    assert printable("x\ud800y") == "x\ufffdy"
    for keep in ("日本語", "😀 e\u0301", "[bold red]x[/]", "zero\u200bwidth", ""):
        assert printable(keep) == keep
    nasty = "".join(map(chr, range(0xA0))) + "\u202e\ud83d"
    assert printable(printable(nasty)) == printable(nasty)
    assert printable(nasty).isprintable()


# -- #11: wide names are cut by cells, with the ellipsis ---------------------------------


def test_clip_counts_cells() -> None:
    name = "日本語のユーザー名前がとても長い"  # 16 characters, 32 cells
    for n in range(1, 40):
        out = fmt.clip(name, n)
        assert cell_len(out) <= n
        if n < 32:
            assert out.endswith("…") and name.startswith(out[:-1])
    assert fmt.clip(name, 10) == "日本語の…"  # 8 cells and "…": a fifth would not fit
    assert fmt.clip("ab日本", 4) == "ab…"
    assert fmt.clip("abc", 3) == "abc" and fmt.clip("abcd", 3) == "ab…"
    assert fmt.clip("abc", 0) == ""
    assert user_label("模型" * 20, 12) == "模型模型模…"
    assert user_label("") == "(empty)"


async def test_cjk_names_are_cut_with_an_ellipsis_in_both_tables() -> None:
    """A 64-cell CJK user and a 40-cell CJK model: the users and requests tables show
    them cut with "…", never beyond their column."""
    name = "日本語のユーザー名前がとても長い" * 2
    src = FixtureSource("saturated")
    src.snapshot["users"][0]["user"] = name
    for r in src.requests:
        r["user"], r["model"] = name, "模型" * 20
    app = make_app(src)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        lines = [line for line in screen_text(app).splitlines() if "日本" in line]
    assert len(lines) >= 2
    for line in lines:
        for part in line.split("│"):
            if "日本" in part:
                assert "日本語のユ" in part and "…" in part, line
            if "模型" in part:
                assert re.search("模型[模型]*…", part), line
