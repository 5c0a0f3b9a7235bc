"""`llmtop attach` as a user runs it: a real process in a pseudo-terminal against a real
admin API, and one-line errors for bad arguments."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from pty_support import llmtop_in_pty
from tui_support import AdminServer


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["ftp://h:1"], "is not an admin URL"),
     (["localhost"], "needs a port"),
     (["--refresh-hz", "0", "h:1"], "--refresh-hz 0 must be in")],
)
def test_bad_arguments_exit_2_with_one_line(argv: list[str], message: str) -> None:
    """A bad URL or rate is one line on stderr and exit code 2, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "llmtop", "attach", *argv],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert lines[0].startswith("llmtop attach: error:")


def test_several_urls_without_merge_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Several URLs in a build without llmtop.metrics.merge: one line, exit code 2."""
    monkeypatch.setitem(sys.modules, "llmtop.metrics.merge", None)
    from llmtop.cli import main

    assert main(["attach", "h:1", "h:2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "several proxies needs llmtop.metrics.merge" in err[0]


async def test_attach_in_a_pty_shows_live_users_and_quits_on_q() -> None:
    """`llmtop attach URL` in a 120×36 pseudo-terminal draws the proxy's users and
    figures from the admin API, and `q` exits with code 0."""
    srv = AdminServer("saturated")
    await srv.start()
    try:
        run = await llmtop_in_pty("attach", srv.url, "--refresh-hz", "10", cols=120, rows=36)
    except BaseException:
        await srv.stop()
        raise
    try:
        await run.until_on_screen(b"batch-job", b"key:3f9a1c2e", b"1,453")
        assert srv.windows and srv.windows[0] == "60"
        run.press(b"q")
        assert await asyncio.wait_for(run.proc.wait(), 30) == 0
    finally:
        await run.close()
        await srv.stop()
