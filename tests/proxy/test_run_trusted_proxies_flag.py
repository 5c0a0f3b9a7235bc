"""``llmtop run --headless --trusted-proxies LIST``, a real proxy process in front of the
simulator: a request from a listed balancer is the user it forwards, in the live view and
in the recording; the flag outranks ``LLMTOP_TRUSTED_PROXIES`` (in either direction:
``''`` trusts none). The openai SDK is the client, without a key (a key would name the
user before the address does)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from views_agree import ADMIN_PREFIX, LISTEN_PREFIX, Announced, llmtop_cmd, quiet_env, start_sim

CLIENT = "203.0.113.9"


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    sim, url = start_sim("--profile", "tiny", "--seed", "3")
    try:
        yield url
    finally:
        sim.stop()


async def users_seen(admin: str, n: int) -> dict[str, int]:
    """The live view's users once it counts ``n`` requests (or after 10 s)."""
    snap: dict[str, Any] = {}
    async with aiohttp.ClientSession() as s:
        for _ in range(100):
            async with s.get(admin + "/llmtop/v1/snapshot?window=all&max_age=0") as r:
                snap = await r.json()
            if snap["system"]["requests"] >= n:
                break
            await asyncio.sleep(0.1)
    return {u["user"]: u["requests"] for u in snap["users"]}


@pytest.mark.parametrize(("flag", "env", "user"), [
    ("127.0.0.1", None, CLIENT),
    (None, None, "127.0.0.1"),  # (no balancer named: the connection's address)
    ("10.0.0.0/8, 127.0.0.0/8", "192.0.2.1", CLIENT),  # the flag over the environment...
    ("", "127.0.0.1", "127.0.0.1"),  # ...either way: '' trusts none
])
async def test_the_flag_names_the_forwarded_client(sim_url: str, tmp_path: Path,
                                                   flag: str | None, env: str | None,
                                                   user: str) -> None:
    environ = quiet_env()
    environ.pop("LLMTOP_TRUSTED_PROXIES", None)
    if env is not None:
        environ["LLMTOP_TRUSTED_PROXIES"] = env
    record = tmp_path / "r.jsonl"
    proxy = Announced(
        llmtop_cmd("run", "--headless", "--upstream", sim_url, "--listen", "127.0.0.1:0",
                   "--admin", "127.0.0.1:0", "--record", str(record),
                   *(["--trusted-proxies", flag] if flag is not None else [])),
        (LISTEN_PREFIX, ADMIN_PREFIX), environ)
    try:
        url, admin = proxy.found[LISTEN_PREFIX], proxy.found[ADMIN_PREFIX]
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused",
                                    default_headers={"X-Forwarded-For": CLIENT})
        try:
            stream = await client.chat.completions.create(
                model="m", max_tokens=3, stream=True,
                extra_headers={"Authorization": openai.Omit()},
                messages=[{"role": "user", "content": "hi"}])
            async for _ in stream:
                pass
        finally:
            await client.close()
        seen = await users_seen(admin, 1)
    finally:
        code = proxy.stop()
    assert code == 0, "\n".join(proxy.lines)
    assert seen == {user: 1}, "\n".join(proxy.lines)
    lines = [json.loads(x) for x in record.read_text().splitlines()]
    assert [x["user"] for x in lines if x["type"] == "request"] == [user]
