"""``llmtop run`` says it is listening only once nothing left can refuse to start: a script
that waits for the listen line must never see it from a proxy that then exits 2 (QA found
clients served for ~0.3 s by a proxy whose --record path was then refused)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

RUN = [sys.executable, "-m", "llmtop", "run", "--headless", "--upstream", "http://127.0.0.1:9",
       "--listen", "127.0.0.1:0"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RUN, *args], capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["1 process", "2 workers"])
@pytest.mark.parametrize("case", ["exists", "no directory", "a directory", "zstd"])
def test_a_refused_recording_path_stops_start_up_before_the_listen_lines(
        tmp_path: Path, case: str, workers: list[str]) -> None:
    path = {"exists": tmp_path / "old.jsonl", "no directory": tmp_path / "nope" / "r.jsonl",
            "a directory": tmp_path, "zstd": tmp_path / "r.jsonl.zst"}[case]
    if case == "exists":
        path.write_text("keep me\n")
    res = _run("--admin", "127.0.0.1:0", "--record", str(path), *workers)
    assert res.returncode == 2, res
    assert "listening" not in res.stdout
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert {"exists": "file exists", "no directory": "directory does not exist",
            "a directory": "is a directory", "zstd": "not zstd; use a .jsonl.gz name"}[case] \
        in res.stderr
    if case == "zstd":
        assert not path.exists()
    if case == "exists":
        assert path.read_text() == "keep me\n"


def test_an_admin_port_in_use_stops_start_up_before_the_proxy_is_announced() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = _run("--admin", f"127.0.0.1:{port}")
    assert res.returncode == 2, res
    assert "listening" not in res.stdout
    assert f"admin address 127.0.0.1:{port}: Address already in use" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["1 process", "2 workers"])
def test_a_listen_port_in_use_names_the_address(workers: list[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = subprocess.run([*RUN[:-2], "--listen", f"127.0.0.1:{port}", "--admin",
                              "127.0.0.1:0", *workers],
                             capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2, res
    assert f"listen address 127.0.0.1:{port}: Address already in use" in res.stderr
    assert "listening" not in res.stdout and "Traceback" not in res.stderr
