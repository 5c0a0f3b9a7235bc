"""``run``'s flags for what only the file or the environment could set before:
``--trusted-proxies``, ``--rotate-mb``, ``--rotate-s``, ``--keep``. Their precedence is
every flag's (flag > environment > file > default); a bad value is one line naming the
flag the user typed, not the config key, exit status 2. (Their effect on a real proxy:
tests/proxy/test_run_trusted_proxies_flag.py, tests/recording/test_recording_rotation_flags.py
and tests/scale/test_workers_forwarded.py.)"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from test_qa_config_bounds import RUN, one_error_line, run_cli

from llmtop.cli import build_parser
from llmtop.cli.common import add_config_arguments, config_from_args
from llmtop.config import RUN_FLAGS, Config, env_of, flat_keys, load_config

DAY = "must be at most 86,400 (seconds: a day)"


@pytest.mark.parametrize(("args", "said"), [
    (("--trusted-proxies", "10.0.0.0/8,lb.internal"),
     "--trusted-proxies: 'lb.internal' is not an IP address or network (e.g. 10.0.0.5, "
     "10.0.0.0/8, 2001:db8::/32)"),
    (("--trusted-proxies", "10.0.0.1/8"),
     "--trusted-proxies: '10.0.0.1/8' has bits set past its prefix length: the network is "
     "10.0.0.0/8"),
    (("--trusted-proxies", "fe80::1%eth0"),
     "--trusted-proxies: 'fe80::1%eth0': leave the IPv6 zone (%...) out"),
    (("--rotate-mb", "-1"), "--rotate-mb must be 0 (off) or more, got -1"),
    (("--rotate-mb", "0.001"), "--rotate-mb must be 0 (off) or at least 0.01 (MB, 10 kB: "
                               "each part is a file of its own), got 0.001"),
    (("--rotate-mb", "nan"), "--rotate-mb must be a finite number, got nan"),
    (("--rotate-s", "inf"), "--rotate-s must be a finite number, got inf"),
    (("--rotate-s", "-60"), "--rotate-s must be 0 (off) or more, got -60"),
    (("--rotate-s", "0.5"), "--rotate-s must be 0 (off) or at least 1 (seconds), got 0.5"),
    (("--rotate-s", "86401"), f"--rotate-s {DAY}, got 86401"),
    (("--keep", "-1", "--rotate-s", "60"), "--keep must be 0 (off) or more, got -1"),
    (("--keep", "3"), "--keep needs rotation (--rotate-mb or --rotate-s): without it a "
                      "recording is one file"),
    (("--keep", "3", "--rotate-mb", "0"), "--keep needs rotation (--rotate-mb or --rotate-s): "
                                          "without it a recording is one file"),
])
def test_a_bad_value_is_one_line_naming_the_flag(args: tuple[str, ...], said: str) -> None:
    line = one_error_line(run_cli(*RUN, *args))
    assert line == f"llmtop run: error: {said}"


def test_the_environment_is_still_named_by_its_key() -> None:
    """Only what a flag gave is named by the flag: ``keep`` from the environment is
    ``recording.keep``, as before."""
    line = one_error_line(run_cli(*RUN, env={"LLMTOP_RECORDING_KEEP": "3"}))
    assert line == ("llmtop run: error: recording.keep needs rotation (recording.rotate_mb or "
                    "recording.rotate_s): without it a recording is one file")


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--slo-ttft", "nan", "--slo-ttft must be a finite number above 0, got nan"),
    ("--slo-tpot", "inf", "--slo-tpot must be a finite number above 0, got inf"),
    ("--slo-e2e", "-2", "--slo-e2e must be a finite number above 0, got -2.0"),
    ("--slo-target", "nan", "--slo-target must be in (0, 1], got nan"),
])
def test_a_bad_slo_flag_is_named_by_the_flag(flag: str, value: str, said: str) -> None:
    """(Named so since cad76c1, by the check ``bench`` and ``report`` share; here for the
    flags and values test_qa_cli_sweep does not try.)"""
    assert one_error_line(run_cli(*RUN, flag, value)) == f"llmtop run: error: {said}"


def parsed(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", "--upstream", "http://127.0.0.1:9", *argv])


def test_flag_over_environment_over_file(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "llmtop.toml"
    p.write_text('trusted_proxies = ["10.0.0.0/8"]\n'
                 "[recording]\nrotate_mb = 5\nrotate_s = 60\nkeep = 3\n")

    def seen(*argv: str) -> tuple[list[str], float, float, int]:
        cfg = config_from_args(parsed("--config", str(p), *argv))
        rec = cfg.recording
        return cfg.trusted_proxies, rec.rotate_mb, rec.rotate_s, rec.keep

    assert seen() == (["10.0.0.0/8"], 5.0, 60.0, 3)
    for name, value in (("TRUSTED_PROXIES", "192.168.0.0/16"), ("RECORDING_ROTATE_MB", "7"),
                        ("RECORDING_ROTATE_S", "120"), ("RECORDING_KEEP", "4")):
        monkeypatch.setenv(f"LLMTOP_{name}", value)
    assert seen() == (["192.168.0.0/16"], 7.0, 120.0, 4)
    assert seen("--trusted-proxies", " 127.0.0.1, ::1 ,", "--rotate-mb", "0.5",
                "--rotate-s", "3600", "--keep", "48") == (["127.0.0.1", "::1"], 0.5, 3600.0, 48)
    # '' trusts no balancer, whatever the environment and the file list; 0 turns rotation off
    assert seen("--trusted-proxies", "", "--rotate-mb", "0", "--rotate-s", "0",
                "--keep", "0") == ([], 0.0, 0.0, 0)


def test_the_table_of_flags_is_runs() -> None:
    """:data:`RUN_FLAGS` (what a message names, what the workers are given) holds every
    flag of ``run`` that sets a key, and only those: a flag left out would not reach
    ``--workers N``'s children."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    run_options = {o for a in sub.choices["run"]._actions for o in a.option_strings}
    assert set(RUN_FLAGS.values()) <= run_options
    only = argparse.ArgumentParser()
    add_config_arguments(only)
    declared = {o for a in only._actions for o in a.option_strings}
    assert declared - {"-h", "--help", "--config", "--slo"} == (
        set(RUN_FLAGS.values()) - {"--upstream"})
    assert set(RUN_FLAGS) <= set(flat_keys())


def test_the_help_says_what_each_does_and_its_default() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(sub.choices["run"].format_help().split())
    for says in ("--trusted-proxies LIST the load balancers in front of llmtop",
                 "(default trusted_proxies: none, the connection's address)",
                 "--rotate-mb MB rotate the recording", "(default recording.rotate_mb: 0, off)",
                 "--rotate-s S ...or once a part has been open S seconds",
                 "(default recording.rotate_s: 0, off)",
                 "--keep N with --rotate-mb or --rotate-s, keep the newest N parts",
                 "(default recording.keep: 0, every part)"):
        assert says in text


def test_the_environment_of_a_config_gives_it_back() -> None:
    """:func:`env_of`, how the workers get the command line's values: every key's value
    read back from its variable is the value (lists, None, booleans, floats)."""
    cfg = load_config(None, env={}, overrides={
        "trusted_proxies": ["10.0.0.0/8", "::1"], "gpu.devices": [0, 3],
        "split_observers": True, "slo.tpot_s": 0.025, "slo.ttft_s": None,
        "recording.rotate_mb": 0.01, "recording.rotate_s": 3600.0, "recording.keep": 7,
        "admin_token": "tok", "upstream": "http://127.0.0.1:9/v1"})
    assert cfg != Config()
    assert load_config(None, env=env_of(cfg, flat_keys())) == cfg
