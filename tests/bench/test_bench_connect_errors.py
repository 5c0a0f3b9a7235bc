"""llmtop bench names why it could not connect as the TUI does (llmtop.net_errors): a
closed port on ``localhost`` counts as "connection refused" also when the name has two
addresses and their failures come back joined into one error without an errno (asyncio's
own connect, used by aiohttp < 3.10) — it used to count as "cannot connect"."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from typing import Any

import aiohappyeyeballs
import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from llmtop.bench.client import BenchClient, failure_kind
from llmtop.bench.loadgen import FailureWatch, run_closed
from llmtop.bench.summary import summarize
from llmtop.bench.workload import Length, Workload
from llmtop.config import load_config


def closed_port() -> int:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class BothLoopbacks(AbstractResolver):
    """Every name is ``::1`` and ``127.0.0.1``, as ``localhost`` is on many machines."""

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        return [ResolveResult(hostname=host, host=ip, port=port, family=fam, proto=0,
                              flags=socket.AI_NUMERICHOST)
                for ip, fam in (("::1", socket.AF_INET6), ("127.0.0.1", socket.AF_INET))]

    async def close(self) -> None:
        pass


async def test_cli_localhost_closed_port_counts_connection_refused() -> None:
    """``llmtop bench http://localhost:<closed port>``: exit 1 and one line saying every
    request was refused (not "cannot connect")."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", "bench", f"http://localhost:{closed_port()}",
        "--concurrency", "1", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 1, err
    # --json still gives a script its document: the level, its failures by kind, why it stopped
    # (the level gave up within its warm-up: its refusals are warm-up requests, counted in
    # `stopped`, not among the measured ones)
    doc = json.loads(out)
    assert doc["best"] is None and doc["steps"][0]["ok"] == 0 and doc["steps"][0]["gave_up"]
    assert "succeeded" in doc["stopped"] and "connection refused" in doc["stopped"]
    last = err.decode().strip().splitlines()[-1]
    assert "succeeded" in last and "connection refused" in last, last
    assert "cannot connect" not in last


async def test_refused_on_two_addresses_joined_without_errno_counts_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Real connects to ::1 and 127.0.0.1, both refused, reported the way asyncio's own
    create_connection (aiohttp < 3.10) reports them: ``OSError("Multiple exceptions:
    [Errno 111] …, [Errno 111] …")`` with no errno. Every failure counts as refused."""
    real = aiohappyeyeballs.start_connection
    joined: list[str] = []

    async def without_errno(*args: Any, **kwargs: Any) -> socket.socket:
        try:
            return await real(*args, **kwargs)
        except OSError as exc:
            if "Multiple exceptions" not in str(exc):
                raise
            joined.append(str(exc))
            raise OSError(str(exc)) from None  # the errno dropped, as asyncio does

    monkeypatch.setattr(aiohttp.connector, "DefaultResolver", BothLoopbacks)
    monkeypatch.setattr(aiohappyeyeballs, "start_connection", without_errno)
    client = BenchClient(f"http://localhost:{closed_port()}")
    workload = Workload(prompt_tokens=Length(16, 16), max_tokens=Length(4, 4), seed=1)
    run = await run_closed(client, workload, 1, duration_s=10.0,
                           watch=FailureWatch(failures=3, after_s=0.1))
    assert joined and "[Errno 111]" in joined[0]
    s = summarize(run, load_config(None, env={}, overrides={}))
    assert s.errors > 0 and s.ok == 0
    assert s.error_kinds == {"connection refused": s.errors}


def test_tls_failures_are_told_apart() -> None:
    """The bench's kinds for TLS are the TUI's: an untrusted certificate and a failed
    handshake are different fixes (trust the CA; use http://)."""
    from aiohttp.client_reqrep import ConnectionKey
    key = ConnectionKey("127.0.0.1", 8443, True, True, None, None, None)
    cert = aiohttp.ClientConnectorCertificateError(key, ValueError("self-signed"))
    shake = aiohttp.ClientConnectorSSLError(key, OSError(1, "WRONG_VERSION_NUMBER"))
    assert failure_kind(cert) == "TLS certificate not trusted"
    assert failure_kind(shake) == "TLS handshake failed"


async def test_a_target_that_drops_packets_fails_at_the_connect_timeout() -> None:
    """A target whose SYNs are dropped (down, firewalled): each request waited the whole
    --timeout (600 s by default) before it counted, so --requests 3 took 30 minutes to say
    nothing succeeded. Connecting now has the config's timeouts.connect_s, as the proxy's
    connections to its upstream do (here 1 s by LLMTOP_TIMEOUTS_CONNECT_S), and such a
    failure is named "connect timed out"."""
    import os
    import time

    from net_support import blackhole

    with blackhole() as url:
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llmtop", "bench", url, "--requests", "3", "--timeout", "60",
            "--json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "LLMTOP_TIMEOUTS_CONNECT_S": "1"})
        out, err = await asyncio.wait_for(proc.communicate(), 100)
        took = time.monotonic() - t0
    assert proc.returncode == 1, err
    assert took < 20
    step = json.loads(out)["steps"][0]
    assert step["error_kinds"] == {"connect timed out": 3}
    assert "3 connect timed out" in err.decode()
