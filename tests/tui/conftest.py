"""Fixtures the TUI tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from tui_support import RealAdmin


@pytest.fixture
async def admin() -> AsyncIterator[RealAdmin]:
    """A real admin API on 127.0.0.1 (port 0) serving the snapshots a test sets."""
    srv = RealAdmin()
    await srv.start()
    yield srv
    await srv.stop()
