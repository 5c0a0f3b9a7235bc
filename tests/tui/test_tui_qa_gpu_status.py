"""QA: the GPU panel follows the GPU source's status line.

The panel redraws only when a snapshot's fields it reads change, and its list left out
``gpu_status``: on a machine without a GPU, the first snapshot said "starting" (no
readings yet) and the panel said "n/a (starting)" for good, though the next snapshots
said why there were no readings; nor did "GPU 1 lost" show while the readings kept
their last values."""

from __future__ import annotations

from tui_support import FIXED_NOW, AdminServer, screen_text, until, until_fetched

from llmtop.tui.app import LlmtopApp
from llmtop.tui.source import AdminSource


async def test_the_gpu_status_line_is_followed() -> None:
    srv = AdminServer("low_load")
    srv.snapshot["gpus"] = []
    srv.snapshot["gpu_status"] = "starting"
    await srv.start()
    try:
        app = LlmtopApp(AdminSource([srv.url]), refresh_hz=0, clock=lambda: FIXED_NOW)
        async with app.run_test(size=(160, 40)) as pilot:
            await until_fetched(pilot, lambda: "n/a (starting)" in screen_text(app),
                                what="starting")
            srv.snapshot["gpu_status"] = "no NVIDIA GPU found"
            assert await app.refresh_now()
            await until(pilot, lambda: "n/a (no NVIDIA GPU found)" in screen_text(app),
                        what="the reason")
            srv.snapshot["gpus"] = [{"index": 0, "name": "H100", "util_gpu": 50.0}]
            srv.snapshot["gpu_status"] = "1 GPU"
            assert await app.refresh_now()
            await until(pilot, lambda: "util 50%" in screen_text(app), what="a reading")
            srv.snapshot["gpu_status"] = "GPU 0 lost: NVML error"  # the readings stay
            assert await app.refresh_now()
            await until(pilot, lambda: "GPU 0 lost: NVML error" in screen_text(app),
                        what="the trouble")
    finally:
        await srv.stop()
