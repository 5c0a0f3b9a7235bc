"""The TUI driving a real replay: a recording written by llmtop's own recorder, played by
the real ReplaySource on an injected wall clock."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pty_support import llmtop_in_pty
from textual.widgets._toast import Toast
from tui_support import FIXED_NOW, RealAdmin, screen_text, shows, until

from llmtop.events import RequestRecord
from llmtop.recording.reader import RecordingReader
from llmtop.recording.replay import ReplaySource
from llmtop.recording.writer import Recorder
from llmtop.tui.app import NOTE_TIMEOUT_S, LlmtopApp
from llmtop.tui.screens.help import HelpScreen

WIDE = (160, 48)


class Wall:
    """The replay's wall clock, moved by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def eighty_second_recording(path: Path) -> None:
    """Nine requests 10 s apart (gzipped, so its length is known only once read)."""
    admin = RealAdmin()
    # the records' clock starts at the header's (the real one): the reader drops events
    # a day or more before a recording's start as damaged
    admin.now = time.time()
    admin.recorder.start(str(path))
    for k in range(9):
        admin.request(k, f"u{k % 3}")
        admin.now += 10
    admin.recorder.stop()


def header(app: LlmtopApp) -> str:
    return screen_text(app).splitlines()[0]


async def test_replay_header_keeps_the_length_says_ended_and_shows_the_position_once(
    tmp_path: Path,
) -> None:
    """Seeking back to the start keeps "/1m20s"; at the end the header says "■ replay
    ended" (not ▶); the position is in the replay label only, not again after "via"."""
    path = tmp_path / "s.jsonl.gz"
    eighty_second_recording(path)
    wall = Wall()
    src = ReplaySource(path, wall=wall)
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        wall.t += 30
        await app.refresh_now()
        await shows(pilot, "▶ replay 30s/1m20s ×1")
        for _ in range(4):
            await pilot.press("left")
        await shows(pilot, "▶ replay 0s/1m20s ×1")
        line = header(app)
        assert line.rstrip().endswith("│ via s.jsonl.gz") and "0:00" not in line
        wall.t += 200
        await app.refresh_now()
        await shows(pilot, "■ replay ended 1m20s/1m20s ×1")
        assert "▶" not in header(app)


async def test_replay_has_no_recording_key(tmp_path: Path) -> None:
    """A replay cannot record: `r` opens no prompt and `?` does not list it."""
    path = tmp_path / "s.jsonl.gz"
    eighty_second_recording(path)
    app = LlmtopApp(ReplaySource(path, wall=Wall()), refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        assert app.check_action("record", ()) is False
        await pilot.press("r")
        await pilot.pause()
        assert app.screen is app.dashboard
        assert " rec " not in screen_text(app).splitlines()[-1]
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        text = screen_text(app)
        assert "pause / resume the replay" in text
        assert "start recording" not in text



def rotated_recording(stem: Path, n: int = 60) -> list[Path]:
    """A rotated recording of ``n`` requests (a proxy's ``--record STEM`` with
    ``rotate_mb``), written by llmtop's recorder: its parts, in order."""
    rec = Recorder(stem, header={"upstream": "http://up:1", "slo": {}}, flush_s=0.05,
                   order_hold_s=0.0, rotate_bytes=2000)
    rec.start()
    for first in range(0, n, 10):  # ten at a time, each ten written before the next
        now = time.time()
        rec.on_events([RequestRecord(
            f"r{k}", f"u{k % 3}", "m", "openai", "/v1/chat/completions", True, 200, "ok",
            now - 1.0, 0.2, 0.5, 10, 5, "usage", (0.2, 0.3, 0.4, 0.45, 0.5), (1,) * 5, 1)
            for k in range(first, first + 10)])
        deadline = time.monotonic() + 30
        while rec.status()["queued"] and time.monotonic() < deadline:
            time.sleep(0.01)
    rec.stop()
    parts = [Path(rec.status()["path"])]  # the last part: asked after the stop, whose
    # writes may rotate once more
    while True:
        with RecordingReader(parts[0]) as r:
            prev = r.header["previous"]
        if prev is None:
            return parts
        parts.insert(0, parts[0].with_name(prev))


async def test_a_rotated_recordings_notes_are_shown_as_the_replay_starts(
    tmp_path: Path,
) -> None:
    """``llmtop replay STEM`` with a part missing: the note that says so is shown in the
    TUI (its line on stderr would be under the screen), for longer than Textual's 5 s; a
    file read alone has none."""
    from llmtop.cli.common import resolve_recording
    from llmtop.cli.replay import tui_source

    stem = tmp_path / "prod.jsonl"
    parts = rotated_recording(stem)
    assert len(parts) >= 3, parts
    parts[1].unlink()
    src = tui_source(resolve_recording(str(stem), None, "llmtop replay", quiet=True))
    (note,) = src.notes
    assert "part 2 of" in note and "missing" in note
    app = LlmtopApp(src, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE, notifications=True) as pilot:  # (off by default)
        await until(pilot, lambda: app.refreshes > 0)
        await shows(pilot, "missing (deleted")
        (toast,) = app.screen.query(Toast)
        shown = " ".join(str(toast.render()).split())
        assert " ".join(note.split()) in shown, shown
        assert [(n.message, n.severity, n.timeout) for n in app._notifications] == [
            (note, "warning", NOTE_TIMEOUT_S)]
        assert NOTE_TIMEOUT_S > app.NOTIFICATION_TIMEOUT

    alone = ReplaySource(parts[0], wall=Wall())
    assert alone.notes == ()
    app = LlmtopApp(alone, refresh_hz=0, clock=lambda: FIXED_NOW)
    async with app.run_test(size=WIDE, notifications=True) as pilot:
        await until(pilot, lambda: app.refreshes > 0)
        await pilot.pause()
        assert not app.screen.query(Toast)


async def test_replay_of_a_stem_in_a_pty_shows_its_note_then_prints_it_after() -> None:
    """``llmtop replay STEM`` as a user runs it: the note is not printed before the TUI
    (its screen would cover it), is on the TUI's screen, and is printed on stderr once the
    TUI has left the screen, where the terminal keeps it."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        stem = Path(tmp) / "prod.jsonl"
        parts = rotated_recording(stem)
        parts[1].unlink()
        run = await llmtop_in_pty("replay", str(stem), cols=160, rows=40)
        try:
            await run.until_written(b"\x1b[?1049h", 60)  # the TUI takes the screen
            enter = bytes(run.out).index(b"\x1b[?1049h")
            assert b"llmtop replay: " not in bytes(run.out)[:enter]  # (it would be hidden)
            for _ in range(600):  # drawn, with the note in a toast
                screen = run.screen(enter)
                if b"users" in screen and b"missing" in screen:
                    break
                await asyncio.sleep(0.05)
            assert b"users" in screen and b"missing" in screen, screen[-3000:]
            assert await run.press_until_exit(b"q") == 0
            line = f"llmtop replay: {stem}: part 2 of {len(parts)} missing".encode()
            await run.until_written(line)
        finally:
            await run.close()
    out = bytes(run.out)
    leave = out.rindex(b"\x1b[?1049l")  # the TUI leaves the alternate screen
    assert out.index(b"llmtop replay: ") > leave, out[:2000]
