"""QA findings on ``llmtop demo``: its traffic driver and its command line."""

from __future__ import annotations

import socket
import subprocess
import sys

from aiohttp import web

from llmtop.demo.driver import RampPlan, drive


async def test_driver_backs_off_when_the_proxy_answers_errors() -> None:
    """When the simulator dies the proxy answers 502 at once; the driver's workers resent
    in a tight loop (37,000 requests in 9 s in a demo, the proxy at 50 % CPU). Each worker
    now pauses after a failure, as it already did after a connection error."""
    hits = 0

    async def bad_gateway(request: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        return web.json_response({"error": "upstream gone"}, status=502)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", bad_gateway)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        stats = await drive(f"http://127.0.0.1:{port}", RampPlan(peak=2, period_s=0.5),
                            duration_s=1.2)
    finally:
        await runner.cleanup()
    assert stats.ok == 0
    assert stats.failed >= 1
    # at most 2 workers × (1.2 s ÷ 0.5 s back-off + 1) requests
    assert hits <= 8, hits


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmtop", "demo", "--headless",
                           "--record", "", "--duration", "5", *args],
                          capture_output=True, text=True, timeout=60)


def test_demo_on_a_busy_port_is_a_usage_error() -> None:
    """A busy --listen port made the demo exit 1 (the proxy's own exit 2 was not passed
    on); it is bad command-line input like the others: one line and exit 2."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = _demo("--listen", f"127.0.0.1:{port}")
    assert r.returncode == 2, r.stderr
    assert "the proxy did not start" in r.stderr
    assert "Traceback" not in r.stderr


def test_demo_refuses_a_peak_it_cannot_run_and_an_endless_period() -> None:
    """--peak 1000000000 started a billion driver tasks (memory grew, nothing was sent);
    --period inf ran at concurrency 1 for ever."""
    for args, word in ((("--peak", "1000000000"), "--peak"), (("--period", "inf"), "--period")):
        r = _demo(*args)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().count("\n") == 0 and word in r.stderr, r.stderr
