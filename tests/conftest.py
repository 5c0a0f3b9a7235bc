"""Shared test configuration. Area-specific fixtures live next to their tests."""

from __future__ import annotations

import os

# The test suite never sends telemetry or looks for a real GPU unless a test asks.
os.environ.setdefault("LLMTOP_GPU_SOURCE", "none")
