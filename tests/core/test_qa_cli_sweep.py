"""A sweep of hostile values through the real command line: each mistake is one line on
stderr and exit status 2, never a traceback, a hang or a value taken silently."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_qa_config_bounds import RUN, one_error_line, run_cli

UNREADABLE = "/proc/self/mem"
"""A file that opens and then fails every read with EIO (as a failing disk or a lost NFS
server does); as root, a mode-000 file would still be read."""


@pytest.mark.parametrize("command", [("report",), ("export", "--hlog", "-"), ("replay",)])
def test_a_recording_that_fails_to_read_is_one_line(command: tuple[str, ...]) -> None:
    line = one_error_line(run_cli(*command, UNREADABLE))
    assert line == f"llmtop {command[0]}: error: {UNREADABLE}: cannot read: Input/output error"


@pytest.mark.parametrize("command", [RUN, ("bench", "http://127.0.0.1:9", "--requests", "1")])
def test_a_config_file_that_fails_to_read_is_one_line(command: tuple[str, ...]) -> None:
    line = one_error_line(run_cli(*command, "--config", UNREADABLE))
    assert line == (f"llmtop {command[0]}: error: {UNREADABLE}: cannot read: "
                    "Input/output error")


@pytest.mark.parametrize("toml", ['upstream_ca = "ca\\u0000.pem"\n',
                                  '[recording]\npath = "r\\u0000.jsonl"\n'])
def test_a_nul_in_a_config_path_is_one_line(tmp_path: Path, toml: str) -> None:
    cfg = tmp_path / "llmtop.toml"
    cfg.write_text(toml)
    key = "upstream_ca" if "upstream_ca" in toml else "recording.path"
    line = one_error_line(run_cli(*RUN, "--config", str(cfg)))
    assert line == f"llmtop run: error: {cfg}: '{key}' holds a NUL character (\\u0000)"


BENCH = ("bench", "http://127.0.0.1:9", "--requests", "1")


@pytest.mark.parametrize(("flag", "said"), [
    ("--workload", "workload file path is empty"),
    ("--admin", "--admin: '' is not an admin URL (expected http://HOST:PORT)"),
])
def test_bench_refuses_an_empty_path_or_url(flag: str, said: str) -> None:
    """``--workload ''`` (an unset variable) ran synthetic prompts, and ``--admin ''`` ran
    without GPU readings, both without a word."""
    line = one_error_line(run_cli(*BENCH, flag, ""))
    assert line == f"llmtop bench: error: {said}"


def test_bench_workload_that_is_not_a_regular_file_is_not_called_missing() -> None:
    line = one_error_line(run_cli(*BENCH, "--workload", "/dev/null"))
    assert line == "llmtop bench: error: workload file /dev/null is not a regular file"


@pytest.mark.parametrize("command", [("attach",), (*BENCH, "--admin")])
def test_an_admin_url_with_port_0_is_refused(command: tuple[str, ...]) -> None:
    """Port 0 is where a proxy asked for a free port, not one it listens on: attach showed
    DISCONNECTED for ever (bench: 'connection refused' after a wait)."""
    line = one_error_line(run_cli(*command, "127.0.0.1:0"))
    assert "admin URL '127.0.0.1:0': port 0 is not a port to connect to" in line


@pytest.mark.parametrize(("token", "via_env"), [("s3cret\r", True), ("s3\ncret", False),
                                                ("s3cret\x1b", False)])
def test_attach_refuses_a_token_with_a_control_character(token: str, via_env: bool) -> None:
    """Such a token cannot go in a header (a CR from a CRLF token file, say): the request
    was never sent and the screen read 'reply is not JSON' for ever."""
    p = (run_cli("attach", "127.0.0.1:8081", env={"LLMTOP_ADMIN_TOKEN": token}) if via_env
         else run_cli("attach", "127.0.0.1:8081", "--token", token))
    line = one_error_line(p)
    assert line == ("llmtop attach: error: an admin token has a control character (a line "
                    "end from a token file?): no proxy could receive it; remove it")


def test_bench_refuses_an_admin_token_with_a_control_character() -> None:
    """bench sends the token to --admin as attach does: a CR from a CRLF token file made
    every admin request fail to be sent."""
    p = run_cli("bench", "http://127.0.0.1:9", "--requests", "1", "--admin", "127.0.0.1:8081",
                env={"LLMTOP_ADMIN_TOKEN": "s3cret\r"})
    assert one_error_line(p) == ("llmtop bench: error: LLMTOP_ADMIN_TOKEN has a control "
                                 "character (a line end from a token file?): no proxy could "
                                 "receive it; remove it")


@pytest.mark.parametrize(("args", "said"), [
    (("run", "--headless", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1\n:0"),
     "llmtop run: error: listen '127.0.0.1\\x0a:0' must be HOST:PORT"),
    (("report", "rec\x1b[2J.jsonl"), "llmtop report: error: rec\\x1b[2J.jsonl: no such file"),
])
def test_a_control_character_in_a_value_stays_on_the_one_line(args: tuple[str, ...],
                                                               said: str) -> None:
    """The value is quoted back with its newline or ESC shown as an escape: it split the
    error in two lines, or reached the terminal as a control sequence."""
    line = one_error_line(run_cli(*args))
    assert line.startswith(said)
    assert "\x1b" not in line


@pytest.mark.parametrize(("flag", "what"), [("--parquet", "directory"),
                                             ("--hlog", "file name, or -")])
def test_export_refuses_an_empty_output(tmp_path: Path, flag: str, what: str) -> None:
    rec = tmp_path / "s.jsonl"
    rec.write_text('{"type": "header", "format": "llmtop-recording", "version": 1}\n')
    line = one_error_line(run_cli("export", str(rec), flag, ""))
    assert line == f"llmtop export: error: {flag} '' is empty: give a {what}"


def test_report_refuses_an_empty_output(tmp_path: Path) -> None:
    """``-o ''`` printed the report to stdout, as if -o had not been given."""
    rec = tmp_path / "s.jsonl"
    rec.write_text('{"type": "header", "format": "llmtop-recording", "version": 1}\n')
    line = one_error_line(run_cli("report", str(rec), "-o", ""))
    assert line == ("llmtop report: error: -o '' is empty: give a file name, or leave -o out "
                    "for standard output")


@pytest.mark.parametrize("command", [RUN, BENCH])
@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--slo-ttft", "nan", "--slo-ttft must be a finite number above 0, got nan"),
    ("--slo-itl-p95", "-1", "--slo-itl-p95 must be a finite number above 0, got -1.0"),
    ("--slo-e2e", "1e9", "--slo-e2e must be at most 86,400 (seconds: a day), got 1e+09"),
    ("--slo-target", "1.5", "--slo-target must be in (0, 1], got 1.5"),
])
def test_a_bad_single_slo_flag_is_named(command: tuple[str, ...], flag: str, value: str,
                                        said: str) -> None:
    """``run --slo-ttft nan`` named the config key ('slo.ttft_s'), which the user never
    typed, and ``run``, ``bench`` and ``report`` each worded the bound their own way; all
    three now share one check that names the flag."""
    line = one_error_line(run_cli(*command, flag, value))
    assert line == f"llmtop {command[0]}: error: {said}"
