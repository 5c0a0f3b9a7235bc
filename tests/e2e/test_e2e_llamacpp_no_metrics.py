"""A real llama-server started without ``--metrics`` answers its ``/metrics`` with HTTP 501
and a JSON error that says how to fix it ("Start it with `--metrics`"): the engine
scraper's status (the TUI's engine line, the admin snapshot's ``engine.status``) carries
that message, not the bare status code."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from e2e_support import load_real_engine

from llmtop.engines.scraper import EngineScraper, ScrapeError

real_engine = load_real_engine()


@pytest.fixture(scope="module")
def bare_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-server without ``--metrics`` (one slot, a small context)."""
    try:
        paths = real_engine.prepare()
    except real_engine.PrepareError as exc:
        pytest.fail(f"the real engine could not be prepared: {exc}", pytrace=False)
    port = real_engine._free_port()
    args = [a for a in real_engine.server_args(paths, port, slots=1, ctx=512)
            if a != "--metrics"]
    log = tmp_path_factory.mktemp("bare") / "llama-server.log"
    with Path(log).open("wb") as fh:
        proc = subprocess.Popen(["nice", "-n", "19", *args], stdin=subprocess.DEVNULL,
                                stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "llama-server did not become healthy"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_metrics_off_says_the_engines_own_reason(bare_engine: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{bare_engine}/metrics") as resp:
            assert resp.status == 501
            said = (await resp.json())["error"]["message"]
        assert "--metrics" in said, said
        scraper = EngineScraper(f"{bare_engine}/metrics", session, lambda _e: None)
        with pytest.raises(ScrapeError) as err:
            await scraper.scrape_once(session)
    text = str(err.value)
    assert text.startswith(f"{bare_engine}/metrics: HTTP 501"), text
    assert said in text, text
