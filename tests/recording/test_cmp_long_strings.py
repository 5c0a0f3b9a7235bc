"""Long client- or machine-chosen strings (5,000 characters with a control sequence, an RTL
override and an emoji in the middle) are shown compactly in ``llmtop report``'s text and
HTML, single and compared: a GPU name, a warning's code and message, an error text, user
and model names. Before, each was printed whole (a 5,000-character warning message on one
line, a 10,000-character slowest-request row). The JSON keeps them whole."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main
from llmtop.events import GpuReading, WarningEvent
from llmtop.recording.report.fmt import MAX_SHOWN, compact

HOSTILE = "\u202e\x1b]0;pwn\x07\U0001f600\u05d0"


def long(c: str) -> str:
    return c * 2400 + HOSTILE + c * 2600


def hostile_recording(path: Path, *, gpu: str) -> None:
    t0 = soon()
    ev: list = []
    for i in range(30):
        r = request(i, t0 + i * 0.1, user=long("U") if i % 2 else "bob", model=long("M"),
                    outcome="error" if i % 7 == 6 else "ok")
        if r.outcome == "error":
            r = dataclasses.replace(r, error=long("E"))
        ev.append(r)
    ev += [GpuReading(t=t0 + s, index=0, name=gpu, mem_used_bytes=2**30,
                      mem_total_bytes=8 * 2**30, util_gpu=10.0, mem_busy=5.0,
                      dram_bw_util=5.0, power_w=100.0, simulated=True) for s in range(4)]
    ev.append(WarningEvent(t=t0 + 1, code=long("C"), severity="warning",
                           message=long("W"), state="raised"))
    ev.sort(key=lambda e: e.t if not hasattr(e, "t_start") else e.t_start + e.e2e_s)
    write_recording(path, ev)


RUN = re.compile(rf"([GWUMCE])\1{{{MAX_SHOWN},}}")  # a run longer than anything shown


def cut(c: str, n: str, text: str) -> bool:
    """``text`` shows a run of ``c`` shortened: its start … its end (n characters)."""
    return re.search(f"{c}{{10,}}…{c}{{10,}}[^…]{{0,16}} \\({n} characters\\)", text) is not None


def _check(out: str) -> None:
    assert not RUN.search(out), RUN.search(out)
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    longest = max(len(line) for line in out.splitlines())
    assert longest < 1500, longest  # text: a line is at most a few shortened names wide


@pytest.fixture()
def recs(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    hostile_recording(a, gpu=long("G"))
    hostile_recording(b, gpu=long("G") + "2")  # another GPU, alike when shortened
    return a, b


def test_single_report_text_is_compact(recs: tuple[Path, Path],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["report", str(recs[0]), "-q"]) == 0
    out = capsys.readouterr().out
    _check(out)
    # the warning, the GPU, the model and the error are still there, shortened and sized
    warn = out.split("WARNINGS", 1)[1].split("\n\n", 1)[0]
    assert cut("W", "5,016", warn) and cut("C", "5,016", warn)
    assert cut("G", "5,016", out.split("GPU (peaks)", 1)[1])
    assert cut("M", "5,016", out) and "EEE" in out
    assert "bob" in out


def test_single_report_html_is_compact(recs: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(recs[0]), "-q", "--format", "html", "-o", str(out)]) == 0
    page = out.read_text()
    assert not RUN.search(page), RUN.search(page)
    assert "\x1b" not in page and "\u202e" not in page
    assert cut("W", "5,016", page) and cut("G", "5,016", page)


def test_compare_text_and_html_are_compact(recs: tuple[Path, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    a, b = recs
    capsys.readouterr()
    assert main(["report", str(a), str(b), "-q"]) == 0
    out = capsys.readouterr().out
    _check(out)
    # judged on the whole names: the GPUs differ (at their very end) and say so
    gpus = next(line for line in out.splitlines() if "! different GPUs" in line)
    assert cut("G", "5,028", gpus) and "G2 (simulated) (5,029 characters)" in gpus
    assert "withheld" in out
    html = tmp_path / "c.html"
    assert main(["report", str(a), str(b), "-q", "--format", "html", "-o", str(html)]) == 0
    page = html.read_text()
    assert not RUN.search(page) and "\x1b" not in page
    assert "different GPUs" in page


def test_json_keeps_the_names_whole(recs: tuple[Path, Path],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["report", str(recs[0]), "-q", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["warnings"][0]["message"] == long("W")


def test_compact() -> None:
    assert compact("abc") == "abc"
    assert compact("a\x1bb") == "a\\x1bb"  # printable first
    s = compact("x" * 100 + "y" * 9000 + "z" * 100)
    assert len(s) <= MAX_SHOWN and s.startswith("x" * 100) and s.endswith("z (9,200 characters)")
    assert compact(s) == s
