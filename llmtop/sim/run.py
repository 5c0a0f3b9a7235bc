"""Serving the simulator until SIGINT/SIGTERM (what ``llmtop sim`` calls)."""

from __future__ import annotations

import asyncio
import secrets
import sys

from llmtop.sim.profiles import SimProfile
from llmtop.sim.server import make_sim_app, start_sim
from llmtop.stop_signals import stop_signals


class ListenError(Exception):
    """The address could not be bound (in use, not local, no permission)."""


async def serve_forever(profile: SimProfile, host: str, port: int, *, firehose: bool = False,
                        seed: int = 0, reuse_port: bool = False) -> None:
    """Serve the simulator on host:port until SIGINT or SIGTERM, then shut down cleanly
    (open streams are dropped after the engine stops). Prints
    ``llmtop: sim listening on http://HOST:PORT`` (flushed) once bound.

    ``reuse_port``: share the port with other simulators bound the same way (each keeps
    its own engine; the kernel spreads new connections across them). The request ids then
    differ per process (the seed still fixes lengths and text): two processes handing out
    the same id read as one request to whatever joins them by id.

    Raises :class:`ListenError` when the address cannot be bound.
    """
    app = make_sim_app(profile, firehose=firehose, seed=seed,
                       id_salt=secrets.randbits(96) | 1 if reuse_port else 0)
    # the handlers go in before the "listening" line: a parent that stops the simulator as
    # soon as it reads the line (a test, the demo on Ctrl-C) found the signals' default
    # action still in place (killed by SIGTERM, 12 times in 20)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = stop_signals()  # (SIGHUP too, unless nohup ignored it)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            runner, bound = await start_sim(app, host, port, reuse_port=reuse_port)
        except OSError as exc:
            raise ListenError(exc.strerror or str(exc)) from None
        try:
            url_host = f"[{host}]" if ":" in host else host
            print(f"llmtop: sim listening on http://{url_host}:{bound}", flush=True)
            print(f"llmtop sim: profile {profile.name} ({profile.model} on {profile.gpu_name})"
                  + (", firehose" if firehose else ""), file=sys.stderr, flush=True)
            await stop.wait()
        finally:
            await runner.cleanup()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
