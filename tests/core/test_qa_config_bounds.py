"""Durations in the config are bounded: a day at most (a 1e300 s timeout made every
request fail with 'llmtop internal error' and a traceback on stderr), and the ones that may
be 0 are never negative."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmtop.config import (
    DURATION_KEYS,
    MAX_DURATION_S,
    ConfigError,
    env_name,
    flat_keys,
    load_config,
)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmtop", *args], capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})})


RUN = ("run", "--headless", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0",
       "--admin", "127.0.0.1:0")


def one_error_line(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and "listening on" not in p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_a_huge_timeout_in_the_file_is_refused_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "llmtop.toml"
    cfg.write_text("[timeouts]\nidle_s = 1e300\n")
    line = one_error_line(run_cli(*RUN, "--config", str(cfg)))
    assert "timeouts.idle_s must be at most 86,400" in line


def test_a_huge_timeout_in_the_environment_is_refused() -> None:
    line = one_error_line(run_cli(*RUN, env={"LLMTOP_TIMEOUTS_FIRST_BYTE_S": "1e20"}))
    assert "timeouts.first_byte_s must be at most 86,400" in line


def test_a_negative_shutdown_grace_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "llmtop.toml"
    cfg.write_text("[timeouts]\nshutdown_grace_s = -1\n")
    line = one_error_line(run_cli(*RUN, "--config", str(cfg)))
    assert "timeouts.shutdown_grace_s must be 0 or more" in line


def test_every_key_in_seconds_is_bounded() -> None:
    seconds = {k for k in flat_keys() if k.endswith("_s")} - {"tui.window_s"}  # a choice
    assert set(DURATION_KEYS) == seconds
    for key in DURATION_KEYS:
        with pytest.raises(ConfigError, match=rf"{key} must be at most 86,400"):
            load_config(None, env={env_name(key): str(int(MAX_DURATION_S) + 1)})
        load_config(None, env={env_name(key): str(int(MAX_DURATION_S))})  # a day is fine


@pytest.mark.parametrize(("key", "value", "message"), [
    ("warnings.window_s", "0", "must be positive"),
    ("warnings.window_s", "-5", "must be positive"),
    ("warnings.raise_after_s", "-1", "must be 0 or more"),
    ("warnings.clear_after_s", "-0.5", "must be 0 or more"),
])
def test_warning_durations_must_make_sense(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"{key} {message}"):
        load_config(None, env={env_name(key): value})


def test_zero_is_fine_where_it_means_at_once() -> None:
    env = {env_name(k): "0" for k in ("timeouts.shutdown_grace_s", "warnings.raise_after_s",
                                      "warnings.clear_after_s")}
    cfg = load_config(None, env=env)
    assert cfg.timeouts.shutdown_grace_s == 0 and cfg.warnings.raise_after_s == 0


def test_top_users_is_bounded() -> None:
    # LLMTOP_TOP_USERS=99999999 used to start a proxy that took gigabytes within seconds
    # (a row of counters per user in every window), stopped answering its admin API and
    # ignored SIGTERM.
    line = one_error_line(run_cli(*RUN, env={"LLMTOP_TOP_USERS": "99999999"}))
    assert "top_users must be at most 10,000" in line
    with pytest.raises(ConfigError, match="top_users"):
        load_config(None, env={"LLMTOP_TOP_USERS": "10001"})
    assert load_config(None, env={"LLMTOP_TOP_USERS": "10000"}).top_users == 10_000


@pytest.mark.parametrize(("env", "says"), [
    ({"LLMTOP_USER_HEADER": "Bad Header"}, "user_header 'Bad Header' is not a header name"),
    ({"LLMTOP_USER_HEADER": "X-User\n"}, "is not a header name"),
    ({"LLMTOP_GPU_DEVICES": "0,-1"}, "gpu.devices holds -1: GPU indices are 0 to"),
])
def test_a_setting_that_could_never_work_is_refused(env: dict[str, str], says: str) -> None:
    """A user header no client can send (every request then counted as anonymous) and a
    GPU index no GPU has were accepted without a word."""
    line = one_error_line(run_cli(*RUN, env=env))
    assert says in line, line


def test_gpus_minus_one_on_the_command_line_is_refused() -> None:
    line = one_error_line(run_cli(*RUN, "--gpus", "-1"))
    assert "-1" in line and "GPU indices are 0 to" in line, line


def test_a_plain_user_header_and_gpu_list_still_load() -> None:
    cfg = load_config(None, env={"LLMTOP_USER_HEADER": "X-Team_ID.v2",
                                 "LLMTOP_GPU_DEVICES": "0, 3"})
    assert cfg.user_header == "X-Team_ID.v2" and cfg.gpu.devices == [0, 3]


@pytest.mark.parametrize("value", [",", "", " , "])
def test_a_gpu_list_naming_no_gpu_is_refused(value: str) -> None:
    """``--gpus ,`` (or an unset variable) was read as "every GPU", which it does not say."""
    line = one_error_line(run_cli(*RUN, "--gpus", value))
    assert line == (f"llmtop run: error: --gpus '{value}' names no GPU: give indices, e.g. "
                    "0,1 (leave it out for every GPU)")


def test_a_gpu_listed_twice_is_refused() -> None:
    line = one_error_line(run_cli(*RUN, "--gpus", "0,1,0"))
    assert line == "llmtop run: error: gpu.devices lists GPU 0 more than once"
    with pytest.raises(ConfigError, match="lists GPU 3 more than once"):
        load_config(None, env={"LLMTOP_GPU_DEVICES": "3,3"})
