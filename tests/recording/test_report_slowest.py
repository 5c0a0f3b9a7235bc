"""The report names its slowest requests: the K longest by TTFT and by E2E, in order, each
with llmtop's id and the engine's (``upstream_id``, "-"/null when none) — in text, JSON
and HTML, with client-chosen names made safe; fewer than K, or none, is no crash."""

from __future__ import annotations

import dataclasses
import html
import json
import random
import re
from pathlib import Path

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main
from llmtop.events import RequestRecord
from llmtop.recording.report.slowest import SLOWEST, Slowest

# i: (ttft, e2e, streamed, upstream_id) — TTFT 0.9 twice: the earlier start ranks first
CASES: dict[int, tuple[float | None, float, bool, str | None]] = {
    0: (0.10, 1.0, True, "chatcmpl-0"),
    1: (0.90, 1.2, True, "chatcmpl-1"),
    2: (0.50, 5.0, True, None),
    3: (0.90, 1.1, True, "chatcmpl-3"),
    4: (None, 9.0, False, "req-4"),  # a non-streamed answer: E2E only
    5: (2.00, 2.1, True, None),
    6: (0.30, 0.4, True, "x-6"),
    7: (0.70, 3.0, True, "chatcmpl-7"),
    8: (0.20, 0.3, True, "chatcmpl-8"),
}
TTFT_ORDER = ["r5", "r1", "r3", "r7", "r2"]
E2E_ORDER = ["r4", "r2", "r7", "r5", "r1"]


def record(i: int, t0: float, ttft: float | None, e2e: float, streamed: bool,
           upstream_id: str | None, *, user: str = "alice") -> RequestRecord:
    r = request(i, t0 + i * 0.5, ttft=ttft or 0.1, gap=0.01, n_chunks=5, user=user)
    if not streamed:
        return dataclasses.replace(r, stream=False, ttft_s=None, chunk_offsets_s=(),
                                   chunk_tokens=(), e2e_s=e2e, upstream_id=upstream_id)
    return dataclasses.replace(r, e2e_s=e2e, upstream_id=upstream_id)


def write(path: Path, recs: list[RequestRecord]) -> None:
    write_recording(path, sorted(recs, key=lambda r: r.t_start + r.e2e_s))


def known(path: Path, user: str = "alice") -> None:
    t0 = soon()
    write(path, [record(i, t0, *c, user=user) for i, c in CASES.items()])


def report(path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> str:
    capsys.readouterr()
    assert main(["report", str(path), "--format", fmt, "-q"]) == 0
    return capsys.readouterr().out


def text_section(text: str) -> list[str]:
    return text.split("SLOWEST REQUESTS", 1)[1].split("\n\n", 1)[0].splitlines()[1:]


def text_list(section: list[str], label: str) -> list[list[str]]:
    """The rows (split on 2+ spaces) under "  by TTFT:" / "  by E2E:", header left out."""
    start = section.index(f"  {label}:")
    rows = []
    for line in section[start + 2:]:
        if not line.startswith("    "):
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def test_json_names_the_k_slowest_in_order(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    known(path)
    s = json.loads(report(path, capsys, "json"))["slowest"]
    assert SLOWEST == 5 and s["k"] == 5
    assert [x["id"] for x in s["ttft"]] == TTFT_ORDER
    assert [x["id"] for x in s["e2e"]] == E2E_ORDER
    for x in s["ttft"] + s["e2e"]:
        i = int(x["id"][1:])
        ttft, e2e, streamed, up = CASES[i]
        assert x["upstream_id"] == up  # None (null) for r2, r5
        assert x["ttft_s"] == ttft and x["e2e_s"] == pytest.approx(e2e)
        assert x["stream"] is streamed and x["user"] == "alice" and x["model"] == "m-8b"
        assert x["outcome"] == "ok" and x["status"] == 200 and x["output_tokens"] == 5
    assert s["ttft"][4]["upstream_id"] is None and s["e2e"][0]["upstream_id"] == "req-4"


def test_text_and_html_show_the_same_lists(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    known(path)
    section = text_section(report(path, capsys, "text"))
    header = ["start (UTC)", "user", "model", "outcome", "status", "TTFT", "E2E", "out tok",
              "id", "upstream id"]
    for label, order in (("by TTFT", TTFT_ORDER), ("by E2E", E2E_ORDER)):
        rows = text_list(section, label)
        assert [r[8] for r in rows] == order, section
        for r in rows:
            up = CASES[int(r[8][1:])][3]
            assert r[9] == (up or "-")
            assert r[1:5] == ["alice", "m-8b", "ok", "200"] and r[7] == "5"
            assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", r[0]), r[0]
    assert re.split(r"\s{2,}", section[section.index("  by TTFT:") + 1].strip()) == header
    by_ttft = text_list(section, "by TTFT")
    assert by_ttft[0][5:7] == ["2 s", "2.1 s"] and by_ttft[1][5] == "900 ms"
    assert text_list(section, "by E2E")[0][5:7] == ["n/a", "9 s"]  # non-streamed: no TTFT

    page = report(path, capsys, "html")
    assert "<h2>Slowest requests</h2>" in page
    for key, order in (("ttft", TTFT_ORDER), ("e2e", E2E_ORDER)):
        tbl = page.split(f'<table class="slowest-{key}">', 1)[1].split("</table>", 1)[0]
        rows = [re.findall(r"<td>(.*?)</td>", tr) for tr in tbl.split("<tr>")[2:]]
        assert [r[8] for r in rows] == order
        assert [r[9] for r in rows] == [CASES[int(i[1:])][3] or "-" for i in order]


def test_fewer_than_k_and_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = soon()
    few = tmp_path / "few.jsonl"
    write(few, [record(0, t0, 0.3, 1.0, True, "a"), record(1, t0, None, 2.0, False, None)])
    s = json.loads(report(few, capsys, "json"))["slowest"]
    assert [x["id"] for x in s["ttft"]] == ["r0"]
    assert [x["id"] for x in s["e2e"]] == ["r1", "r0"]
    assert s["e2e"][0]["upstream_id"] is None
    section = text_section(report(few, capsys, "text"))
    assert [r[8] for r in text_list(section, "by TTFT")] == ["r0"]
    assert [r[8:] for r in text_list(section, "by E2E")] == [["r1", "-"], ["r0", "a"]]

    none = tmp_path / "none.jsonl"
    write_recording(none, [])
    s = json.loads(report(none, capsys, "json"))["slowest"]
    assert s == {"k": SLOWEST, "ttft": [], "e2e": []}
    section = text_section(report(none, capsys, "text"))
    assert section == ["  by TTFT: none (no requests in the recording)",
                       "  by E2E: none (no requests in the recording)"]
    page = report(none, capsys, "html")
    assert "<h2>Slowest requests</h2>" in page and 'class="slowest-' not in page
    assert "By TTFT: none (no requests in the recording)." in page


HOSTILE = "\x1b]0;PWNED\x07<script>alert(1)</script>\u202e"
MARKUP = '<script>alert("x")</script>&amp;<b>'
"""For HTML, markup only: a control character in a user name makes matplotlib warn (a
missing glyph) while drawing the per-user plot, which this suite turns into an error."""


def test_hostile_user_is_shown_safely_in_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    known(path, user=HOSTILE)
    text = report(path, capsys, "text")
    section = text_section(text)
    assert "\\x1b]0;PWNED\\x07<script>alert(1)</script>" in "\n".join(section)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert [r[8] for r in text_list(section, "by TTFT")] == TTFT_ORDER  # still one line each
    s = json.loads(report(path, capsys, "json"))["slowest"]
    assert {x["user"] for x in s["ttft"] + s["e2e"]} == {HOSTILE}  # exact in JSON


def test_markup_in_a_user_name_is_escaped_in_html(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    known(path, user=MARKUP)
    page = report(path, capsys, "html")
    for key in ("ttft", "e2e"):
        tbl = page.split(f'<table class="slowest-{key}">', 1)[1].split("</table>", 1)[0]
        cells = [re.findall(r"<td>(.*?)</td>", tr) for tr in tbl.split("<tr>")[2:]]
        assert [c[1] for c in cells] == [html.escape(MARKUP, quote=True)] * SLOWEST
    assert "<script>" not in page


def test_memory_is_k_rows_and_the_order_is_exact() -> None:
    """Many requests: the heaps hold K each and give exactly the sorted top K (ties by
    start, then by order read)."""
    rnd = random.Random(7)
    recs = []
    for i in range(5000):
        ttft = round(rnd.random(), 2) if i % 3 else None  # many ties; a third no TTFT
        recs.append(dataclasses.replace(
            request(i, 1000.0 + rnd.randrange(50), ttft=0.1), ttft_s=ttft,
            e2e_s=round(rnd.random() * 10, 1)))
    for k in (1, 5, 12):
        s = Slowest(k)
        for r in recs:
            s.add(r)
            assert len(s._ttft) <= k and len(s._e2e) <= k
        d = s.as_dict()
        with_ttft = [(r, n) for n, r in enumerate(recs) if r.ttft_s is not None]
        want = sorted(with_ttft, key=lambda x: (-(x[0].ttft_s or 0), x[0].t_start, x[1]))
        assert [x["id"] for x in d["ttft"]] == [r.id for r, _ in want[:k]]
        want = sorted(enumerate(recs), key=lambda x: (-x[1].e2e_s, x[1].t_start, x[0]))
        assert [x["id"] for x in d["e2e"]] == [r.id for _, r in want[:k]]
    off = Slowest(0)
    for r in recs[:10]:
        off.add(r)
    assert off.as_dict() == {"k": 0, "ttft": [], "e2e": []}


def test_slowest_flag_sets_k_and_0_leaves_the_section_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.jsonl"
    known(path)
    capsys.readouterr()
    assert main(["report", str(path), "--format", "json", "-q", "--slowest", "2"]) == 0
    s = json.loads(capsys.readouterr().out)["slowest"]
    assert s["k"] == 2
    assert [x["id"] for x in s["ttft"]] == TTFT_ORDER[:2]
    assert [x["id"] for x in s["e2e"]] == E2E_ORDER[:2]
    assert main(["report", str(path), "-q", "--slowest", "2"]) == 0
    section = text_section(capsys.readouterr().out)
    assert [r[8] for r in text_list(section, "by E2E")] == E2E_ORDER[:2]

    assert main(["report", str(path), "-q", "--slowest", "0"]) == 0
    text = capsys.readouterr().out
    assert "SLOWEST" not in text and "PER USER" in text and "ERRORS AND TIMEOUTS" in text
    assert "\n\n\n" not in text
    assert main(["report", str(path), "-q", "--slowest", "0", "--format", "html"]) == 0
    assert "Slowest requests" not in capsys.readouterr().out
    assert main(["report", str(path), "-q", "--slowest", "0", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["slowest"] == {"k": 0, "ttft": [], "e2e": []}

    assert main(["report", str(path), "-q", "--slowest", "-1"]) != 0
    assert "--slowest must be 0 or more" in capsys.readouterr().err


def test_a_comparison_shows_them_only_in_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    known(a)
    known(b)
    capsys.readouterr()
    assert main(["report", str(a), str(b), "-q"]) == 0
    assert "SLOWEST" not in capsys.readouterr().out
    assert main(["report", str(a), str(b), "-q", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [[x["id"] for x in r["slowest"]["ttft"]] for r in doc["reports"]] == [TTFT_ORDER] * 2
