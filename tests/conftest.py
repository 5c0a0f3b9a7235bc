"""Shared test configuration. Area-specific fixtures live next to their tests."""

from __future__ import annotations

import os

# The test suite never sends telemetry or looks for a real GPU unless a test asks.
os.environ.setdefault("LLMTOP_GPU_SOURCE", "none")
# API-key pseudonyms use a stored salt (~/.local/state/llmtop/user_salt): the suite keeps
# its own, so running the tests never writes to the home directory
if "LLMTOP_SALT_FILE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _salt_dir = tempfile.mkdtemp(prefix="llmtop-tests-")
    os.environ["LLMTOP_SALT_FILE"] = os.path.join(_salt_dir, "user_salt")
    # (each run left its folder in /tmp: 68 of them here after a day of runs)
    atexit.register(shutil.rmtree, _salt_dir, ignore_errors=True)
