"""Choosing and running the GPU source named by ``gpu.source``: auto, nvml, sim or none.

``auto`` uses NVML when it initialises and otherwise carries on without GPU readings; the
handle's :attr:`GpuSourceHandle.message` (also returned by ``start()``) then holds the one
line to show the user, once, as ``"llmtop: " + message`` — the caller prints it; this
module never writes to the terminal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp

from llmtop.config import Config, ConfigError, socket_netloc
from llmtop.events import Event, GpuReading
from llmtop.gpu.backend import GpuBackend, GpuUnavailable
from llmtop.gpu.sampler import GpuSampler
from llmtop.gpu.simsource import SimGpuSource

SourceKind = Literal["nvml", "sim", "none"]


def sim_gpu_url(upstream: str, configured: str = "") -> str:
    """``configured`` if set, else the upstream's origin + ``/sim/gpu`` ("" if neither)."""
    if configured:
        return configured
    u = urlsplit(upstream)
    if not u.scheme or not u.netloc:
        return ""
    return f"{u.scheme}://{socket_netloc(u.netloc)}/sim/gpu"


class GpuSourceHandle:
    """A GPU source, started or not. Call ``start()`` (plain, non-blocking) from the event
    loop and ``await stop()`` (the NVML thread is joined in a worker thread)."""

    def __init__(
        self,
        kind: SourceKind,
        *,
        sampler: GpuSampler | None = None,
        backend: GpuBackend | None = None,
        sim: SimGpuSource | None = None,
        message: str | None = None,
    ) -> None:
        self.kind: SourceKind = kind
        self.message = message
        """One line for the user when GPU readings are off for a reason (else None), e.g.
        ``"no NVIDIA GPU found (NVML: ...); GPU panel disabled"`` — no "llmtop: " prefix."""
        self._sampler = sampler
        self._backend = backend
        self._sim = sim
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def status(self) -> str:
        """One line: "2 GPUs", "1 simulated GPU", "GPU 1 lost", or why there are none."""
        if self._sampler is not None:
            return self._sampler.status
        if self._sim is not None:
            return self._sim.status if not self._stopped else "stopped"
        return self.message or "GPU readings off (gpu.source = none)"

    def latest(self) -> list[GpuReading]:
        """The most recent reading per GPU ([] when there is no source)."""
        if self._sampler is not None:
            return self._sampler.latest()
        if self._sim is not None:
            return self._sim.latest()
        return []

    def start(self) -> str | None:
        """Start sampling (idempotent; the sim source needs a running event loop).
        Returns :attr:`message` — the line to show the user once — or None."""
        if self._sampler is not None and self._sampler.ident is None and not self._stopped:
            self._sampler.start()
        if self._sim is not None and self._task is None and not self._stopped:
            self._task = asyncio.get_running_loop().create_task(
                self._sim.run(), name="llmtop-sim-gpu"
            )
        return self.message

    async def stop(self, join_s: float = 5.0) -> None:
        """Stop sampling and release NVML / the HTTP session; idempotent."""
        self._stopped = True
        if self._sampler is not None:
            if self._sampler.is_alive():
                await asyncio.to_thread(self._sampler.stop, join_s)
            elif self._sampler.ident is None and self._backend is not None:
                self._backend.shutdown()  # never started: release what init opened
        if self._task is not None:
            # (asyncio.wait, not ``await`` under a suppressed CancelledError: a cancel of
            # the task stopping us, come meanwhile, must not be swallowed with the poller's)
            task, self._task = self._task, None
            task.cancel()
            await asyncio.wait([task])


def open_gpu_source(
    cfg: Config,
    publish: Callable[[Event], None],
    *,
    upstream: str,
    nvml: Any = None,
    backend: GpuBackend | None = None,
    session: aiohttp.ClientSession | None = None,
) -> GpuSourceHandle:
    """The GPU source ``cfg.gpu.source`` asks for, not yet started.

    - ``auto``: NVML if it initialises, else no source and ``message`` =
      ``"no NVIDIA GPU found (NVML: <reason>); GPU panel disabled"``.
    - ``nvml``: NVML or :class:`~llmtop.config.ConfigError` naming the reason (exit 2).
    - ``sim``: polls ``cfg.gpu.sim_url`` or the upstream's origin + ``/sim/gpu``.
    - ``none``: no source.

    ``nvml`` (a pynvml-like module) or ``backend`` may be injected (tests, dry runs).
    """
    source = cfg.gpu.source
    if source == "none":
        return GpuSourceHandle("none")
    if source == "sim":
        url = sim_gpu_url(upstream, cfg.gpu.sim_url)
        if not url:
            raise ConfigError("gpu.source 'sim' needs an upstream URL or gpu.sim_url")
        sim = SimGpuSource(url, session, publish, interval_s=cfg.gpu.interval_s)
        return GpuSourceHandle("sim", sim=sim)
    if source not in ("auto", "nvml"):
        raise ConfigError(f"gpu.source '{source}' is not one of auto, nvml, sim, none")
    if backend is None:
        from llmtop.gpu.nvml import NvmlBackend

        backend = NvmlBackend(nvml)
    try:
        backend.init()
    except GpuUnavailable as exc:
        if source == "nvml":
            raise ConfigError(
                f"gpu.source is 'nvml' but NVML is unavailable: {exc.reason}"
            ) from None
        msg = f"no NVIDIA GPU found (NVML: {exc.reason}); GPU panel disabled"
        return GpuSourceHandle("none", message=msg)
    count = backend.device_count()
    missing = [i for i in cfg.gpu.devices if not 0 <= i < count]
    if missing:
        backend.shutdown()
        listed = ",".join(map(str, missing))
        raise ConfigError(
            f"gpu.devices: GPU {listed} not present (NVML sees {count} GPU"
            f"{'s' if count != 1 else ''}, numbered from 0)"
        )
    denied = [i for i in cfg.gpu.devices if not backend.accessible(i)]
    if denied:
        backend.shutdown()
        listed = ",".join(map(str, denied))
        usable = ",".join(str(i) for i in range(count) if backend.accessible(i))
        raise ConfigError(
            f"gpu.devices: GPU {listed} not accessible to this process (NVML: no permission;"
            f" this process may read GPU {usable})"
        )
    sampler = GpuSampler(
        backend, publish, interval_s=cfg.gpu.interval_s, devices=tuple(cfg.gpu.devices)
    )
    return GpuSourceHandle("nvml", sampler=sampler, backend=backend)
