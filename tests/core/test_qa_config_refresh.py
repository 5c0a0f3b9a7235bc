"""``llmtop run --refresh-hz`` and ``tui.refresh_hz`` are checked before anything starts:
in a terminal, ``--refresh-hz -1`` started the proxy, then died with a ValueError traceback
from the TUI (exit 1); ``tui.refresh_hz = 1000`` was taken, where attach and replay stop at
60."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmtop.config import ConfigError, load_config


def run_in_terminal(*args: str) -> tuple[int, str]:
    """Run llmtop with a pseudo-terminal as stdin and stdout (the TUI's case); stderr."""
    leader, follower = os.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "llmtop", *args], stdin=follower,
                             stdout=follower, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        os.close(follower)
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            pytest.fail(f"still running after 30 s: {err}")
    finally:
        os.close(leader)
    return p.returncode, err


@pytest.mark.parametrize("bad", ["-1", "0", "nan", "1000"])
def test_run_refuses_a_bad_refresh_rate_before_starting_the_proxy(bad: str) -> None:
    code, err = run_in_terminal("run", "--upstream", "http://127.0.0.1:9", "--listen",
                                "127.0.0.1:0", "--admin", "127.0.0.1:0", "--refresh-hz", bad)
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"--refresh-hz {float(bad):g} must be in (0, 60]" in lines[0]


def test_headless_refuses_it_too() -> None:
    p = subprocess.run([sys.executable, "-m", "llmtop", "run", "--headless", "--upstream",
                        "http://127.0.0.1:9", "--refresh-hz", "-1"], capture_output=True,
                       text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert p.returncode == 2 and "--refresh-hz -1 must be in (0, 60]" in p.stderr


def test_the_config_key_has_the_same_bound(tmp_path: Path) -> None:
    for bad in ("1000", "0", "-4"):
        with pytest.raises(ConfigError, match=r"tui\.refresh_hz must be in \(0, 60\]"):
            load_config(None, env={"LLMTOP_TUI_REFRESH_HZ": bad})
    assert load_config(None, env={"LLMTOP_TUI_REFRESH_HZ": "60"}).tui.refresh_hz == 60
