"""``llmtop sim`` stopped the moment it says it listens exits cleanly. Its signal handlers
went in after the ``listening`` line, so a parent that stopped it as soon as it read the
line (a test, the demo's Ctrl-C during start-up) killed it with the signal's default
action: 12 of 20 such SIGTERMs here, exit -15 instead of 0."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_right_after_the_listening_line_stops_it_cleanly(
        sig: signal.Signals) -> None:
    codes = []
    for _ in range(6):
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmtop", "sim", "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert line.startswith("llmtop: sim listening on http://127.0.0.1:"), (line, err)
        assert "Traceback" not in err, err
        codes.append(proc.returncode)
    assert codes == [0] * 6
