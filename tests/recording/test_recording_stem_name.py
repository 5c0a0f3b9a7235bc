"""A recording path whose file name is only a suffix (``--record DIR/.jsonl``, a name left
empty in a script): it wrote the hidden file ``DIR/.jsonl`` — with rotation hidden parts,
``DIR/.20261206T140000Z.jsonl`` — that ``ls`` does not show. Now refused: one line naming
where it came from (the flag, else the key) and what to write instead, exit 2, nothing
created; from the admin API or a recorder, a :class:`RecordingError`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmtop.bus import EventBus
from llmtop.recording.errors import RecordingError
from llmtop.recording.writer import Recorder, RecordingController, check_recording_path

ROOT = Path(__file__).resolve().parents[2]
RUN = ("run", "--headless", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0",
       "--admin", "127.0.0.1:0")


def one_error_line(*args: str, env: dict[str, str]) -> str:
    """``llmtop ARGS``' one line on stderr, exit 2, having started nothing."""
    p = subprocess.run([sys.executable, "-m", "llmtop", *args], capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=ROOT,
                       env={**os.environ, **env}, check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and "listening on" not in p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


def _said(where: str, path: Path) -> str:
    ext = ".jsonl.gz" if path.name.endswith(".gz") else ".jsonl"
    return (f"llmtop run: error: {where} {path}: a file name that is only the suffix {ext} "
            f"makes hidden files; write {path.parent / ('NAME' + ext)} (NAME: the host's or "
            "the service's, say)")


@pytest.mark.parametrize("source", ["flag", "environment", "file"])
@pytest.mark.parametrize("name", [".jsonl", ".jsonl.gz"])
def test_a_suffix_only_record_path_is_one_line_exit_2(tmp_path: Path, source: str,
                                                      name: str) -> None:
    """``--record``, ``LLMTOP_RECORDING_PATH`` and the file's ``recording.path`` (with
    rotation, where the parts would be hidden): refused before anything starts, named as
    each bad value is (the flag the user typed, else the key)."""
    path = tmp_path / name
    args: tuple[str, ...] = RUN
    env: dict[str, str] = {}
    if source == "flag":
        args = (*args, "--record", str(path), "--rotate-mb", "1")
    elif source == "environment":
        env = {"LLMTOP_RECORDING_PATH": str(path), "LLMTOP_RECORDING_ROTATE_S": "60"}
    else:
        cfg = tmp_path / "llmtop.toml"
        cfg.write_text(f'[recording]\npath = "{path}"\nrotate_mb = 1\n')
        args = (*args, "--config", str(cfg))
    line = one_error_line(*args, env=env)
    assert line == _said("--record" if source == "flag" else "recording.path", path)
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")]


@pytest.mark.parametrize("rotate", [0, 3000])
def test_a_recorder_refuses_a_suffix_only_path(tmp_path: Path, rotate: int) -> None:
    """What the admin API's ``POST /llmtop/v1/recording`` and the TUI's ``r`` start (the
    controller's check and its start, a recorder): refused, nothing created."""
    path = str(tmp_path / ".jsonl.gz")
    with pytest.raises(RecordingError, match=r"only the suffix \.jsonl\.gz makes hidden files"):
        check_recording_path(path, rotating=bool(rotate))
    ctl = RecordingController(EventBus(), header={}, rotate_bytes=rotate)
    with pytest.raises(RecordingError, match="makes hidden files"):
        ctl.check(path)
    with pytest.raises(RecordingError, match=f"write {tmp_path}/NAME.jsonl.gz"):
        ctl.start(path)
    with pytest.raises(RecordingError, match="makes hidden files"):
        Recorder(tmp_path / "..jsonl", header={}, rotate_bytes=rotate).start()
    assert ctl.status() is None and os.listdir(tmp_path) == []


def test_a_hidden_name_of_its_own_is_still_taken(tmp_path: Path) -> None:
    """A name chosen hidden (``.prod.jsonl``) is a name: its parts are ``.prod.<time>``."""
    rec = Recorder(tmp_path / ".prod.jsonl", header={}, rotate_bytes=3000)
    rec.start()
    st = rec.stop()
    assert st["error"] is None and Path(st["path"]).name.startswith(".prod.2")
