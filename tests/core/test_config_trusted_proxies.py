"""``trusted_proxies``: a list of addresses and CIDR networks from the file or
``LLMTOP_TRUSTED_PROXIES``; a bad entry is one line naming it, exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmtop.config import ConfigError, load_config


def test_from_the_file_and_from_the_environment(tmp_path: Path) -> None:
    assert load_config(None, env={}).trusted_proxies == []  # believe no forwarded field
    p = tmp_path / "llmtop.toml"
    p.write_text('trusted_proxies = ["10.0.0.0/8", "192.168.1.5", "2001:db8::/32"]\n')
    assert load_config(p, env={}).trusted_proxies == ["10.0.0.0/8", "192.168.1.5",
                                                      "2001:db8::/32"]
    env = {"LLMTOP_TRUSTED_PROXIES": " 172.16.0.0/12, ::1 ,"}
    assert load_config(p, env=env).trusted_proxies == ["172.16.0.0/12", "::1"]
    assert load_config(p, env={"LLMTOP_TRUSTED_PROXIES": ""}).trusted_proxies == []


@pytest.mark.parametrize(("toml", "message"), [
    ('trusted_proxies = "10.0.0.1"', "'trusted_proxies' must be a list of strings"),
    ("trusted_proxies = [10]", "'trusted_proxies' must be a list of strings"),
    ('trusted_proxies = ["10.0.0.1", "lb.internal"]',
     "trusted_proxies: 'lb.internal' is not an IP address or network"),
    ('trusted_proxies = ["10.0.0.1/8"]',
     "trusted_proxies: '10.0.0.1/8' has bits set past its prefix length: the network is "
     "10.0.0.0/8"),
])
def test_a_bad_entry_is_named(tmp_path: Path, toml: str, message: str) -> None:
    p = tmp_path / "llmtop.toml"
    p.write_text(toml + "\n")
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config(p, env={})


def test_a_bad_entry_exits_2_with_one_line() -> None:
    env = {**os.environ, "LLMTOP_TRUSTED_PROXIES": "10.0.0.0/8,10.0.0.256"}
    p = subprocess.run([sys.executable, "-m", "llmtop", "run", "--headless",
                        "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0",
                        "--admin", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "trusted_proxies: '10.0.0.256' is not an IP address or network" in lines[0]
