"""A rotated recording's stem as a user ends up using it (found by running a real proxy
with ``--record STEM --rotate-*``): a stem that names an existing recording, and a stem
recorded to twice through the admin API's stop and start.

The parts are made by the real :class:`Recorder` / :class:`RecordingController` (what
``--record`` and the admin API's ``POST /llmtop/v1/recording`` drive), with a tiny
``rotate_bytes``; the commands run as processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rec_helpers import feed

from llmtop.bus import EventBus
from llmtop.recording.writer import Recorder, RecordingController

pytestmark = pytest.mark.timeout(240)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmtop", *args], capture_output=True,
                          text=True, timeout=90, stdin=subprocess.DEVNULL, check=False)


def report_json(*args: str) -> tuple[dict[str, Any], str]:
    p = run_cli("report", *args, "--format", "json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), p.stderr


def parts_of(stem: Path) -> list[Path]:
    base = stem.name.split(".")[0]
    return sorted(p for p in stem.parent.iterdir() if p.name.startswith(base + ".2"))


def test_a_stem_naming_an_existing_recording(tmp_path: Path) -> None:
    """``--record prod.jsonl --rotate-s …`` where yesterday's unrotated ``prod.jsonl``
    still is: the recorder writes its parts beside it (it never writes the stem), but
    ``report prod.jsonl`` reads the old file. Before, it did so silently — the run's
    requests nowhere in the report, no word of the parts — and ``--series 1`` was
    refused ("a file, read alone"), so the parts could not be read whole at all. Now
    stderr names the parts and ``--series N`` reads them."""
    stem = tmp_path / "prod.jsonl"
    old = Recorder(stem, header={"upstream": "http://old:8000"}, flush_s=0.1)
    old.start()
    feed(old, 20, first=5000)
    old.stop()
    rec = Recorder(stem, header={"upstream": "http://new:8000"}, flush_s=0.1,
                   order_hold_s=0.0, rotate_bytes=1500)
    rec.start()
    first = Path(rec.status()["path"])
    feed(rec, 60)
    rec.stop()
    assert len(parts_of(stem)) >= 3 and stem.exists()

    report, err = report_json(str(stem))
    assert report["conditions"]["requests"] == 20  # the file itself, as before
    said = [x for x in err.splitlines() if "parts of a rotated recording" in x]
    assert len(said) == 1 and "--series 1" in said[0] and first.name in said[0], err

    report, err = report_json(str(stem), "--series", "1")
    assert report["conditions"]["requests"] == 60
    assert report["conditions"]["upstream"] == "http://new:8000"
    p = run_cli("export", str(stem), "--series", "1", "--hlog", str(tmp_path / "o.hlog"))
    assert p.returncode == 0, p.stderr
    p = run_cli("report", str(stem), "--series", "2")
    assert p.returncode == 2 and "there is 1 series" in p.stderr, p.stderr

    # a file with no parts named after it: read alone, nothing said, --series refused
    lone = tmp_path / "lone.jsonl"
    lone.write_bytes(first.read_bytes())
    report, err = report_json(str(lone))
    assert "rotated" not in err, err
    p = run_cli("report", str(lone), "--series", "1")
    assert p.returncode == 2 and "a file, read alone" in p.stderr, p.stderr


def test_a_stem_stopped_and_started_through_the_admin_api(tmp_path: Path) -> None:
    """Two start/stop cycles with one path (the admin API's recording control) with
    rotation configured: each cycle rotates, its parts named after the path, each a
    series. The note on the older series must not say the proxy was restarted (it was
    not: before, it said "(the proxy was restarted)")."""
    stem = tmp_path / "sess.jsonl.gz"
    ctl = RecordingController(EventBus(), header={"upstream": "http://u:8000"}, flush_s=0.1,
                              order_hold_s=0.0, rotate_bytes=300)
    counts = []
    for cycle in range(2):
        st = ctl.start(str(stem))
        assert st["stem"] == str(stem) and Path(st["path"]).name.startswith("sess.2")
        rec = ctl.recorder
        assert rec is not None
        feed(rec, 40 + 20 * cycle, first=1000 * cycle)
        done = ctl.stop()
        assert done["part"] >= 2
        counts.append(done["requests"])
    assert counts == [40, 60]

    report, err = report_json(str(stem))
    assert report["conditions"]["requests"] == 60
    said = [x for x in err.splitlines() if "2 series" in x]
    assert len(said) == 1, err
    assert "proxy was restarted" not in said[0] and "stopped and started" in said[0], err
    report, _ = report_json(str(stem), "--series", "1")
    assert report["conditions"]["requests"] == 40


def test_one_stem_before_and_after_a_restart_compared(tmp_path: Path) -> None:
    """``report STEM STEM --series 1,2``: the run before a restart beside the run after it
    (the comparison a restart for an upgrade calls for). Before, ``--series N`` was one
    number read from each file, so the two sides were always the same series; the
    labels also said ``prod.jsonl`` twice."""
    stem = tmp_path / "prod.jsonl.gz"
    for n, first in ((30, 0), (50, 1000)):
        rec = Recorder(stem, header={"upstream": "http://u:8000"}, flush_s=0.1,
                       order_hold_s=0.0, rotate_bytes=300)
        rec.start()
        feed(rec, n, first=first)
        rec.stop()

    report, _ = report_json(str(stem), str(stem), "--series", "1,2")
    assert [r["conditions"]["requests"] for r in report["reports"]] == [30, 50]
    assert (report["a"], report["b"]) == ("prod.jsonl.gz (series 1)", "prod.jsonl.gz (series 2)")
    report, _ = report_json(str(stem), str(stem), "--series", "2")  # one N: each file's
    assert [r["conditions"]["requests"] for r in report["reports"]] == [50, 50]
    for bad in ("1,2,3", "x", "1,"):
        p = run_cli("report", str(stem), str(stem), "--series", bad)
        assert p.returncode == 2 and "--series" in p.stderr, p.stderr
    p = run_cli("report", str(stem), "--series", "1,2")  # two series, one file
    assert p.returncode == 2 and "FILE2" in p.stderr, p.stderr
