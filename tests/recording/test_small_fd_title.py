"""``llmtop report <(ssh gpu1 cat today.jsonl.gz)``: the shell hands the report a
descriptor's path (``/dev/fd/63``). The report was titled with its name alone —
"llmtop report — 63" — which names nothing; it now shows the path. A file keeps its
name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rec_helpers import session, write_recording


def _report(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmtop", "report", *args],
                          capture_output=True, text=True, timeout=120, check=True,
                          **kw)  # type: ignore[call-overload]


def test_a_descriptor_is_named_by_its_path_and_a_file_by_its_name(tmp_path: Path) -> None:
    rec = tmp_path / "today.jsonl"
    write_recording(rec, session(40))
    fd = os.open(rec, os.O_RDONLY)
    try:
        piped = _report([f"/dev/fd/{fd}"], pass_fds=(fd,))
    finally:
        os.close(fd)
    assert piped.stdout.splitlines()[0] == f"llmtop report — /dev/fd/{fd}"
    fd = os.open(rec, os.O_RDONLY)
    try:
        as_json = json.loads(_report([f"/dev/fd/{fd}", "--format", "json"],
                                     pass_fds=(fd,)).stdout)
    finally:
        os.close(fd)
    assert as_json["source"]["file"] == f"/dev/fd/{fd}"
    named = _report([str(rec)])
    assert named.stdout.splitlines()[0] == "llmtop report — today.jsonl"
