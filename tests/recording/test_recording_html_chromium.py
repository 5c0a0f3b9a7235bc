"""The HTML report opened in headless Chromium (Debian's `chromium`): a screenshot is saved
and the rendered page has every plot. The screenshot goes to the test's temporary folder;
with LLMTOP_UPDATE_SCREENSHOTS=1 (`make screenshots`) it replaces screenshots/report.png.

Chromium is installed by `make test` when missing; under CI (CI=true) a missing chromium
fails this test, elsewhere it is skipped with the command that installs it."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from rec_helpers import request

from llmtop.recording.reader import RecordingReader
from llmtop.recording.replay import event_time
from llmtop.recording.report.analyse import analyse
from llmtop.recording.report.html import render_html
from llmtop.recording.report.plots import PLOTS
from llmtop.recording.writer import dumps_line

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "screenshots" / "report.png"
FIXTURE = ROOT / "tests" / "fixtures" / "recordings" / "sim_tiny_ramp.jsonl.gz"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    msg = "chromium is not installed (Debian: apt-get install -y chromium)"
    if os.environ.get("CI") == "true":
        pytest.fail(msg + " — CI must have it: `make test` installs it")
    pytest.skip(msg)


def run_chromium(exe: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.iterdir()))}"
    profile.mkdir()
    return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def append_request(out: Path, *, user: str) -> None:
    """The fixture's lines as recorded (its own header and times: re-recording them would
    stamp today's started_at on events from the day the fixture was made, and the reader
    rightly drops events more than a day before a recording started), one request by
    ``user`` inserted before the footer, whose counts are kept true."""
    lines = gzip.decompress(FIXTURE.read_bytes()).splitlines(keepends=True)
    footer = json.loads(lines[-1])
    assert footer["type"] == "footer"
    last = list(RecordingReader(FIXTURE))[-1]
    extra = dumps_line(request(999, event_time(last), user=user).to_json_dict())
    footer["requests"] += 1
    footer["lines"] += 1
    out.write_bytes(gzip.compress(b"".join([*lines[:-1], extra, dumps_line(footer)])))


def test_html_report_in_headless_chromium(tmp_path: Path) -> None:
    exe = chromium()
    rec = tmp_path / "session.jsonl.gz"  # the real ramp fixture plus a user to escape
    append_request(rec, user="<i>dave</i>")
    page = tmp_path / "report.html"
    page.write_text(render_html(analyse(rec)), encoding="utf-8")

    dom = run_chromium(exe, tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    for plot_id in PLOTS:
        assert f'id="{plot_id}"' in html, f"{plot_id} missing from the rendered page"
    assert html.count("<svg") == len(PLOTS)
    assert "&lt;i&gt;dave&lt;/i&gt;" in html  # escaped text, not markup

    SCREENSHOT = tmp_path / "report.png"
    shot = run_chromium(exe, tmp_path, f"--screenshot={SCREENSHOT}", "--window-size=1400,4000",
                        page.as_uri())
    assert shot.returncode == 0, shot.stderr[-2000:]
    data = SCREENSHOT.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1400, 4000)
    assert len(data) > 100_000  # a page of tables and plots, not a blank screen
    if os.environ.get("LLMTOP_UPDATE_SCREENSHOTS") == "1":
        COMMITTED.parent.mkdir(exist_ok=True)
        COMMITTED.write_bytes(data)
