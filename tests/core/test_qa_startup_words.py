"""Start-up refusals in words a user can act on (one line, exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmtop", "run", "--headless", "--upstream",
         "http://127.0.0.1:9", "--admin", "127.0.0.1:0", "--gpu-source", "none", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def test_a_listen_host_that_does_not_resolve_says_so() -> None:
    """It read "Unknown error -2" (the resolver's code through os.strerror)."""
    proc = _run("--listen", "nosuchhost.invalid:18400")
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "host not found" in err[0], proc.stderr
    assert "Unknown error" not in proc.stderr


def test_an_admin_token_no_client_could_send_is_refused() -> None:
    """The admin API strips the header a client sends, not the configured token: a token
    read with its line end could never match, and every client got 401."""
    proc = _run("--listen", "127.0.0.1:0", env={"LLMTOP_ADMIN_TOKEN": "s3cret\n"})
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "admin_token has whitespace at its ends" in err[0], proc.stderr
    assert "s3cret" not in proc.stderr  # the token itself is not repeated


def test_a_misspelt_setting_in_the_environment_is_named() -> None:
    """``LLMTOP_TIMEOUT_IDLE_S`` (for ``LLMTOP_TIMEOUTS_IDLE_S``) was ignored without a
    word: the proxy ran with the default and the user believed the setting held."""
    proc = subprocess.run(
        [sys.executable, "-m", "llmtop", "run", "--headless", "--upstream",
         "http://127.0.0.1:9", "--listen", "no-such-host.invalid:0", "--admin", "127.0.0.1:0",
         "--gpu-source", "none"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "LLMTOP_TIMEOUT_IDLE_S": "5", "LLMTOP_SLO_TTFT_S": "0.5",
             "LLMTOP_BENCH_API_KEY": "k"})
    warned = [ln for ln in proc.stderr.splitlines() if "warning" in ln]
    assert warned == ["llmtop run: warning: LLMTOP_TIMEOUT_IDLE_S is not an llmtop setting "
                      "(did you mean LLMTOP_TIMEOUTS_IDLE_S?); ignored"], proc.stderr


def test_polling_intervals_have_a_floor() -> None:
    """``gpu.interval_s = 1e-6`` was accepted: a busy loop reading NVML (and, for the
    engine's /metrics, a flood of scrapes against the engine)."""
    import pytest

    from llmtop.config import ConfigError, load_config

    for key, bad, good in (("gpu.interval_s", 1e-6, 0.01), ("engine.interval_s", 0.01, 0.1),
                           ("recording.flush_s", 1e-4, 0.01)):
        with pytest.raises(ConfigError, match=f"{key} must be at least"):
            load_config(None, env={}, overrides={key: bad})
        assert load_config(None, env={}, overrides={key: good}) is not None


def test_an_upstream_ending_in_v1_is_pointed_out() -> None:
    """``--upstream http://host:8000/v1`` with clients that send ``/v1/...`` (the OpenAI
    SDK's ``base_url``) sent every request to ``/v1/v1/...``: the engine's 404s, no word
    from llmtop. It still starts as asked (a client that leaves /v1 out is right), but says
    so once; an upstream without /v1 at its end gets no such line."""
    def warnings(upstream: str) -> list[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "llmtop", "run", "--headless", "--upstream", upstream,
             "--listen", "no-such-host.invalid:0", "--admin", "127.0.0.1:0",
             "--gpu-source", "none"],
            capture_output=True, text=True, timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("LLMTOP_")})
        assert proc.returncode == 2, proc.stderr  # (the listen host: it stops there)
        return [ln for ln in proc.stderr.splitlines() if "warning" in ln]

    (line,) = warnings("http://127.0.0.1:9/v1/")
    assert line.startswith("llmtop run: warning: --upstream ends in /v1")
    assert "/v1/v1/chat/completions" in line
    assert warnings("http://127.0.0.1:9/gateway/v1beta") == []
    assert warnings("http://127.0.0.1:9") == []


def test_the_v1_note_names_where_the_upstream_was_given(tmp_path: Path) -> None:
    """It said "--upstream ends in /v1" of an upstream from the config file or the
    environment, where no --upstream was typed (the sim helper's note)."""
    def note(args: list[str], env: dict[str, str]) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "llmtop", "run", "--headless", *args,
             "--listen", "no-such-host.invalid:0", "--admin", "127.0.0.1:0",
             "--gpu-source", "none"],
            capture_output=True, text=True, timeout=60,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("LLMTOP_")},
                 **env})
        assert proc.returncode == 2, proc.stderr
        (line,) = [ln for ln in proc.stderr.splitlines() if "ends in /v1" in ln]
        return line

    conf = tmp_path / "c.toml"
    conf.write_text('upstream = "http://127.0.0.1:9/v1"\n')
    assert note(["--config", str(conf)], {}).startswith(
        f"llmtop run: warning: upstream in {conf} ends in /v1")
    assert note([], {"LLMTOP_UPSTREAM": "http://127.0.0.1:9/v1"}).startswith(
        "llmtop run: warning: LLMTOP_UPSTREAM ends in /v1")
