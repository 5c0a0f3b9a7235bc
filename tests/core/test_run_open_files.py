"""``llmtop run`` raises its open-file limit: the common default soft limit of 1,024 would
refuse connections past ~500 streams (each holds a client and an upstream socket)."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

RUN = [sys.executable, "-m", "llmtop", "run", "--headless", "--upstream", "http://127.0.0.1:9",
       "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--gpu-source", "none"]


def _soft_nofile(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no 'Max open files' line")


@pytest.mark.parametrize(("soft", "hard", "said"), [(256, None, False), (256, 1000, True)])
def test_the_soft_limit_is_raised_as_far_as_the_hard_one_allows(
        soft: int, hard: int | None, said: bool) -> None:
    _, cur_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard = cur_hard if hard is None else hard

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    proc = subprocess.Popen(RUN, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lower)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        assert lines[1].startswith("llmtop: admin listening"), lines
        deadline = time.monotonic() + 10
        want = min(65536, hard) if hard != resource.RLIM_INFINITY else 65536
        while _soft_nofile(proc.pid) != want and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _soft_nofile(proc.pid) == want
    finally:
        proc.terminate()
        proc.wait(30)
    with proc.stdout:  # read it, not communicate(timeout=): that skips what readline buffered
        out = proc.stdout.read()
    low = "llmtop: at most 1000 open files (ulimit -n, hard limit 1000): about 468 streams"
    assert (low in out) is said, (lines, out)


@pytest.mark.parametrize(("limit", "said"), [
    (64, "about 24 streams at once"),  # (64 - 64) // 2 said "about 1 streams"; ~20 fit
    (20, "about 7 streams at once"),
])
def test_the_low_limit_line_counts_streams_under_small_limits(limit: int, said: str) -> None:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    p = subprocess.run([sys.executable, "-c", "from llmtop.server import raise_open_files; "
                        "print(raise_open_files())"], capture_output=True, text=True,
                       preexec_fn=lower, timeout=60)
    assert p.stdout.strip() == (f"llmtop: at most {limit} open files (ulimit -n, hard limit "
                                f"{limit}): {said}"), (p.stdout, p.stderr)
