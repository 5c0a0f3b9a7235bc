"""IPv6 literals and host names, end to end, as users give them: every command on ``[::1]``
with real processes and real traffic (the openai SDK, aiohttp, ``llmtop bench``), what the
views show for an IPv6 client, the ``Host`` sent to an IPv6 upstream, ``localhost`` that
names both ::1 and 127.0.0.1, the wildcard addresses, and bad IPv6 input.

Found and fixed here: ``--listen localhost:0`` (and ``--admin``, ``llmtop sim --listen``)
bound ::1 and 127.0.0.1 on two different free ports and printed one, so a client whose
``localhost`` was the other family was refused; a zone id (``fe80::1%eth0``) went
upstream in the ``Host`` field; ``[1:2:3]:0`` said "host not found" and
``[::ffff:127.0.0.1]:0`` "Invalid argument". The rest already behaved: those tests are
coverage."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from net_support import link_local_v6, loopback_v6
from prometheus_client.parser import text_string_to_metric_families
from views_agree import (
    ADMIN_PREFIX,
    LISTEN_PREFIX,
    ROOT,
    SIM_PREFIX,
    Announced,
    llmtop_cmd,
    quiet_env,
    read_lines,
)

from llmtop.config import ConfigError, parse_hostport, reaches_listener
from llmtop.proxy.identity import IdentityResolver
from llmtop.proxy.upstream import UpstreamPool

V6_URL = re.compile(r"http://\[::1\]:([1-9][0-9]*)")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "max_tokens": 4}




pytestmark = pytest.mark.skipif(not loopback_v6(), reason="no ::1 on this machine")


def sim_on(listen: str) -> tuple[Announced, str]:
    sim = Announced(llmtop_cmd("sim", "--listen", listen), (SIM_PREFIX,), quiet_env())
    return sim, sim.found[SIM_PREFIX]


def run_on(*args: str, **env: str) -> tuple[Announced, str, str]:
    proxy = Announced(llmtop_cmd("run", "--headless", *args), (LISTEN_PREFIX, ADMIN_PREFIX),
                      quiet_env(**env))
    return proxy, proxy.found[LISTEN_PREFIX], proxy.found[ADMIN_PREFIX]


async def get(url: str, token: str = "") -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        assert r.status == 200, (url, r.status, await r.text())
        return await r.json() if "json" in r.content_type else await r.text()


async def post_chat(base: str, body: dict[str, Any] | None = None) -> bytes:
    """A streamed chat request with nothing that names a user (no key, no header, no
    body ``user``): the user is the client address."""
    async with aiohttp.ClientSession() as s, \
            s.post(f"{base}/v1/chat/completions", json=body or CHAT) as r:
        assert r.status == 200, await r.text()
        return await r.read()


async def until_recent(admin: str, n: int, token: str = "", user: str | None = None
                       ) -> list[dict[str, Any]]:
    """The admin API's recent requests once ``n`` are there (of ``user``, when given):
    records reach it within a forwarding interval or two."""
    recent: list[dict[str, Any]] = []
    for _ in range(200):
        recent = await get(f"{admin}/llmtop/v1/requests?state=recent", token)
        if sum(user is None or r["user"] == user for r in recent) >= n:
            return recent
        await asyncio.sleep(0.05)
    raise AssertionError(f"{len(recent)} recent requests, wanted {n}")


@pytest.fixture(scope="module")
def v6_sim() -> Iterator[str]:
    sim, url = sim_on("[::1]:0")
    try:
        yield url
    finally:
        sim.stop()


@pytest.fixture(scope="module")
def v6_proxy(v6_sim: str, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[str, str, Path]]:
    """``llmtop run`` on ``[::1]:0`` for both addresses, in front of the simulator on
    ``[::1]``, recording."""
    record = tmp_path_factory.mktemp("v6") / "v6.jsonl"
    proxy, url, admin = run_on("--upstream", v6_sim, "--listen", "[::1]:0", "--admin",
                               "[::1]:0", "--record", str(record))
    try:
        yield url, admin, record
    finally:
        assert proxy.stop() == 0, "\n".join(proxy.lines)


# -- every command on [::1], its start-up lines usable as printed ---------------------


def test_sim_and_run_print_bracketed_urls(v6_sim: str, v6_proxy: tuple[str, str, Path]
                                          ) -> None:
    """``http://[::1]:PORT``, a port picked (not 0), for the simulator, proxy and admin."""
    for url in (v6_sim, *v6_proxy[:2]):
        assert V6_URL.fullmatch(url), url


async def test_openai_sdk_through_a_v6_proxy_to_a_v6_engine(
        v6_proxy: tuple[str, str, Path]) -> None:
    """The openai SDK at the printed URL: a stream and a plain answer, with usage."""
    url, _, _ = v6_proxy
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-v6", max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=5)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        plain = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    finally:
        await client.close()
    assert text
    assert plain.usage is not None and plain.usage.completion_tokens == 5


async def test_the_views_name_an_ipv6_client_by_its_address(
        v6_proxy: tuple[str, str, Path]) -> None:
    """Nothing else names the user: the admin API's requests, the snapshot's users and the
    Prometheus labels say ``::1`` (unbracketed: an address, not a URL host), and the
    exposition still parses."""
    url, admin, _ = v6_proxy
    await post_chat(url)
    await until_recent(admin, 1, user="::1")
    snap = await get(f"{admin}/llmtop/v1/snapshot?window=all")
    assert "::1" in {u["user"] for u in snap["users"]}, snap["users"]
    prom = await get(f"{admin}/metrics")
    labelled = {s.labels.get("user") for fam in text_string_to_metric_families(prom)
                for s in fam.samples}
    assert "::1" in labelled, prom


async def test_an_open_request_of_an_ipv6_client_is_listed_active(
        v6_proxy: tuple[str, str, Path]) -> None:
    url, admin, _ = v6_proxy
    task = asyncio.create_task(post_chat(url, {**CHAT, "max_tokens": 200}))
    try:
        for _ in range(200):
            active = await get(f"{admin}/llmtop/v1/requests?state=active")
            if active:
                break
            await asyncio.sleep(0.02)
        assert active and active[0]["user"] == "::1", active
    finally:
        await task


async def test_the_engine_is_scraped_over_ipv6(v6_sim: str,
                                               v6_proxy: tuple[str, str, Path]) -> None:
    """``--upstream http://[::1]:PORT``: the engine's /metrics (the simulator's) is read
    at ``http://[::1]:PORT/metrics`` and its readings shown."""
    engine: dict[str, Any] = {}
    for _ in range(100):
        engine = (await get(f"{v6_proxy[1]}/llmtop/v1/snapshot"))["engine"] or {}
        if engine.get("running") is not None:
            break
        await asyncio.sleep(0.1)
    assert engine.get("kind") == "sim" and engine.get("running") is not None, engine
    assert f"{v6_sim}/metrics" in engine.get("status", ""), engine


def test_bench_at_a_v6_url_through_the_proxy(v6_proxy: tuple[str, str, Path],
                                             tmp_path: Path) -> None:
    """``llmtop bench http://[::1]:PORT/v1``: a loopback target (no --allow-remote), its
    requests answered, and counted by the proxy's admin API it is given."""
    url, admin, _ = v6_proxy
    p = subprocess.run(
        llmtop_cmd("bench", f"{url}/v1", "--concurrency", "2", "--requests", "4",
                   "--max-tokens", "4", "--admin", admin, "--json"),
        capture_output=True, text=True, cwd=ROOT, env=quiet_env(), timeout=90, check=False)
    assert p.returncode == 0, p.stderr
    levels = json.loads(p.stdout)["steps"]
    assert levels[0]["requests"] == 4 and levels[0]["errors"] == 0, levels


def test_recording_and_reports_keep_the_v6_client(v6_proxy: tuple[str, str, Path],
                                                  tmp_path: Path) -> None:
    """The recording's requests name ``::1``; ``llmtop report`` (text and JSON) lists it
    among the users, and the header keeps the bracketed upstream."""
    record = v6_proxy[2]
    lines: list[dict[str, Any]] = []
    for _ in range(100):  # flushed every 0.1 s (quiet_env)
        lines = read_lines(record) if record.exists() else []
        if any(r.get("user") == "::1" for r in lines):
            break
        time.sleep(0.1)
    assert lines[0]["type"] == "header" and lines[0]["upstream"].startswith("http://[::1]:")
    assert any(r.get("type") == "request" and r["user"] == "::1" for r in lines)
    copy = tmp_path / "copy.jsonl"
    copy.write_text(record.read_text("utf-8"), "utf-8")  # the live file is still written
    js = subprocess.run(llmtop_cmd("report", str(copy), "--format", "json"),
                        capture_output=True, text=True, cwd=ROOT, timeout=60, check=True)
    assert "::1" in {u["user"] for u in json.loads(js.stdout)["users"]}
    text = subprocess.run(llmtop_cmd("report", str(copy)), capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True).stdout
    assert re.search(r"^\s+::1\s+\d", text, re.M), text


# -- Host to an IPv6 upstream ---------------------------------------------------------


class EchoUpstream:
    """An upstream on ``host`` that answers each request with the Host and path it got."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _echo(self, request: web.Request) -> web.Response:
        return web.json_response({"host": request.headers.get("Host"),
                                  "path": request.path_qs})

    async def __aenter__(self) -> EchoUpstream:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._echo)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


async def echoed(url: str, path: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}{path}", json={"model": "m", "messages": []}) as r:
            first: dict[str, Any] = await r.json()
        async with s.get(f"{url}{path}?x=1") as r:  # another request on the connection
            second: dict[str, Any] = await r.json()
    assert second["host"] == first["host"], (first, second)
    assert second["path"] == first["path"] + "?x=1", (first, second)
    return first


async def test_host_to_a_v6_upstream_is_bracketed_and_its_prefix_kept() -> None:
    """RFC 9110/3986: ``Host: [::1]:PORT``; the upstream's path prefix is kept over IPv6."""
    async with EchoUpstream("::1") as up:
        proxy, url, _ = await asyncio.to_thread(
            run_on, "--upstream", f"http://[::1]:{up.port}/gw/llama", "--listen", "[::1]:0",
            "--admin", "[::1]:0", LLMTOP_ENGINE_ENABLED="false")
        try:
            got = await echoed(url, "/v1/chat/completions")
        finally:
            await asyncio.to_thread(proxy.stop)
    assert got == {"host": f"[::1]:{up.port}", "path": "/gw/llama/v1/chat/completions"}


@pytest.mark.parametrize(("upstream", "host", "header"), [
    ("http://[fe80::1%25eth0]:8000/x", "fe80::1%eth0", "[fe80::1]:8000"),
    ("http://[fe80::1%eth0]:8000", "fe80::1%eth0", "[fe80::1]:8000"),
    ("http://[::1]", "::1", "[::1]"),
    ("https://[2001:db8::1]:443/v", "2001:db8::1", "[2001:db8::1]"),
])
def test_a_zone_id_is_for_the_socket_not_the_host_field(upstream: str, host: str,
                                                        header: str) -> None:
    """RFC 6874: a URL writes the zone ``%25``; it picks the interface to connect on and is
    removed from what goes out (before: ``Host: [fe80::1%25eth0]:8000``)."""
    pool = UpstreamPool(upstream, 1.0)
    assert (pool.host, pool.host_header) == (host, header)


async def test_a_link_local_upstream_with_its_zone() -> None:
    """``--upstream http://[fe80::…%25IF]:PORT`` and ``--listen [fe80::…%IF]:0`` on a real
    link-local address: served, and the Host field has no zone."""
    ll = link_local_v6()
    if ll is None:
        pytest.skip("no link-local IPv6 address on this machine")
    bare, _, zone = ll.partition("%")
    async with EchoUpstream(ll) as up:
        proxy, url, _ = await asyncio.to_thread(
            run_on, "--upstream", f"http://[{bare}%25{zone}]:{up.port}", "--listen",
            f"[{ll}]:0", "--admin", "[::1]:0", LLMTOP_ENGINE_ENABLED="false")
        try:
            assert url.startswith(f"http://[{ll}]:"), url
            got = await echoed(url, "/v1/chat/completions")
        finally:
            await asyncio.to_thread(proxy.stop)
    assert got["host"] == f"[{bare}]:{up.port}", got


@pytest.mark.parametrize(("upstream", "metrics", "gpu"), [
    ("http://[fe80::1%25eth0]:8000/v1", "http://[fe80::1%eth0]:8000/metrics",
     "http://[fe80::1%eth0]:8000/sim/gpu"),
    ("http://[::1]:8000/gw/v1", "http://[::1]:8000/gw/metrics", "http://[::1]:8000/sim/gpu"),
])
def test_scrape_urls_of_a_v6_upstream(upstream: str, metrics: str, gpu: str) -> None:
    """The engine's /metrics and the simulated GPU under an IPv6 upstream, its zone as a
    socket takes it (before: ``%25eth0``, which the resolver did not know)."""
    from llmtop.engines.scraper import metrics_url_for
    from llmtop.gpu.start import sim_gpu_url

    assert (metrics_url_for(upstream), sim_gpu_url(upstream)) == (metrics, gpu)


async def test_engine_and_gpu_of_a_link_local_sim_are_read() -> None:
    """``--upstream http://[fe80::…%25IF]:PORT --gpu-source sim``: the simulator's
    /metrics and /sim/gpu are read over the link-local address (before: "no /metrics …
    (cannot connect: Name or service not known)" and no GPU)."""
    ll = link_local_v6()
    if ll is None:
        pytest.skip("no link-local IPv6 address on this machine")
    bare, _, zone = ll.partition("%")
    sim, sim_url = await asyncio.to_thread(sim_on, f"[{ll}]:0")
    try:
        port = sim_url.rpartition(":")[2]
        proxy, _, admin = await asyncio.to_thread(
            run_on, "--upstream", f"http://[{bare}%25{zone}]:{port}", "--listen", "[::1]:0",
            "--admin", "[::1]:0", "--gpu-source", "sim")
        try:
            snap: dict[str, Any] = {}
            for _ in range(100):
                snap = await get(f"{admin}/llmtop/v1/snapshot")
                if snap["gpus"] and (snap["engine"] or {}).get("running") is not None:
                    break
                await asyncio.sleep(0.1)
        finally:
            await asyncio.to_thread(proxy.stop)
    finally:
        await asyncio.to_thread(sim.stop)
    assert (snap["engine"] or {}).get("kind") == "sim", snap["engine"]
    assert snap["gpus"], snap


# -- workers, wildcards, the config file ----------------------------------------------


async def test_two_workers_on_v6(v6_sim: str) -> None:
    """``--workers 2 --listen [::1]:0``: one bracketed port for both, requests served, and
    the coordinator's admin API names the ``::1`` client."""
    proxy, url, admin = await asyncio.to_thread(
        run_on, "--upstream", v6_sim, "--listen", "[::1]:0", "--admin", "[::1]:0",
        "--workers", "2")
    try:
        assert V6_URL.fullmatch(url) and V6_URL.fullmatch(admin), (url, admin)
        for _ in range(4):
            await post_chat(url)
        recent = await until_recent(admin, 4)
    finally:
        assert await asyncio.to_thread(proxy.stop) == 0
    assert {r["user"] for r in recent} == {"::1"}, recent


@pytest.mark.parametrize("admin", ["[::]:0", "0.0.0.0:0"])
def test_a_wildcard_admin_needs_a_token(v6_sim: str, admin: str) -> None:
    p = subprocess.run(llmtop_cmd("run", "--headless", "--upstream", v6_sim, "--listen",
                                  "[::1]:0", "--admin", admin),
                       capture_output=True, text=True, cwd=ROOT, env=quiet_env(), timeout=30,
                       stdin=subprocess.DEVNULL, check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines() == [
        f"llmtop run: error: admin '{admin}' is not loopback: set admin_token "
        "(--admin-token or LLMTOP_ADMIN_TOKEN) so the admin API is not open to the network"]


@pytest.mark.parametrize("workers", [1, 2])
async def test_wildcard_v6_from_a_config_file(v6_sim: str, tmp_path: Path, workers: int
                                              ) -> None:
    """``listen = "[::]:0"``, ``admin = "[::]:0"`` with a token, ``upstream =
    "http://[::1]:PORT"`` in the config: the printed ``http://[::]:PORT`` URLs are usable as
    printed (on Linux, :: reaches this machine), at ``[::1]`` and at ``127.0.0.1`` — ``[::]``
    is every address, as ``0.0.0.0`` is every IPv4 one (before: IPv4 clients were refused,
    asyncio's IPv6 sockets being IPv6-only) — and an IPv4 client is named ``127.0.0.1``, not
    ``::ffff:127.0.0.1``. The admin API wants the token."""
    cfg = tmp_path / "v6.toml"
    cfg.write_text(f'upstream = "{v6_sim}"\nlisten = "[::]:0"\nadmin = "[::]:0"\n'
                   f'admin_token = "s3cret"\nworkers = {workers}\n', "utf-8")
    proxy, url, admin = await asyncio.to_thread(run_on, "--config", str(cfg))
    try:
        assert re.fullmatch(r"http://\[::\]:[1-9][0-9]*", url), url
        assert re.fullmatch(r"http://\[::\]:[1-9][0-9]*", admin), admin
        await post_chat(url)
        await post_chat(url.replace("[::]", "[::1]"))
        await post_chat(url.replace("[::]", "127.0.0.1"))
        async with aiohttp.ClientSession() as s, s.get(f"{admin}/llmtop/v1/snapshot") as r:
            assert r.status == 401
        recent = await until_recent(admin.replace("[::]", "127.0.0.1"), 3, "s3cret")
    finally:
        assert await asyncio.to_thread(proxy.stop) == 0
    assert sorted(r["user"] for r in recent) == ["127.0.0.1", "::1", "::1"], recent


async def test_sim_on_the_v6_wildcard_takes_ipv4_clients_too() -> None:
    sim, url = await asyncio.to_thread(sim_on, "[::]:0")
    try:
        port = url.rpartition(":")[2]
        for host in ("[::]", "[::1]", "127.0.0.1"):
            async with aiohttp.ClientSession() as s, \
                    s.get(f"http://{host}:{port}/v1/models") as r:
                assert r.status == 200, host
    finally:
        await asyncio.to_thread(sim.stop)


def test_demo_on_v6() -> None:
    """``llmtop demo --headless --listen [::1]:0 --admin [::1]:0``: bracketed start-up
    lines, and its traffic driver (given the printed URL) is served through the proxy."""
    p = subprocess.run(llmtop_cmd("demo", "--headless", "--listen", "[::1]:0", "--admin",
                                  "[::1]:0", "--record", "", "--duration", "3"),
                       capture_output=True, text=True, cwd=ROOT, env=quiet_env(), timeout=60,
                       stdin=subprocess.DEVNULL, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    found = dict(re.findall(r"^llmtop: (proxy|admin) listening on (\S+)$", p.stdout, re.M))
    assert V6_URL.fullmatch(found["proxy"]) and V6_URL.fullmatch(found["admin"]), p.stdout
    served = re.search(r"served (\d+) requests", p.stdout + p.stderr)
    assert served is not None and int(served.group(1)) > 0, p.stdout + p.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_v6_port_in_use_is_named_as_given(workers: str) -> None:
    """The address in use, bracketed as ``--listen`` takes it, with one process or
    several (before, with workers: ``listen address ::1:PORT``)."""
    import socket

    with socket.socket(socket.AF_INET6) as held:
        held.bind(("::1", 0))
        held.listen()
        port = held.getsockname()[1]
        p = subprocess.run(
            llmtop_cmd("run", "--headless", "--upstream", "http://[::1]:9", "--listen",
                       f"[::1]:{port}", "--admin", "[::1]:0", "--workers", workers),
            capture_output=True, text=True, cwd=ROOT, env=quiet_env(), timeout=60,
            stdin=subprocess.DEVNULL, check=False)
    assert p.returncode == 2 and "listening on" not in p.stdout, p.stdout + p.stderr
    assert p.stderr.strip().splitlines() == [
        f"llmtop run: error: listen address [::1]:{port}: Address already in use"]


# -- localhost naming both ::1 and 127.0.0.1 ------------------------------------------


def _dual_localhost(tmp_path: Path) -> list[str]:
    """A command prefix that runs in a mount namespace of its own whose /etc/hosts names
    ``localhost`` ::1 and 127.0.0.1 (as most distributions' do; this machine's may not);
    the network is the test's. Skips where unprivileged namespaces are not allowed."""
    unshare = shutil.which("unshare")
    if unshare is None or sys.platform != "linux":
        pytest.skip("needs unshare (Linux)")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n::1 localhost\n", "ascii")
    prefix = [unshare, "-rm", "sh", "-c", f'mount --bind "{hosts}" /etc/hosts && exec "$@"',
              "sh"]
    probe = subprocess.run([*prefix, "getent", "ahosts", "localhost"], capture_output=True,
                           text=True, timeout=30, check=False)
    if probe.returncode != 0:
        pytest.skip(f"no private /etc/hosts here: {probe.stderr.strip()}")
    assert "::1" in probe.stdout and "127.0.0.1" in probe.stdout, probe.stdout
    return prefix


async def reaches_both(url: str, path: str) -> None:
    """``url`` (``http://localhost:PORT``) answers at ::1 and at 127.0.0.1, same port."""
    port = url.rpartition(":")[2]
    for host in ("[::1]", "127.0.0.1"):
        async with aiohttp.ClientSession() as s, s.get(f"http://{host}:{port}{path}") as r:
            assert r.status == 200, (host, r.status)


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_localhost_port_0_is_one_port_on_both_families(
        v6_sim: str, tmp_path: Path, workers: str) -> None:
    """``--listen localhost:0 --admin localhost:0`` and ``llmtop sim --listen localhost:0``
    where localhost is ::1 and 127.0.0.1: the printed port serves both (before: two free
    ports, one per family, and the printed one refused the other family's clients)."""
    prefix = _dual_localhost(tmp_path)
    sim = await asyncio.to_thread(
        Announced, [*prefix, *llmtop_cmd("sim", "--listen", "localhost:0")], (SIM_PREFIX,),
        quiet_env(PYTHONPATH=str(ROOT)))
    proxy = None
    try:
        sim_url = sim.found[SIM_PREFIX]
        await reaches_both(sim_url, "/v1/models")
        proxy = await asyncio.to_thread(
            Announced, [*prefix, *llmtop_cmd(
                "run", "--headless", "--upstream", sim_url, "--listen", "localhost:0",
                "--admin", "localhost:0", "--workers", workers)],
            (LISTEN_PREFIX, ADMIN_PREFIX), quiet_env(PYTHONPATH=str(ROOT)))
        url, admin = proxy.found[LISTEN_PREFIX], proxy.found[ADMIN_PREFIX]
        assert re.fullmatch(r"http://localhost:[1-9][0-9]*", url), url
        await reaches_both(url, "/v1/models")
        await reaches_both(admin, "/llmtop/v1/snapshot")
    finally:
        if proxy is not None:
            await asyncio.to_thread(proxy.stop)
        await asyncio.to_thread(sim.stop)


# -- bad IPv6 input: one line, exit 2, no traceback -----------------------------------


@pytest.mark.parametrize(("value", "says"), [
    ("[::1", "must be HOST:PORT, e.g. 127.0.0.1:8080 or [::1]:8080"),
    ("::1", "an IPv6 address goes in brackets before the port"),
    ("[1:2:3]:0", "1:2:3 is not an IPv6 address"),  # before: "host not found"
    ("[::ffff:127.0.0.1]:0",  # before: "Invalid argument"
     "::ffff:127.0.0.1 is an IPv4-mapped address; give the IPv4 address, e.g. 127.0.0.1:0"),
    ("[fe80::1%nosuchif9]:0", "listen address [fe80::1%nosuchif9]:0: "),
])
@pytest.mark.parametrize("command", ["run", "sim"])
def test_bad_ipv6_listen_is_one_line(v6_sim: str, command: str, value: str,
                                     says: str) -> None:
    args = (["run", "--headless", "--upstream", v6_sim, "--admin", "[::1]:0"]
            if command == "run" else ["sim"])
    p = subprocess.run(llmtop_cmd(*args, "--listen", value), capture_output=True,
                       text=True, cwd=ROOT, env=quiet_env(), timeout=30,
                       stdin=subprocess.DEVNULL, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    if command == "run" or "listen address" not in says:
        assert says in lines[0], lines
    assert lines[0].startswith(f"llmtop {command}: "), lines


@pytest.mark.parametrize("argv", [
    ["attach", "http://[::1"],
    ["attach", "http://[::1]:0"],
    ["attach", "[::1]"],
    ["bench", "http://[::1:8080/v1", "--requests", "1"],
    ["bench", "http://[fe80::1%25nosuchif9]:8080/v1", "--requests", "1", "--concurrency",
     "1"],
    ["run", "--headless", "--upstream", "http://[::1:8000", "--listen", "[::1]:0"],
    ["run", "--headless", "--upstream", "http://[::1]:0", "--listen", "[::1]:0"],
])
def test_bad_ipv6_urls_are_one_line(argv: list[str]) -> None:
    p = subprocess.run(llmtop_cmd(*argv), capture_output=True, text=True, cwd=ROOT,
                       env=quiet_env(), timeout=60, stdin=subprocess.DEVNULL, check=False)
    assert p.returncode in (1, 2) and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.parametrize(("value", "parsed"), [
    ("[fe80::1%eth0]:8080", ("fe80::1%eth0", 8080)),
    ("[::]:0", ("::", 0)),
    ("[::1]:65535", ("::1", 65535)),
])
def test_ipv6_listen_values(value: str, parsed: tuple[str, int]) -> None:
    assert parse_hostport(value, "listen") == parsed


def test_bracketed_names_are_still_taken() -> None:
    """``[127.0.0.1]:0`` and ``[localhost]:0`` bound before; only a bracketed value with a
    colon must now be an IPv6 address."""
    assert parse_hostport("[127.0.0.1]:0") == ("127.0.0.1", 0)
    assert parse_hostport("[localhost]:0") == ("localhost", 0)
    with pytest.raises(ConfigError):
        parse_hostport("[::1::2]:0")




# -- an upstream that is the proxy itself, by another name -----------------------------


@pytest.mark.parametrize(("url", "loops"), [
    ("http://127.0.0.1:9000", True),
    ("http://[::1]:9000/v1", True),
    ("http://LOCALHOST:9000", True),
    ("http://127.0.0.1:9001", False),
    ("http://192.0.2.7:9000", False),
    ("http://gpu-box:9000", False),
])
def test_listen_localhost_is_its_loopback_addresses(url: str, loops: bool) -> None:
    """``--listen localhost:P`` listens on 127.0.0.1:P (and ::1:P): an upstream at either
    is the proxy itself (before: only ``http://localhost:P`` was seen as a loop)."""
    assert reaches_listener(url, "localhost", 9000) is loops


def test_run_refuses_to_forward_to_itself_through_localhost() -> None:
    """Before: served, and one request went round the loop ~1,200 times until the process
    ran out of descriptors ('Too many open files', 502)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.run(llmtop_cmd("run", "--headless", "--upstream", f"http://127.0.0.1:{port}",
                                  "--listen", f"localhost:{port}", "--admin", "[::1]:0"),
                       capture_output=True, text=True, cwd=ROOT, env=quiet_env(), timeout=30,
                       stdin=subprocess.DEVNULL, check=False)
    assert p.returncode == 2 and "listening on" not in p.stdout, p.stdout + p.stderr
    assert p.stderr.strip().splitlines() == [
        f"llmtop run: error: upstream 'http://127.0.0.1:{port}' is llmtop's own listen address "
        f"localhost:{port}: requests would loop back into its proxy; point upstream at the "
        "inference engine (e.g. --upstream http://127.0.0.1:8000) or listen on another port"]


@pytest.mark.parametrize(("remote", "user"), [
    ("::ffff:10.0.0.7", "10.0.0.7"),
    ("::1", "::1"),
    ("fe80::1%eth0", "fe80::1%eth0"),
    ("::ffff:a00:7", "::ffff:a00:7"),
    (None, "unknown"),
])
def test_an_ipv4_client_of_a_dual_stack_listener_is_named_by_its_ipv4_address(
        remote: str | None, user: str) -> None:
    assert IdentityResolver("X-LLMTOP-User", "salt").resolve({}, None, remote) == user
