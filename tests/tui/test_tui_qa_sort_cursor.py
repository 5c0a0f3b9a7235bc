"""QA: sorting the users table keeps the cursor on its user.

s, S or a click on a column's header re-sorts the users; the cursor went back to the
first row and the view to the top (150 users, cursor on the 6th user shown: after s it
was on whoever sorted first), so enter then opened someone else's detail. The table
meant to follow the cursor's user, as it does at a refresh, but it asked for that user
after the new headings had cleared the table (a re-sort changes a heading's ▲/▼), when
the cursor was already on row 0. It now follows the user to its new row, in view."""

from __future__ import annotations

from tui_support import FIXED_NOW, FixtureSource, until

from llmtop.tui.app import LlmtopApp
from llmtop.tui.widgets.users import UsersTable


def in_view(table: UsersTable) -> bool:
    """Whether the cursor's row is within the rows the table shows now."""
    top = int(table.scroll_y)
    rows = table.size.height - 1  # less the header
    return top <= table.cursor_row < top + rows


async def test_s_and_S_keep_the_cursor_on_its_user() -> None:
    app = LlmtopApp(FixtureSource("many_users"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 48)) as pilot:
        table = app.dashboard.users
        await until(pilot, lambda: table.row_count == 150, what="150 users")
        await pilot.press(*["down"] * 5)
        await until(pilot, lambda: table.cursor_row == 5, what="the cursor on row 5")
        user = table.cursor_user()
        assert user is not None
        for key in ["s", "s", "S", "s", "s", "s", "s", "s", "S"]:
            sorted_by = (table.sort_index, table.sort_reverse)
            await pilot.press(key)
            await pilot.pause()
            assert (table.sort_index, table.sort_reverse) != sorted_by, key
            assert table.cursor_user() == user, (key, table.sort_column.key,
                                                 table.cursor_row, table.cursor_user())
            assert in_view(table), (key, table.cursor_row, table.scroll_y)


async def test_a_header_click_keeps_the_cursor_on_its_user() -> None:
    app = LlmtopApp(FixtureSource("many_users"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 48)) as pilot:
        table = app.dashboard.users
        await until(pilot, lambda: table.row_count == 150, what="150 users")
        await pilot.press(*["down"] * 5)
        await until(pilot, lambda: table.cursor_row == 5, what="the cursor on row 5")
        user = table.cursor_user()
        table.sort_by("user")  # what a click on the user heading does
        await pilot.pause()
        assert table.sort_column.key == "user"
        assert table.cursor_user() == user, (table.cursor_row, table.cursor_user())
        assert in_view(table), (table.cursor_row, table.scroll_y)


async def test_a_cursor_on_the_first_row_stays_at_the_top() -> None:
    """Not moved from the first row, the cursor is at the top of the new order after a
    re-sort (what the reader sorted to see), not sent after the user it was on."""
    app = LlmtopApp(FixtureSource("many_users"), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=(160, 48)) as pilot:
        table = app.dashboard.users
        await until(pilot, lambda: table.row_count == 150, what="150 users")
        first = table.cursor_user()
        await pilot.press("S")  # the fewest output tok/s first: the first user goes last
        await pilot.pause()
        assert table.cursor_row == 0 and table.scroll_y == 0
        assert table.cursor_user() != first
