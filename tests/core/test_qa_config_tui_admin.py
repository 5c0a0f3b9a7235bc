"""Under the TUI, ``llmtop run`` put its proxy's admin API on a free port unless ``--admin``
was on the command line: ``admin`` in the config file and ``LLMTOP_ADMIN`` were ignored
(documented precedence: file < environment < flags; a free port only when none says)."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmtop.cli.run import child_command
from llmtop.config import given


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def admin_line_in_terminal(args: list[str], env: dict[str, str]) -> str:
    # env: added to this process's, less any LLMTOP_ADMIN it does not give
    """Start ``llmtop run`` (the TUI) on a pseudo-terminal; the admin address it prints
    before the TUI starts."""
    leader, follower = os.openpty()
    p = subprocess.Popen([sys.executable, "-m", "llmtop", "run", *args], stdin=follower,
                         stdout=follower, stderr=follower,
                         env={**{k: v for k, v in os.environ.items() if k != "LLMTOP_ADMIN"},
                              **env},
                         start_new_session=True)
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 0.5)[0]:
                try:
                    seen += os.read(leader, 65536)
                except OSError:
                    break
            m = re.search(rb"admin listening on (http://[0-9.:]+)", seen)
            if m:
                return m[1].decode()
            if p.poll() is not None:
                break
        pytest.fail(f"no admin line: {seen[-2000:]!r}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        os.close(leader)


UPSTREAM = ["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0"]


def test_the_environments_admin_address_is_used_under_the_tui() -> None:
    port = free_port()
    url = admin_line_in_terminal(UPSTREAM, {"LLMTOP_ADMIN": f"127.0.0.1:{port}"})
    assert url == f"http://127.0.0.1:{port}"


def test_the_config_files_admin_address_is_used_under_the_tui(tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "llmtop.toml"
    cfg.write_text(f'admin = "127.0.0.1:{port}"\n')
    url = admin_line_in_terminal([*UPSTREAM, "--config", str(cfg)], {})
    assert url == f"http://127.0.0.1:{port}"


def test_child_command() -> None:
    argv = ["--upstream", "http://x:1"]
    assert child_command(argv)[-2:] == ["--admin", "127.0.0.1:0"]  # nothing says: a free one
    assert "--admin" not in child_command(argv, admin_configured=True)
    assert child_command([*argv, "--admin=127.0.0.1:7"]).count("--admin=127.0.0.1:7") == 1


def test_given(tmp_path: Path) -> None:
    cfg = tmp_path / "llmtop.toml"
    cfg.write_text('admin = "127.0.0.1:8081"\n[slo]\nttft_s = 1.0\n')
    assert given("admin", cfg, {})  # even when it says the default
    assert given("slo.ttft_s", cfg, {}) and not given("slo.e2e_s", cfg, {})
    assert not given("admin", None, {}) and given("admin", None, {"LLMTOP_ADMIN": "x"})
