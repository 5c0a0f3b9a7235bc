"""``engine.metrics_url`` and ``gpu.sim_url`` are checked like the upstream: with
``LLMTOP_ENGINE_METRICS_URL=localhost:8000/metrics`` (no scheme) or ``gpu.sim_url =
"nothing"``, ``llmtop run`` started and said nothing; the engine and GPU panels just stayed
empty."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llmtop.config import ConfigError, load_config


@pytest.mark.parametrize("key", ["engine.metrics_url", "gpu.sim_url"])
@pytest.mark.parametrize("bad", ["localhost:8000/metrics", "nothing", "ftp://h/metrics",
                                 "http:///metrics", "http://h:99999/metrics", "http://h:0/"])
def test_a_url_llmtop_polls_must_be_one(key: str, bad: str) -> None:
    env = {"LLMTOP_" + key.upper().replace(".", "_"): bad}
    with pytest.raises(ConfigError, match=rf"^{key} '.*'"):
        load_config(None, env=env)


@pytest.mark.parametrize("good", ["", "http://127.0.0.1:8000/metrics",
                                  "https://engine.example/prom?x=1", "http://[::1]:9400/"])
def test_good_ones_and_empty_pass(good: str) -> None:
    cfg = load_config(None, env={"LLMTOP_ENGINE_METRICS_URL": good,
                                 "LLMTOP_GPU_SIM_URL": good})
    assert cfg.engine.metrics_url == good == cfg.gpu.sim_url


def test_run_says_so_in_one_line() -> None:
    p = subprocess.run([sys.executable, "-m", "llmtop", "run", "--headless", "--upstream",
                        "http://127.0.0.1:9", "--listen", ":0", "--admin", ":0"],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                       env={**os.environ, "LLMTOP_ENGINE_METRICS_URL": "localhost:8000/metrics"})
    assert p.returncode == 2 and "listening on" not in p.stdout, p.stdout + p.stderr
    assert p.stderr.strip().splitlines() == [
        "llmtop run: error: engine.metrics_url 'localhost:8000/metrics' must be an http:// or "
        "https:// URL with a host, e.g. http://127.0.0.1:8000/metrics (empty: the upstream's)"]
