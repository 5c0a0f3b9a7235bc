"""Periodic tasks sleep to a shared grid, so one loop wake-up serves them all."""

from __future__ import annotations

import asyncio

import pytest

from llmtop.ticks import grid_delay


@pytest.mark.parametrize("period", [0.05, 0.1, 0.25, 0.5, 1.0, 0.7])
@pytest.mark.parametrize("now", [0.0, 3.0, 10.3, 10.2999, 1234567.891, 86400.25])
def test_grid_delay_lands_on_the_next_multiple_within_one_period(now: float, period: float
                                                                 ) -> None:
    d = grid_delay(now, period)
    assert 0 < d <= period + 1e-9
    k = (now + d) / period
    assert abs(k - round(k)) < 1e-6  # a multiple of the period


def test_a_point_just_reached_waits_a_whole_period_not_zero() -> None:
    # 10.3 / 0.1 is 102.99999999999999 in floats: the point must count as reached
    assert grid_delay(10.3, 0.1) == pytest.approx(0.1)
    assert grid_delay(41 * 0.25, 0.25) == pytest.approx(0.25)


def test_tasks_with_nested_periods_wake_at_the_same_instants() -> None:
    """A 0.25 s task and a 0.5 s task started at different moments meet on the grid: every
    wake-up of the slower one is a wake-up of the faster one."""

    async def main() -> tuple[list[float], list[tuple[float, float]]]:
        loop = asyncio.get_running_loop()
        fast: list[tuple[float, float]] = []
        slow: list[tuple[float, float]] = []

        async def every(period: float, out: list[tuple[float, float]], n: int) -> None:
            for _ in range(n):
                now = loop.time()
                d = grid_delay(now, period)
                await asyncio.sleep(d)
                out.append((now + d, loop.time()))  # (aimed at, woke)

        t = asyncio.ensure_future(every(0.25, fast, 5))
        await asyncio.sleep(0.07)  # the slow one starts later, off the grid
        await every(0.5, slow, 2)
        await t
        return [woke for _, woke in fast], slow

    fast, slow = asyncio.run(main())
    for aimed, t in slow:
        nearest = min(fast, key=lambda f: abs(f - t))
        assert abs(nearest - t) < 0.02  # the same wake-up (the loop's jitter)
        # aimed at the grid, woken no sooner: how much later is the machine's business (the
        # wake-up itself within 20 ms of the grid failed whenever the process was held then)
        assert abs(aimed / 0.5 - round(aimed / 0.5)) < 1e-6
        assert t >= aimed
