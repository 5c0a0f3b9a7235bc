"""Fixtures of the recording tests that run real processes: a simulator for the module, a
working folder, and a tap (a proxy-side view of what the simulator served)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from disk_support import Tap, running_tap, workdir
from views_agree import start_sim


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    sim, url = start_sim("--profile", "tiny", "--seed", "7")
    try:
        yield url
    finally:
        sim.stop()


@pytest.fixture
def work() -> Iterator[Path]:
    with workdir() as d:
        yield d


@pytest.fixture
async def tap(sim_url: str) -> AsyncIterator[Tap]:
    async with running_tap(sim_url) as t:
        yield t
