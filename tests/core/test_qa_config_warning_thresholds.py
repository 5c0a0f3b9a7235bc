"""The saturation warnings' thresholds must be on their scale: ``kv_cache_usage = 95`` (a
percent where a fraction belongs) was taken and KV_CACHE could never fire; ``bandwidth_pct
= 0.8`` (a fraction where a percent belongs) fired BANDWIDTH at 0.8 %; 0 or a negative
share fired always."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmtop.config import ConfigError, load_config


@pytest.mark.parametrize("key", ["kv_cache_usage", "gpu_memory", "error_rate"])
@pytest.mark.parametrize("bad", ["95", "1.5", "0", "-0.1"])
def test_fractions_are_fractions(key: str, bad: str) -> None:
    env = {f"LLMTOP_WARNINGS_{key.upper()}": bad}
    with pytest.raises(ConfigError, match=rf"warnings\.{key} must be a fraction .*not a percent"):
        load_config(None, env=env)


@pytest.mark.parametrize("bad", ["0.8", "0", "101", "-5"])
def test_bandwidth_is_a_percent(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"warnings\.bandwidth_pct must be a percent"):
        load_config(None, env={"LLMTOP_WARNINGS_BANDWIDTH_PCT": bad})


def test_the_edges_are_fine() -> None:
    cfg = load_config(None, env={"LLMTOP_WARNINGS_KV_CACHE_USAGE": "1",
                                 "LLMTOP_WARNINGS_ERROR_RATE": "0.001",
                                 "LLMTOP_WARNINGS_BANDWIDTH_PCT": "100"})
    assert (cfg.warnings.kv_cache_usage, cfg.warnings.bandwidth_pct) == (1.0, 100.0)


def test_run_says_so_in_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "llmtop.toml"
    cfg.write_text("[warnings]\nkv_cache_usage = 95\n")
    p = subprocess.run([sys.executable, "-m", "llmtop", "run", "--headless", "--upstream",
                        "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--admin",
                        "127.0.0.1:0", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "listening on" not in p.stdout and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [
        "llmtop run: error: warnings.kv_cache_usage must be a fraction more than 0 and at "
        "most 1 (e.g. 0.95, not a percent), got 95"]
