"""bench's clean-up (the GPU source's stop) runs to its end through a Ctrl-C that lands in
it: the run had ended, so the cancel is taken back instead of escaping asyncio.run as a
CancelledError traceback in place of the results."""

from __future__ import annotations

import asyncio

from llmtop.bench.runner import through_cancels


async def test_the_clean_up_ends_and_the_cancels_are_taken_back() -> None:
    gate = asyncio.Event()
    steps: list[str] = []

    async def clean_up() -> None:  # a GPU source joining its thread, say
        steps.append("began")
        await gate.wait()
        await asyncio.sleep(0)
        steps.append("ended")

    async def run() -> str:
        await through_cancels(clean_up())
        return "results"

    task = asyncio.create_task(run())
    await asyncio.sleep(0)
    task.cancel()  # Ctrl-C
    await asyncio.sleep(0)
    task.cancel()  # and again, as the stop goes on
    await asyncio.sleep(0)
    assert steps == ["began"] and not task.done()
    gate.set()
    assert await task == "results"
    assert steps == ["began", "ended"]
    assert task.cancelling() == 0


async def test_the_clean_up_s_own_error_still_comes_out() -> None:
    async def broken() -> None:
        await asyncio.sleep(0)
        raise OSError("NVML shutdown failed")

    try:
        await through_cancels(broken())
    except OSError as exc:
        assert str(exc) == "NVML shutdown failed"
    else:
        raise AssertionError("the clean-up's error was lost")
