"""``--upstream`` pointing at llmtop's own listen (or admin) address is refused at start-up:
each request would be forwarded back into the proxy, again and again (one curl made over
9,000 requests in flight before this check)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from llmtop.config import ConfigError, load_config, reaches_listener


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmtop", *args], capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL)


def test_run_refuses_an_upstream_that_is_its_own_listen_address() -> None:
    port = free_port()
    p = run_cli("run", "--headless", "--upstream", f"http://127.0.0.1:{port}/v1",
                "--listen", f"127.0.0.1:{port}", "--admin", "127.0.0.1:0")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    assert "listening on" not in p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "is llmtop's own listen address" in lines[0] and "loop" in lines[0]


def test_the_default_listen_address_counts() -> None:
    """No --listen: the default 127.0.0.1:8080 is the proxy's address."""
    with pytest.raises(ConfigError, match=r"own listen address 127\.0\.0\.1:8080"):
        load_config(None, env={}, overrides={"upstream": "http://127.0.0.1:8080"})
    with pytest.raises(ConfigError, match=r"own admin address 127\.0\.0\.1:8081"):
        load_config(None, env={}, overrides={"upstream": "http://localhost:8081"})


@pytest.mark.parametrize(("url", "host", "port"), [
    ("http://127.0.0.1:9000", "127.0.0.1", 9000),
    ("http://localhost:9000/v1", "127.0.0.1", 9000),
    ("http://LOCALHOST:9000", "::1", 9000),
    ("http://127.0.0.1:9000", "0.0.0.0", 9000),
    ("http://[::1]:9000", "::", 9000),
    ("http://[::1]:9000", "[::1]", 9000),
    ("http://127.0.0.1", "127.0.0.1", 80),
    ("https://127.0.0.1", "127.0.0.1", 443),
    (f"http://{socket.gethostname()}:9000", "0.0.0.0", 9000),
])
def test_loops_are_recognised(url: str, host: str, port: int) -> None:
    assert reaches_listener(url, host, port)


@pytest.mark.parametrize(("url", "host", "port"), [
    ("http://127.0.0.1:9001", "127.0.0.1", 9000),  # another port
    ("http://127.0.0.1:9000", "127.0.0.1", 0),  # port not chosen yet: cannot tell
    ("http://gpu-box:9000", "0.0.0.0", 9000),  # another machine (no DNS asked)
    ("http://192.0.2.77:9000", "0.0.0.0", 9000),  # not an address of this machine
    ("http://[::1]:9000", "127.0.0.1", 9000),  # another loopback address
    ("http://127.0.0.1:80", "127.0.0.1", 443),
])
def test_other_upstreams_are_not_loops(url: str, host: str, port: int) -> None:
    assert not reaches_listener(url, host, port)


def test_an_upstream_on_another_port_still_loads() -> None:
    cfg = load_config(None, env={}, overrides={"upstream": "http://127.0.0.1:8000",
                                                "listen": "0.0.0.0:8080"})
    assert cfg.upstream == "http://127.0.0.1:8000"
