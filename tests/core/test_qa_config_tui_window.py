"""``tui.window_s`` (config.example.toml: "Initial window: 10, 60, 300, or 0 for the whole
session") was read, never checked and never used: ``llmtop run`` opened the TUI on 60 s
whatever it said, and ``window_s = 7`` was taken without a word."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from llmtop.cli import main
from llmtop.cli import run as run_cmd
from llmtop.config import ConfigError, load_config
from llmtop.tui.snapview import WINDOWS


@pytest.mark.parametrize(("value", "window"), [("10", 10), ("300", 300), ("0", None)])
def test_run_opens_the_tui_on_the_configured_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, window: int | None
) -> None:
    cfg = tmp_path / "llmtop.toml"
    cfg.write_text(f"[tui]\nwindow_s = {value}\nrefresh_hz = 2.0\n")
    seen: dict[str, object] = {}

    def fake_tui(args: argparse.Namespace, refresh_hz: float, window_s: int | None,
                 token: str = "") -> int:
        seen.update(refresh_hz=refresh_hz, window_s=window_s)
        return 0

    monkeypatch.setattr(run_cmd, "_with_tui", fake_tui)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert main(["run", "--upstream", "http://127.0.0.1:9", "--config", str(cfg)]) == 0
    assert seen == {"refresh_hz": 2.0, "window_s": window}
    assert window in WINDOWS


@pytest.mark.parametrize("bad", ["7", "-60", "3600"])
def test_a_window_the_tui_does_not_have_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match=rf"tui\.window_s must be 10, 60, 300 or 0 .*got {bad}"):
        load_config(None, env={"LLMTOP_TUI_WINDOW_S": bad})
