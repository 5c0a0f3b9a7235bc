"""The command line: help for every command, exit code 2 and one line for mistakes."""

from __future__ import annotations

import subprocess
import sys

from llmtop.cli import _command_modules, main


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmtop", *args], capture_output=True, text=True, timeout=60
    )


def test_help_lists_commands() -> None:
    p = run_cli("--help")
    assert p.returncode == 0
    assert "COMMAND" in p.stdout
    for mod in _command_modules():
        if not mod.HELP:  # internal commands (e.g. a --workers child) stay out of --help
            assert f" {mod.NAME} " not in p.stdout
            continue
        assert mod.NAME in p.stdout, f"{mod.NAME} missing from --help"
        sub = run_cli(mod.NAME, "--help")
        assert sub.returncode == 0, sub.stderr
        assert "usage: llmtop " + mod.NAME in sub.stdout


def test_help_does_not_import_numpy() -> None:
    """``--help`` of every command builds every parser: none of them may need numpy
    (~60 ms, and a Ctrl-C while it loads is a traceback). ``report`` read its --slowest
    default from a module that imported ``llmtop.events`` and so numpy."""
    code = ("import sys; from llmtop.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('numpy', 'llmtop.events') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_no_command_is_usage_error() -> None:
    assert main([]) == 2


def test_unknown_command_exits_2() -> None:
    p = run_cli("frobnicate")
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    # the public commands only: not the internal _worker
    assert "unknown command 'frobnicate' (choose from run, attach, replay" in p.stderr
    assert "_worker" not in p.stderr


def test_an_unknown_option_is_answered_with_the_commands_own_usage() -> None:
    p = run_cli("run", "--upstream", "http://127.0.0.1:1", "--bogus")
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    # the user sees the options of the command they typed, not llmtop's list of commands
    assert p.stderr.startswith("usage: llmtop run "), p.stderr
    assert p.stderr.rstrip().endswith("llmtop run: error: unrecognized arguments: --bogus")
    p = run_cli("sim", "--listen", "127.0.0.1:0", "stray")
    assert p.returncode == 2
    assert p.stderr.rstrip().endswith("llmtop sim: error: unrecognized arguments: stray")
    p = run_cli("--bogus")
    assert p.returncode == 2
    assert p.stderr.rstrip().endswith("llmtop: error: unrecognized arguments: --bogus")


def test_demo_refuses_a_duration_that_is_not_positive() -> None:
    for bad in ("-1", "0", "nan"):
        p = run_cli("demo", "--headless", "--duration", bad)
        assert p.returncode == 2 and "--duration must be a positive number" in p.stderr


def test_version() -> None:
    p = run_cli("--version")
    assert p.returncode == 0 and p.stdout.startswith("llmtop ")
