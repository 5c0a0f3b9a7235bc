"""Helpers for the end-to-end tests: the llmtop child process, a byte-recording tee, clients.

Nothing here is mocked: the engine is llama.cpp's ``llama-server`` with a real model, the
proxy is ``llmtop run --headless`` as users start it, the client is the openai SDK (or raw
aiohttp where the test is about bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
from aiohttp import web
from e2e_clock import TimedTransport, WireLog, wire_content_events
from openai import AsyncOpenAI, DefaultAsyncHttpxClient
from views_agree import ADMIN_PREFIX, LISTEN_PREFIX, Announced

ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
USER_HEADER = "X-LLMTOP-User"
ENGINE_INTERVAL_S = 0.25
"""How often llmtop scrapes the engine's /metrics in these tests."""



def load_real_engine() -> ModuleType:
    """``tools/real_engine.py`` (a script, not a package) as a module."""
    name = "llmtop_tools_real_engine"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "real_engine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# -- llmtop run --headless -----------------------------------------------------------------


class LlmtopProcess(Announced):
    """``llmtop run --headless`` in front of ``upstream``, recording to ``record``."""

    def __init__(self, upstream: str, record: Path, extra_env: dict[str, str] | None = None):
        self.record = record
        env = dict(os.environ)
        env.update(
            {
                "LLMTOP_ENGINE_INTERVAL_S": str(ENGINE_INTERVAL_S),
                "LLMTOP_RECORDING_FLUSH_S": "0.1",
                "LLMTOP_GPU_SOURCE": "none",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(extra_env or {})
        self.cmd = [
            sys.executable, "-m", "llmtop", "run",
            "--upstream", upstream,
            "--listen", "127.0.0.1:0",
            "--admin", "127.0.0.1:0",
            "--record", str(record),
            "--headless",
        ]  # fmt: skip
        super().__init__(self.cmd, (LISTEN_PREFIX, ADMIN_PREFIX), env)
        self.proxy_url = self.found[LISTEN_PREFIX]
        self.admin_url = self.found[ADMIN_PREFIX]

    def records(self) -> list[dict[str, Any]]:
        """The ``request`` lines recorded so far (a last line still being written is skipped)."""
        out: list[dict[str, Any]] = []
        try:
            text = self.record.read_text(encoding="utf-8")
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("type") == "request":
                out.append(obj)
        return out

    async def records_for(self, users: list[str], timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """One recorded request per user, in the order of ``users`` (waits for the flush)."""
        deadline = time.monotonic() + timeout_s
        while True:
            by_user = {r["user"]: r for r in self.records() if r.get("user") in users}
            if len(by_user) == len(set(users)):
                return [by_user[u] for u in users]
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"llmtop recorded {len(by_user)} of {len(users)} requests "
                    f"(missing: {sorted(set(users) - by_user.keys())[:5]})"
                )
            await asyncio.sleep(0.1)

    async def snapshot(self, session: aiohttp.ClientSession, window: str = "60") -> dict[str, Any]:
        async with session.get(
            f"{self.admin_url}/llmtop/v1/snapshot", params={"window": window}
        ) as resp:
            assert resp.status == 200, await resp.text()
            data: dict[str, Any] = await resp.json()
            return data


# -- the engine's own view ---------------------------------------------------------------


def parse_prometheus(text: str) -> dict[str, float]:
    """``name value`` lines of a Prometheus exposition without labels (llama.cpp's style)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition(" ")
        try:
            out[name] = float(value.split()[0])
        except (ValueError, IndexError):
            continue
    return out


async def engine_metrics(session: aiohttp.ClientSession, engine_url: str) -> dict[str, float]:
    async with session.get(f"{engine_url}/metrics") as resp:
        assert resp.status == 200
        return parse_prometheus(await resp.text())


async def wait_engine_idle(
    session: aiohttp.ClientSession, engine_url: str, timeout_s: float = 60.0
) -> dict[str, float]:
    """Wait until llama-server processes nothing and defers nothing."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = await engine_metrics(session, engine_url)
        if m.get("llamacpp:requests_processing") == 0 and m.get("llamacpp:requests_deferred") == 0:
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"llama-server still busy after {timeout_s} s: {m}")
        await asyncio.sleep(0.1)


# -- a byte-recording tee between llmtop and the engine -----------------------------------

_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length",
}  # fmt: skip


@dataclass
class TeeExchange:
    """One request that went through the tee: what llmtop sent and what the engine sent back."""

    path: str
    request_body: bytes
    response_body: bytearray = field(default_factory=bytearray)
    status: int = 0


class Tee:
    """A plain pass-through recorder: every byte the engine sends is forwarded as read and
    kept, so a test can compare what llmtop *received* with what its client *received*."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.exchanges: list[TeeExchange] = []
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def start(self) -> str:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body, headers=headers
        ) as upstream:
            if request.path == "/metrics":  # the scraper's polls are not exchanges
                return web.Response(
                    status=upstream.status, body=await upstream.read(),
                    headers={k: v for k, v in upstream.headers.items() if k.lower() not in _HOP},
                )  # fmt: skip
            ex = TeeExchange(request.path, body, status=upstream.status)
            self.exchanges.append(ex)
            resp = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _HOP},
            )
            await resp.prepare(request)
            async for data in upstream.content.iter_any():
                ex.response_body += data
                await resp.write(data)
            await resp.write_eof()
            return resp


# -- SSE helpers (independent of llmtop's parsers) ----------------------------------------


@contextlib.asynccontextmanager
async def teed_llmtop(engine_url: str, record: Path) -> AsyncIterator[tuple[Tee, LlmtopProcess]]:
    """engine ← Tee ← a fresh ``llmtop run`` recording to ``record`` ← client: the tee
    keeps every byte llmtop received; on leaving, llmtop must exit 0."""
    tee = Tee(engine_url)
    await tee.start()
    proc = await asyncio.to_thread(LlmtopProcess, tee.url, record)
    try:
        yield tee, proc
    finally:
        code = await asyncio.to_thread(proc.stop)
        await tee.close()
    assert code == 0, "\n".join(proc.lines)


def sse_events(body: bytes) -> list[bytes]:
    """The ``data:`` payloads of an SSE body whose events end with a blank line."""
    out = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                out.append(line[5:].strip())
    return out


def usage_of(body: bytes) -> dict[str, Any] | None:
    """The last event's ``usage`` object in an OpenAI SSE body (plus llama.cpp's timings)."""
    found: dict[str, Any] | None = None
    for payload in sse_events(body):
        if payload == b"[DONE]":
            continue
        obj = json.loads(payload)
        if obj.get("usage"):
            found = {**obj["usage"], "timings": obj.get("timings")}
    return found


def timings_of(body: bytes) -> dict[str, Any] | None:
    """llama.cpp's ``timings`` object, from whichever event of an SSE body carries it."""
    found: dict[str, Any] | None = None
    for payload in sse_events(body):
        if payload != b"[DONE]" and isinstance(t := json.loads(payload).get("timings"), dict):
            found = t
    return found


def _is_usage_only(block: bytes) -> bool:
    if not block.startswith(b"data: {"):
        return False
    obj = json.loads(block[len(b"data: ") :])
    return obj.get("choices") == [] and bool(obj.get("usage"))


def has_usage_only_event(body: bytes) -> bool:
    """Whether an OpenAI SSE body has a usage-only event (``choices: []`` + ``usage``)."""
    return any(_is_usage_only(block) for block in body.split(b"\n\n"))


def without_usage_only_event(body: bytes) -> bytes:
    """``body`` less its usage-only event (``choices: []`` + ``usage``), byte for byte."""
    return b"\n\n".join(b for b in body.split(b"\n\n") if not _is_usage_only(b))


def llamacpp_without_usage(body: bytes) -> bytes:
    """What llama.cpp sends for ``body`` (a chat stream it answered with
    ``include_usage``) without ``include_usage``, by hand: each usage-only event out, and
    the ``timings`` it carried (its bytes; llama.cpp writes it last) at the end of the
    event just before it — where llama.cpp puts ``timings`` when no usage follows."""
    out: list[bytes] = []
    for block in body.split(b"\n\n"):
        if _is_usage_only(block):
            at = block.find(b',"timings":{')
            if at >= 0:
                prev = out[-1]
                cut = prev.rindex(b"}")
                out[-1] = prev[:cut] + block[at:block.rindex(b"}")] + prev[cut:]
            continue
        out.append(block)
    return b"\n\n".join(out)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0–100)."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 100)) - 1))
    return ordered[rank]


# -- the openai SDK as the client ---------------------------------------------------------

CHAT = [{"role": "user", "content": "Write one short sentence about the sea."}]
PROMPT = "The three primary colours are"


def new_user(tag: str) -> str:
    return f"e2e-{tag}-{uuid.uuid4().hex[:8]}"


WIRE: dict[str, WireLog] = {}
"""user (the ``X-LLMTOP-User`` header) → what the client's HTTP layer saw of that request."""


@dataclass
class ClientRun:
    """What the client saw of one streamed request (wall-clock times).

    ``t_send``, ``chunk_times`` and ``t_end`` are read at the client's HTTP layer (see
    :class:`TimedTransport`); ``sdk_chunk_times``/``sdk_t_end`` are when the SDK handed
    each chunk / the end of the stream to the caller, after its own parsing."""

    user: str
    t_send: float = 0.0
    t_end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    sdk_chunk_times: list[float] = field(default_factory=list)
    sdk_t_end: float = 0.0
    texts: list[str] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    ids: set[str] = field(default_factory=set)
    """The ``id`` of every chunk the SDK gave (the engine's id of the answer)."""

    @property
    def text(self) -> str:
        return "".join(self.texts)


async def sdk_stream(
    client: AsyncOpenAI,
    kind: str,
    *,
    user: str,
    max_tokens: int = 24,
    include_usage: bool | None = None,
    extra_body: dict[str, Any] | None = None,
    prompt: str | None = None,
) -> ClientRun:
    """One streamed chat or legacy completion through the openai SDK (made by
    :func:`openai_client`), timed per chunk at the SDK and at its HTTP layer."""
    common: dict[str, Any] = {
        "model": MODEL,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1,
        "extra_headers": {USER_HEADER: user},
        "extra_body": extra_body,
    }
    if include_usage is not None:
        common["stream_options"] = {"include_usage": include_usage}
    run = ClientRun(user=user)
    if kind == "chat":
        messages = CHAT if prompt is None else [{"role": "user", "content": prompt}]
        chat = await client.chat.completions.create(messages=messages, **common)
        async for chunk in chat:
            now = time.time()
            run.ids.add(chunk.id)
            text = "".join(c.delta.content or "" for c in chunk.choices)
            if text:
                run.sdk_chunk_times.append(now)
                run.texts.append(text)
            if chunk.usage is not None:
                run.usage = {**chunk.usage.model_dump(), **(chunk.model_extra or {})}
    else:
        comp = await client.completions.create(prompt=prompt or PROMPT, **common)
        async for chunk in comp:
            now = time.time()
            run.ids.add(chunk.id)
            text = "".join(c.text or "" for c in chunk.choices)
            if text:
                run.sdk_chunk_times.append(now)
                run.texts.append(text)
            if chunk.usage is not None:
                run.usage = {**chunk.usage.model_dump(), **(chunk.model_extra or {})}
    run.sdk_t_end = time.time()
    wire = WIRE.pop(user)
    assert wire.t_send is not None and wire.t_end is not None, "the HTTP layer saw no request"
    events = wire_content_events(wire.parts)
    # the SDK's content chunks are the body's content events, one for one
    assert [text for _, text in events] == run.texts, (events, run.texts)
    run.t_send, run.t_end = wire.t_send, wire.t_end
    run.chunk_times = [t for t, _ in events]
    return run


def openai_client(base: str) -> AsyncOpenAI:
    """The openai SDK pointed at ``base``, on the SDK's own HTTP client (httpx2) with the
    SDK's defaults, whose transport notes when each request went out and each read came in."""
    http = DefaultAsyncHttpxClient(transport=TimedTransport(USER_HEADER, WIRE))
    return AsyncOpenAI(
        base_url=f"{base}/v1", api_key="e2e-not-a-secret", max_retries=0, http_client=http
    )
