"""Under the TUI, ``llmtop run`` puts its proxy's admin API where headless ``run`` does:
``--admin``, else ``admin`` in the config file or ``LLMTOP_ADMIN`` (documented precedence:
file < environment < flags), else the interface's default 127.0.0.1:8081. (It once took a
free port unless ``--admin`` was on the command line: the config and the environment were
ignored, and Prometheus or ``attach`` pointed at the default found nothing.)"""

from __future__ import annotations

import contextlib
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

from llmtop.cli.common import llmtop_cmd
from llmtop.cli.run import child_command


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def admin_line_in_terminal(args: list[str], env: dict[str, str]) -> str:
    """Start ``llmtop run`` (the TUI) on a pseudo-terminal; the admin address it prints
    before the TUI starts."""
    seen, m = in_terminal(args, env)
    if m is None:
        pytest.fail(f"no admin line: {seen[-2000:]!r}")
    return m


def in_terminal(args: list[str], env: dict[str, str]) -> tuple[str, str | None]:
    """Start ``llmtop run`` (the TUI) on a pseudo-terminal; what it printed until the admin
    line (and that address) or until it exited (and None). ``env``: added to this
    process's, less any LLMTOP_ADMIN it does not give."""
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
                    got = os.read(leader, 65536)
                except OSError:
                    break
                if not got:
                    break
                seen += got
            m = re.search(rb"admin listening on (http://[0-9.:]+)", seen)
            if m:
                return seen.decode(errors="replace"), m[1].decode()
            if p.poll() is not None and not select.select([leader], [], [], 0.2)[0]:
                break
        return seen.decode(errors="replace"), None
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


def test_the_default_admin_address_is_used_under_the_tui() -> None:
    """Nothing names an admin address: the TUI's proxy takes 127.0.0.1:8081, as headless
    ``run`` does. The test holds that port itself (when something else already does, it is
    as busy), so the proxy must say it cannot have it: the same in any environment."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        with contextlib.suppress(OSError):  # taken by another process: busy all the same
            holder.bind(("127.0.0.1", 8081))
            holder.listen()
        seen, url = in_terminal(UPSTREAM, {})
    finally:
        holder.close()
    assert url is None, f"the admin API listened on {url} though 127.0.0.1:8081 was taken"
    assert "admin address 127.0.0.1:8081: Address already in use" in seen, seen[-2000:]


def test_child_command() -> None:
    argv = ["--upstream", "http://x:1"]
    assert child_command(argv) == [*llmtop_cmd("run", *argv), "--headless"]
    assert "--admin" not in child_command(argv)  # the child's own default, as headless
    assert child_command([*argv, "--admin=127.0.0.1:7"]).count("--admin=127.0.0.1:7") == 1
