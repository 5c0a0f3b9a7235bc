"""The report's per-user table tells a user named "other" from the row of every user past
the top N (QA: both read "other"; the snapshot's ``tracked`` told them apart, the report
did not): the fold reads "(others)", as in the TUI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rec_helpers import request, soon, write_recording

from llmtop.cli import main


def test_a_user_named_other_is_not_the_fold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t0 = soon()
    users = ["other"] * 3 + [f"u{i:02d}" for i in range(51)]  # 52 users: 2 past the top 50
    recs = [request(i, t0 + i * 0.05, user=u) for i, u in enumerate(users)]
    path = tmp_path / "r.jsonl"
    write_recording(path, recs)
    capsys.readouterr()
    assert main(["report", str(path), "--format", "json", "-q"]) == 0
    rows = json.loads(capsys.readouterr().out)["users"]
    named = {(u["user"], u["tracked"]): u["requests"] for u in rows if u["user"] == "other"}
    assert named == {("other", True): 3, ("other", False): 2}
    assert main(["report", str(path), "-q"]) == 0
    text = capsys.readouterr().out.split("PER USER", 1)[1].split("\n\n", 1)[0]
    firsts = [line.split()[0] for line in text.splitlines()[1:] if line.strip()]
    assert firsts.count("other") == 1 and firsts.count("(others)") == 1, text
