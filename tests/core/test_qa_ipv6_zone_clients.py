"""A link-local IPv6 address with its zone in the URLs ``llmtop bench`` and ``llmtop attach``
are given, as ``llmtop run --upstream`` already takes it (``http://[fe80::…%25eth0]:PORT``,
RFC 6874; or ``%eth0``, as llmtop prints its own addresses).

Before: both handed ``fe80::…%25eth0`` to the resolver as it was, and every request failed
as "host not found" (bench: "no request … succeeded", exit 1; attach: a screen of a proxy
that never answered). Now the zone reaches the socket as ``%eth0``, bench's Host field goes
without it (as the proxy's upstream requests do), and a zone no socket could use (empty,
on an address that is not link-local, naming no interface here) is a one-line usage error.

Over a real link-local address of this machine (skipped where there is none): ``::1`` with a
zone is refused by the resolver here ("Name or service not known"), the system taking zones
for link-local addresses only."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator

import pytest
from aiohttp import web
from net_support import link_local_v6
from views_agree import (
    ADMIN_PREFIX,
    LISTEN_PREFIX,
    ROOT,
    SIM_PREFIX,
    Announced,
    llmtop_cmd,
    quiet_env,
)

from llmtop.tui.source import AdminSource

LINK_LOCAL = link_local_v6()
pytestmark = pytest.mark.skipif(LINK_LOCAL is None, reason="no link-local IPv6 address here")


def as_url(printed: str) -> str:
    """``http://[fe80::1%eth0]:P`` as a URL writes it: ``http://[fe80::1%25eth0]:P``."""
    return printed.replace("%", "%25", 1)


@pytest.fixture(scope="module")
def link_sim() -> Iterator[str]:
    """``llmtop sim`` on this machine's link-local address, its URL as printed."""
    sim = Announced(llmtop_cmd("sim", "--listen", f"[{LINK_LOCAL}]:0"), (SIM_PREFIX,),
                    quiet_env())
    try:
        yield sim.found[SIM_PREFIX]
    finally:
        sim.stop()


def bench(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    # no --allow-remote: this machine's own link-local address is this machine
    return subprocess.run(
        llmtop_cmd("bench", url, "--concurrency", "2", "--requests", "4",
                   "--max-tokens", "4", "--json", *extra),
        capture_output=True, text=True, cwd=ROOT, env=quiet_env(), timeout=120,
        stdin=subprocess.DEVNULL, check=False)


@pytest.mark.parametrize("written", ["%25", "%"])
def test_bench_at_a_link_local_sim_with_its_zone(link_sim: str, written: str) -> None:
    url = link_sim.replace("%", written, 1) + "/v1"
    p = bench(url)
    assert p.returncode == 0, p.stderr
    step = json.loads(p.stdout)["steps"][0]
    assert step["requests"] == 4 and step["errors"] == 0, step


async def test_bench_sends_no_zone_in_the_host_field() -> None:
    """As the proxy's upstream requests (RFC 6874 §4): ``Host: [fe80::…]:PORT``."""
    hosts: list[str | None] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        hosts.append(request.headers.get("Host"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"id":"x","object":"chat.completion.chunk","choices":'
                         b'[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n')
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, LINK_LOCAL, 0).start()
    port = int(runner.addresses[0][1])
    bare = str(LINK_LOCAL).partition("%")[0]
    try:
        p = await asyncio.to_thread(bench, as_url(f"http://[{LINK_LOCAL}]:{port}/v1"))
    finally:
        await runner.cleanup()
    assert p.returncode == 0, p.stderr
    assert hosts and set(hosts) == {f"[{bare}]:{port}"}, hosts


@pytest.fixture(scope="module")
def link_admin(link_sim: str) -> Iterator[str]:
    """``llmtop run`` with its admin API on the link-local address (a token: it is not
    loopback), its admin URL as printed."""
    proxy = Announced(
        llmtop_cmd("run", "--headless", "--upstream", link_sim, "--listen", "[::1]:0",
                   "--admin", f"[{LINK_LOCAL}]:0"),
        (LISTEN_PREFIX, ADMIN_PREFIX), quiet_env(LLMTOP_ADMIN_TOKEN="zone-test-token"))
    try:
        yield proxy.found[ADMIN_PREFIX]
    finally:
        proxy.stop()


async def test_attach_reads_a_link_local_admin_with_its_zone(link_admin: str) -> None:
    """What ``llmtop attach http://[fe80::…%25IF]:PORT`` reads its screen from (the TUI
    itself needs a terminal): the snapshot comes."""
    # (one fetch, its answer asserted: 10 s, not the TUI's 2 s, for a loaded machine)
    source = AdminSource([as_url(link_admin)], token=["zone-test-token"], timeout_s=10.0)
    try:
        snap = await source.fetch(10)
    finally:
        await source.close()
    assert source.urls == [link_admin]  # the zone as a socket takes it
    assert isinstance(snap, dict) and "system" in snap, snap


def test_attach_takes_the_url_up_to_its_terminal(link_admin: str) -> None:
    """The command accepts the URL: the one thing it stops at here is the missing
    terminal (before and after the URL checks, that error is the last)."""
    p = subprocess.run(llmtop_cmd("attach", as_url(link_admin)), capture_output=True,
                       text=True, cwd=ROOT, env=quiet_env(), timeout=60,
                       stdin=subprocess.DEVNULL, check=False)
    assert p.returncode == 2 and "needs a terminal" in p.stderr, p.stderr


@pytest.mark.parametrize(("host", "says"), [
    ("fe80::1%25", "the zone after % is empty"),
    ("::1%25lo", "goes with a link-local address (fe80::/10) only"),
    ("fe80::1%25nosuchif9", "no network interface 'nosuchif9'"),
    ("fe80::1%25999999", "no network interface '999999'"),
])
@pytest.mark.parametrize("command", ["bench", "attach", "run"])
def test_a_zone_no_socket_could_use_is_one_line(command: str, host: str, says: str) -> None:
    url = f"http://[{host}]:8080" + ("/v1" if command == "bench" else "")
    argv = {"bench": ["bench", url, "--requests", "1", "--allow-remote"],
            "attach": ["attach", url],
            "run": ["run", "--headless", "--upstream", url, "--listen", "127.0.0.1:0",
                    "--admin", "127.0.0.1:0"]}[command]
    p = subprocess.run(llmtop_cmd(*argv), capture_output=True, text=True, cwd=ROOT,
                       env=quiet_env(), timeout=60, stdin=subprocess.DEVNULL, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith(f"llmtop {command}: ") and says in lines[0], lines
