"""tools/freeze_pytest.py, the runner that pauses a pytest run's process tree the way a
loaded CI machine does: its pauses happen (a test that times its own sleep sees them),
and its exit status is pytest's."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "freeze_pytest.py"


def _run(tmp_path: Path, body: str, *flags: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_target.py").write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(TOOL), *flags, "--", "-q", "-p", "no:cacheprovider",
         str(tmp_path / "test_target.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_the_tree_is_paused_and_the_status_is_pytests(tmp_path: Path) -> None:
    # a child process of the test's sleeps 2 s of wall time in 10-ms steps and reports its
    # longest step: with 300-ms pauses every 0.1-0.2 s, some step spans a pause
    body = """
        import subprocess, sys

        PROBE = (
            "import time\\n"
            "worst = 0.0\\n"
            "end = time.monotonic() + 2.0\\n"
            "while time.monotonic() < end:\\n"
            "    t = time.monotonic(); time.sleep(0.01)\\n"
            "    worst = max(worst, time.monotonic() - t)\\n"
            "print(worst)\\n")

        def test_probe():
            out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True,
                                 text=True, check=True).stdout
            open("worst.txt", "w").write(out)
    """
    r = _run(tmp_path, body, "--freeze", "300", "300", "--gap", "0.1", "0.2", "--seed", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert float((tmp_path / "worst.txt").read_text()) >= 0.25
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("freeze_pytest: ") and last.endswith("pytest exit status 0"), last
    assert int(last.split()[1]) >= 3  # pauses


def test_a_process_the_test_stopped_stays_stopped(tmp_path: Path) -> None:
    """The pauses resume only what they stopped: a worker a test has SIGSTOPped on purpose
    (tests/scale/test_qa_workers.py) was resumed by the next pause's SIGCONT, and its
    test waited 30 s for a report that the worker had stopped."""
    body = """
        import os, signal, subprocess, sys, time

        def state(pid):
            stat = open(f"/proc/{pid}/stat").read()
            return stat[stat.rfind(")") + 2]

        def test_stopped_child():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            try:
                os.kill(child.pid, signal.SIGSTOP)
                while state(child.pid) != "T":
                    time.sleep(0.01)
                end = time.monotonic() + 1.5  # several pauses of the whole tree
                states = set()
                while time.monotonic() < end:
                    states.add(state(child.pid))
                    time.sleep(0.005)
                assert states == {"T"}, states
            finally:
                child.kill()
                child.wait()
    """
    r = _run(tmp_path, body, "--freeze", "50", "50", "--gap", "0.1", "0.2", "--seed", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert int(r.stdout.strip().splitlines()[-1].split()[1]) >= 3  # pauses


def test_a_failing_run_keeps_its_exit_status(tmp_path: Path) -> None:
    r = _run(tmp_path, "def test_fails():\n    assert False\n", "--gap", "5", "5")
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1].endswith("pytest exit status 1")


def test_without_the_separator_it_says_how_to_call_it(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(TOOL), "tests"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("usage: freeze_pytest.py")
