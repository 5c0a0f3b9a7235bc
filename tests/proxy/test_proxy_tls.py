"""An https upstream with a certificate the system does not trust (a private CA, a
self-signed one): refused by default with a clear 502, served with ``upstream_ca`` (or,
for testing, ``upstream_verify = false``), and the engine's /metrics scraped with the same
trust. The certificate is made by ``openssl`` for 127.0.0.1."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from test_proxy_support import openai_chunks, running_proxy, sha

from llmtop.config import ConfigError, load_config
from llmtop.engines.scraper import EngineScraper
from llmtop.events import EngineReading
from llmtop.tls import ssl_context

CHUNKS = openai_chunks(["Hel", "lo"], usage={"prompt_tokens": 3, "completion_tokens": 2,
                                             "total_tokens": 5})


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    crt, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(crt), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return crt, key


@asynccontextmanager
async def https_upstream(cert: tuple[Path, Path]) -> AsyncIterator[str]:
    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for c in CHUNKS:
            await resp.write(c)
        await resp.write_eof()
        return resp

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 3\nvllm:num_requests_waiting 1\n")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _chat(url: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json={
            "model": "m", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi"}]}) as r:
        return r.status, await r.read()


async def test_untrusted_certificate_is_a_clear_502(cert: tuple[Path, Path]) -> None:
    async with https_upstream(cert) as up, running_proxy(up) as (_, url, recs):
        status, body = await _chat(url)
        (rec,) = await recs.wait(1)
    assert status == 502 and b"CERTIFICATE_VERIFY_FAILED" in body
    assert rec.outcome == "error" and "CERTIFICATE_VERIFY_FAILED" in (rec.error or "")


@pytest.mark.parametrize("trust", ["ca", "no verify"])
async def test_upstream_ca_or_no_verification_serves_the_stream(
        cert: tuple[Path, Path], trust: str) -> None:
    opts = {"upstream_ca": str(cert[0])} if trust == "ca" else {"upstream_verify": False}
    async with https_upstream(cert) as up, running_proxy(up, **opts) as (_, url, recs):
        status, body = await _chat(url)
        (rec,) = await recs.wait(1)
    assert status == 200 and sha([body]) == sha(CHUNKS)
    assert rec.outcome == "ok" and rec.completion_tokens == 2


async def test_engine_metrics_are_scraped_with_the_same_trust(cert: tuple[Path, Path]) -> None:
    got: list[EngineReading] = []
    async with https_upstream(cert) as up:
        for ctx in (None, ssl_context(str(cert[0]))):
            scraper = EngineScraper(up + "/metrics", None, got.append, interval_s=0.05)
            scraper.ssl = ctx
            task = asyncio.create_task(scraper.run())
            for _ in range(100):
                await asyncio.sleep(0.02)
                if scraper.failures or scraper.scrapes:
                    break
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if ctx is None:
                assert scraper.failures and not scraper.scrapes
                assert "CERTIFICATE_VERIFY_FAILED" in scraper.status
            else:
                assert scraper.scrapes and got[-1].running == 3 and got[-1].waiting == 1


def test_unusable_ca_files_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"upstream_ca '.*nope\.pem': no such file"):
        load_config(None, env={}, overrides={"upstream": "https://h", "upstream_ca":
                                             str(tmp_path / "nope.pem")})
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="is not a PEM file of CA certificates"):
        load_config(None, env={"LLMTOP_UPSTREAM_CA": str(junk)},
                    overrides={"upstream": "https://h"})
