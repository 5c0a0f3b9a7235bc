"""``llmtop run`` (the TUI) gave its own admin client only ``--admin-token``: with the token
in ``LLMTOP_ADMIN_TOKEN`` or ``admin_token`` in the config, the proxy child required it
and the TUI sent none, so it showed 'DISCONNECTED — retrying (HTTP 401: the admin token
was refused)' for as long as it ran."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from llmtop.cli import main
from llmtop.cli import run as run_cmd


def token_given_to_the_tui(monkeypatch: pytest.MonkeyPatch, *argv: str) -> str:
    seen: list[str] = []

    def fake_tui(args: argparse.Namespace, refresh_hz: float, window_s: int | None,
                 token: str = "") -> int:
        seen.append(token)
        return 0

    monkeypatch.setattr(run_cmd, "_with_tui", fake_tui)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert main(["run", "--upstream", "http://127.0.0.1:9", *argv]) == 0
    return seen[0]


def test_the_environments_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMTOP_ADMIN_TOKEN", "from-env")
    assert token_given_to_the_tui(monkeypatch) == "from-env"
    assert token_given_to_the_tui(monkeypatch, "--admin-token", "flag") == "flag"


def test_the_config_files_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LLMTOP_ADMIN_TOKEN", raising=False)
    cfg = tmp_path / "llmtop.toml"
    cfg.write_text('admin_token = "from-file"\n')
    assert token_given_to_the_tui(monkeypatch, "--config", str(cfg)) == "from-file"
    assert token_given_to_the_tui(monkeypatch) == ""
