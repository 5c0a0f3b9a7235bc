"""An unknown key in the config file is refused naming it (as before) and, for a near miss,
the key that was meant: ``timeout.idle_s = 5`` said only "unknown key 'timeout'"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmtop.config import ConfigError, load_config


@pytest.mark.parametrize(("text", "unknown", "meant"), [
    ("timeout.idle_s = 5", "timeout", "timeouts"),
    ("[timeout]\nidle_s = 5", "timeout", "timeouts"),
    ("[timeouts]\nidle = 5", "timeouts.idle", "timeouts.idle_s"),
    ('upsteam = "http://127.0.0.1:8000"', "upsteam", "upstream"),
    ("idle_s = 5", "idle_s", "timeouts.idle_s"),  # a section's key at the top
    ("[tui]\nwindow = 10", "tui.window", "tui.window_s"),
])
def test_a_near_miss_names_the_key_meant(tmp_path: Path, text: str, unknown: str,
                                         meant: str) -> None:
    cfg = tmp_path / "llmtop.toml"
    cfg.write_text(text + "\n")
    with pytest.raises(ConfigError) as exc:
        load_config(cfg, env={})
    assert str(exc.value) == (f"{cfg}: unknown key '{unknown}'; did you mean '{meant}'? "
                              "(see config.example.toml)")


def test_nothing_near_suggests_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "llmtop.toml"
    cfg.write_text("zzz = 1\n")
    with pytest.raises(ConfigError, match=r"unknown key 'zzz' \(see config\.example\.toml\)$"):
        load_config(cfg, env={})


def test_run_says_it_in_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "llmtop.toml"
    cfg.write_text("[timeouts]\nidle = 5\n")
    p = subprocess.run([sys.executable, "-m", "llmtop", "run", "--headless", "--upstream",
                        "http://127.0.0.1:9", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [
        f"llmtop run: error: {cfg}: unknown key 'timeouts.idle'; did you mean "
        "'timeouts.idle_s'? (see config.example.toml)"]
