"""The simulator's HTTP server: routes, app lifecycle and :func:`running_sim` for tests.

Routes:

* generation: ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/responses``,
  ``/v1/messages``,
  ``/api/chat``, ``/api/generate``, ``/generate_stream``, ``/generate`` and TGI's ``/``
  (``stream`` true: as ``/generate_stream``; else as ``/generate``, in a one-element list);
  ``/generate`` with an SGLang body answers as SGLang (:mod:`llmtop.sim.sglang_format`);
* ``GET /v1/models``, ``/api/tags``, ``/health``, ``/metrics`` (vLLM names);
* ground truth: ``GET /sim/state``, ``/sim/requests``, ``/sim/gpu``.

Every error is JSON in the API's error shape, those aiohttp itself raises included (404 for
an unknown path, 405 for a wrong method with its ``Allow``, 413 for a body over
:data:`MAX_BODY`): in the shape of the endpoint's dialect on a generation path, else
OpenAI's ``{"error": {"message", "type", "param", "code"}}``, as vLLM answers.

Run the app with ``handler_cancellation=True`` (as :func:`running_sim` and ``llmtop sim``
do) so a client that disconnects while queued is noticed at once, not at the next write.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import hdrs, web
from prometheus_client.registry import CollectorRegistry

from llmtop.listen import start_tcp
from llmtop.sim import handlers, sglang_format
from llmtop.sim.engine import SimEngine
from llmtop.sim.handlers import ENGINE
from llmtop.sim.metrics import CONTENT_TYPE, registry_for, render
from llmtop.sim.profiles import SimProfile, apply_overrides, get_profile

MAX_BODY = 64 * 1024 * 1024
SHUTDOWN_TIMEOUT_S = 2.0
LISTEN_BACKLOG = 4096
"""Connections the kernel may queue before the simulator accepts them (capped by
``net.core.somaxconn``). aiohttp's default, 128, overflowed when a proxy opened ~1,000
upstream connections at once: SYN cookies, some failing, reset fresh connections."""


async def _models(request: web.Request) -> web.Response:
    p = request.app[ENGINE].profile
    return web.json_response({"object": "list", "data": [{
        "id": p.model, "object": "model", "created": int(time.time()),
        "owned_by": "llmtop-sim", "root": p.model, "parent": None,
        "max_model_len": p.max_model_len}]})


async def _tags(request: web.Request) -> web.Response:
    p = request.app[ENGINE].profile
    return web.json_response({"models": [{"name": p.model, "model": p.model,
                                          "size": p.weights_bytes}]})


async def _health(request: web.Request) -> web.Response:
    return web.Response()


async def _metrics(request: web.Request) -> web.Response:
    body = render(request.app[_REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def _state(request: web.Request) -> web.Response:
    return web.json_response(request.app[ENGINE].state())


async def _requests(request: web.Request) -> web.Response:
    return web.json_response(request.app[ENGINE].records())


async def _gpu(request: web.Request) -> web.Response:
    return web.json_response({"gpus": [request.app[ENGINE].gpu()]})


GENERATION_ROUTES: tuple[tuple[str, handlers.Dialect], ...] = (
    ("/v1/chat/completions", handlers.CHAT),
    ("/v1/completions", handlers.COMPLETIONS),
    ("/v1/responses", handlers.RESPONSES),
    ("/v1/messages", handlers.MESSAGES),
    ("/api/chat", handlers.OLLAMA_CHAT),
    ("/api/generate", handlers.OLLAMA_GENERATE),
    ("/generate_stream", handlers.TGI_STREAM),
    ("/generate", handlers.TGI),
    ("/", handlers.TGI_COMPAT),
)
_DIALECT_BY_PATH = dict(GENERATION_ROUTES)
_DROPPED_HEADERS = frozenset({hdrs.CONTENT_TYPE.lower(), hdrs.CONTENT_LENGTH.lower()})


def _http_error(request: web.Request, exc: web.HTTPException) -> web.Response:
    """``exc`` (an aiohttp 4xx/5xx) as a JSON error, its other headers (``Allow``) kept."""
    status = exc.status
    detail = exc.text or ""
    if not detail or detail == f"{status}: {exc.reason}":  # aiohttp's default text
        detail = exc.reason
    detail = detail.strip().rstrip(".")
    message = f"{detail}: {request.method} {request.path}"
    if isinstance(exc, web.HTTPMethodNotAllowed):
        message += f" (allowed: {', '.join(sorted(exc.allowed_methods))})"
    headers = {k: v for k, v in exc.headers.items() if k.lower() not in _DROPPED_HEADERS}
    dialect = _DIALECT_BY_PATH.get(request.path, handlers.CHAT)
    return handlers.error_response(dialect, status, message, headers)


@web.middleware
async def _json_errors(request: web.Request,
                       handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                       ) -> web.StreamResponse:
    """aiohttp's plain-text error answers (``404: Not Found``) as JSON errors."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_error(request, exc)


_REGISTRY: web.AppKey[CollectorRegistry] = web.AppKey("sim_registry", CollectorRegistry)


def make_sim_app(profile: SimProfile, *, firehose: bool = False, seed: int = 0,
                 id_salt: int = 0) -> web.Application:
    """The simulator as an aiohttp application. The engine (``app[ENGINE]``) starts with
    the app and stops on shutdown (unfinished streams are then dropped). ``seed`` fixes
    request ids, output lengths and text; a non-zero ``id_salt`` changes only the ids (a
    process of its own for each of several sharing one port). Serve it with
    ``handler_cancellation=True``."""
    app = web.Application(client_max_size=MAX_BODY, middlewares=[_json_errors])
    engine = SimEngine(profile, firehose=firehose, seed=seed, id_salt=id_salt)
    app[ENGINE] = engine
    app[_REGISTRY] = registry_for(engine)

    async def on_startup(_: web.Application) -> None:
        await engine.start()

    async def on_shutdown(_: web.Application) -> None:
        await engine.stop()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    for path, dialect in GENERATION_ROUTES:
        app.router.add_post(path, sglang_format.generate_endpoint() if path == "/generate"
                            else handlers.endpoint(dialect))
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/api/tags", _tags)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/sim/state", _state)
    app.router.add_get("/sim/requests", _requests)
    app.router.add_get("/sim/gpu", _gpu)
    return app


@dataclass(frozen=True, slots=True)
class SimHandle:
    """A running simulator: ``url`` (``http://HOST:PORT``, no trailing slash), ``engine``
    (ground truth in-process), ``profile``."""

    url: str
    engine: SimEngine
    profile: SimProfile
    host: str
    port: int


def resolve_profile(profile: str | SimProfile, **overrides: Any) -> SimProfile:
    """A profile by name or object, with overrides applied (ValueError when bad)."""
    if isinstance(profile, SimProfile):
        return apply_overrides(profile, **overrides)
    return get_profile(profile, **overrides)


async def start_sim(app: web.Application, host: str, port: int, *, reuse_port: bool = False
                    ) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on host:port (0 = any free port); returns the runner and the port.
    ``reuse_port``: bind with ``SO_REUSEPORT``, so that other processes may serve the same
    port. OSError when the address cannot be bound."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    try:
        bound = await start_tcp(runner, host, port, backlog=LISTEN_BACKLOG,
                                reuse_port=reuse_port or None)
    except BaseException:
        await runner.cleanup()
        raise
    return runner, bound


@asynccontextmanager
async def running_sim(profile: str | SimProfile = "tiny", *, host: str = "127.0.0.1",
                      port: int = 0, firehose: bool = False, seed: int = 0,
                      **overrides: Any) -> AsyncIterator[SimHandle]:
    """Run a simulator on a real socket for the duration of the block::

        async with running_sim("tiny", max_num_seqs=2, time_scale=0.5) as sim:
            client = openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="x")

    ``overrides`` are profile keys (see :data:`llmtop.sim.profiles.OVERRIDABLE`).
    """
    prof = resolve_profile(profile, **overrides)
    app = make_sim_app(prof, firehose=firehose, seed=seed)
    runner, bound = await start_sim(app, host, port)
    url_host = f"[{host}]" if ":" in host else host
    try:
        yield SimHandle(f"http://{url_host}:{bound}", app[ENGINE], prof, host, bound)
    finally:
        await runner.cleanup()
