"""What a new user reading README.md meets on the command line: each command's ``--help``
says what the command does with the values it is given (found walking the README)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmtop.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = action.choices[name]
    assert isinstance(sub, argparse.ArgumentParser)
    return sub


def _help_of(command: str, flag: str) -> str:
    """The help text of one option, whitespace folded."""
    action = next(a for a in _subparser(command)._actions if flag in a.option_strings)
    return " ".join((action.help or "").split())


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmtop", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env={**os.environ, **(env or {})})


def test_bench_slo_target_help_states_the_range_bench_accepts() -> None:
    """README: ``target`` is a share in (0, 1]; bench refuses 0, so its --help may not say
    "0 to 1" (it did)."""
    assert "(0, 1]" in _help_of("bench", "--slo-target")
    refused = _cli("bench", "http://127.0.0.1:9", "--slo-target", "0", "--requests", "1")
    assert refused.returncode == 2
    assert "(0, 1]" in refused.stderr


@pytest.mark.parametrize("flag", ["--slo-tpot", "--slo-e2e", "--slo-target"])
def test_bench_slo_flag_defaults_name_the_config(flag: str) -> None:
    """bench's description says the --slo-* defaults are the config's (--config,
    LLMTOP_SLO_*), and they are; each flag's own help must say so too, not a
    bare constant."""
    assert "or the config's" in _help_of("bench", flag)
