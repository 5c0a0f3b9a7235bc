"""One benchmark request, measured as a client sees it.

Times run from the request's **scheduled** send time (open loop: no coordinated omission)
with ``time.perf_counter_ns``; the stream is read with the proxy's own dialect parsers, so
TTFT, chunk times and token counts (``usage`` first, asked for with
``stream_options.include_usage``) mean exactly what they mean for proxied traffic. The
result is a :class:`~llmtop.events.RequestRecord`, the same event the proxy produces.

A failed request's ``error`` reads ``"<kind>: <detail>"`` (``connection refused: …``,
``HTTP 500: …``, ``timeout: …``): :func:`error_kind` gives the kind, which the summary counts.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import socket
import time
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Literal
from urllib.parse import urlsplit

import aiohttp

from llmtop.bench.workload import BenchRequest
from llmtop.events import Outcome, RequestRecord, TokenSource
from llmtop.proxy.dialects.registry import make_parser
from llmtop.proxy.relay import scale_tokens

Api = Literal["chat", "completions"]
_ids = itertools.count(1)


@dataclass
class BenchClient:
    """Sends OpenAI-compatible streaming requests to ``base_url`` (…/v1 is added)."""

    base_url: str
    api: Api = "chat"
    model: str = "default"
    user: str = "bench"
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    ignore_eos: bool = True
    """Ask the engine to generate exactly max_tokens (vLLM, SGLang, llama.cpp, llmtop sim)."""

    def url(self) -> str:
        root = self.base_url.rstrip("/")
        if not root.endswith("/v1"):
            root += "/v1"
        return root + ("/chat/completions" if self.api == "chat" else "/completions")

    def body(self, req: BenchRequest) -> bytes:
        common: dict[str, object] = {
            "model": self.model,
            "max_tokens": req.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
        }
        if self.ignore_eos:
            common["ignore_eos"] = True
        if self.api == "chat":
            common["messages"] = [{"role": "user", "content": req.prompt}]
        else:
            common["prompt"] = req.prompt
        return json.dumps(common).encode()

    async def send(
        self,
        session: aiohttp.ClientSession,
        req: BenchRequest,
        *,
        scheduled_ns: int | None = None,
        concurrency: int = 0,
    ) -> RequestRecord:
        """Send one request; never raises for request failures (they become outcomes)."""
        t0 = perf_counter_ns() if scheduled_ns is None else scheduled_ns
        wall = time.time() - (perf_counter_ns() - t0) / 1e9
        offsets: list[int] = []
        counts: list[int] = []
        status = 0
        outcome: Outcome = "ok"
        error: str | None = None
        parser = make_parser("openai", True, "text/event-stream")
        headers = {"Content-Type": "application/json", "X-LLMTOP-User": self.user,
                   **self.headers}
        try:
            async with session.post(
                self.url(), data=self.body(req), headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as resp:
                status = resp.status
                parser = make_parser("openai", True, resp.content_type)
                async for data in resp.content.iter_any():
                    now = perf_counter_ns()
                    n, toks = parser.feed(data)
                    if n:
                        offsets.append(now)
                        counts.append(toks)
                n, toks = parser.finish()
                if n:
                    offsets.append(perf_counter_ns())
                    counts.append(toks)
                if status >= 400:
                    outcome = "error"
                    error = f"HTTP {status}" + (f": {parser.error}" if parser.error else "")
                elif parser.error:
                    outcome, error = "error", f"stream error: {parser.error}"
        except TimeoutError:
            outcome = "timeout"
            error = f"timeout: no complete response within {self.timeout_s:g} s"
        except aiohttp.ClientError as exc:
            outcome, error = "error", f"{failure_kind(exc)}: {exc}"
        except asyncio.CancelledError:
            outcome, error = "cancelled", "cancelled: benchmark stopped"
            end = perf_counter_ns()
            raise _Cancelled(self._record(t0, wall, end, status, outcome, error, offsets,
                                          counts, parser, req, concurrency)) from None
        end = perf_counter_ns()
        return self._record(t0, wall, end, status, outcome, error, offsets, counts, parser,
                            req, concurrency)

    def _record(self, t0: int, wall: float, end: int, status: int, outcome: Outcome,
                error: str | None, offsets: list[int], counts: list[int], parser: object,
                req: BenchRequest, concurrency: int) -> RequestRecord:
        usage = getattr(parser, "usage_completion_tokens", None)
        prompt = getattr(parser, "usage_prompt_tokens", None)
        source: TokenSource
        if usage is not None:
            counts = scale_tokens(counts, usage)
            completion: int | None = usage
            source = "usage"
        else:
            completion = sum(counts) or None
            source = "chunks"
        return RequestRecord(
            id=f"bench-{next(_ids)}",
            user=self.user,
            model=getattr(parser, "model", None) or self.model,
            dialect="openai",
            path=urlsplit(self.url()).path,
            stream=True,
            status=status,
            outcome=outcome,
            t_start=wall,
            ttft_s=(offsets[0] - t0) / 1e9 if offsets else None,
            e2e_s=(end - t0) / 1e9,
            prompt_tokens=prompt if prompt is not None else req.prompt_tokens_target or None,
            completion_tokens=completion,
            token_source=source,
            chunk_offsets_s=tuple((o - t0) / 1e9 for o in offsets),
            chunk_tokens=tuple(counts),
            concurrency_at_start=concurrency,
            error=error,
        )


def failure_kind(exc: aiohttp.ClientError) -> str:
    """A short name for why a request got no complete answer, for counting and showing."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        os_error = exc.os_error
        if isinstance(os_error, ConnectionRefusedError):
            return "connection refused"
        if isinstance(exc, aiohttp.ClientSSLError):
            return "TLS error"
        if isinstance(exc, aiohttp.ClientConnectorDNSError) or isinstance(os_error,
                                                                          socket.gaierror):
            return "host not found"
        return "cannot connect"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "response cut off"
    if isinstance(exc, aiohttp.ClientOSError) and exc.errno in (errno.ECONNRESET, errno.EPIPE):
        return "connection reset"
    return type(exc).__name__


def error_kind(rec: RequestRecord) -> str:
    """The kind of a failed request's failure: ``HTTP 500``, ``connection refused``,
    ``timeout`` … (the ``error`` text before its first ``": "``)."""
    if rec.outcome == "timeout":
        return "timeout"
    if rec.status >= 400:
        return f"HTTP {rec.status}"
    if rec.error:
        return rec.error.split(": ", 1)[0]
    return rec.outcome


class _Cancelled(asyncio.CancelledError):
    """Cancellation that carries the partial record of the request it interrupted."""

    def __init__(self, record: RequestRecord) -> None:
        super().__init__("benchmark stopped")
        self.record = record
