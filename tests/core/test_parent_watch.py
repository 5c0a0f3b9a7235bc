"""``llmtop.parent_watch``: a child watches only the parent that named itself."""

from __future__ import annotations

import os
import subprocess
import sys

from llmtop.parent_watch import ENV, child_env

PROBE = """
import os
from llmtop.parent_watch import ENV, watch_parent
print(watch_parent(interval_s=0.05), ENV in os.environ)
"""


def probe(value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if value is not None:
        env[ENV] = value
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, timeout=60, check=True).stdout.strip()


def test_only_the_real_parent_is_watched_and_the_variable_is_not_passed_on() -> None:
    assert probe(str(os.getpid())) == "True False"  # this process is the probe's parent
    assert probe("1") == "False False"  # init: not a parent to watch
    assert probe(str(os.getpid() + 100000)) == "False False"  # not its parent
    assert probe("x") == "False False"
    assert probe(None) == "False False"


def test_child_env_names_this_process() -> None:
    assert child_env({"A": "1"}) == {"A": "1", ENV: str(os.getpid())}
