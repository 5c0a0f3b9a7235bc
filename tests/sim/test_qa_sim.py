"""QA findings on ``llmtop sim``: hostile request bodies get each dialect's 400 JSON error."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from llmtop.sim.server import running_sim

DEEP = b"[" * 100_000 + b"]" * 100_000
"""Valid JSON nested deeper than Python's json decoder recurses (it raised RecursionError,
which aiohttp answered with its text 500 page and a traceback in the log)."""


def _shape(path: str, body: Any) -> str:
    if path == "/v1/messages":
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        return str(body["error"]["message"])
    if path.startswith("/v1/"):
        assert body["error"]["code"] == 400
        return str(body["error"]["message"])
    if path.startswith("/generate"):
        assert body["error_type"] == "validation"
    return str(body["error"])


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages",
                                  "/api/chat", "/api/generate", "/generate",
                                  "/generate_stream"])
async def test_deeply_nested_body_is_a_400_in_the_dialects_shape(
        path: str, caplog: pytest.LogCaptureFixture) -> None:
    async with running_sim("tiny") as sim, aiohttp.ClientSession() as s:
        async with s.post(sim.url + path, data=DEEP,
                          headers={"Content-Type": "application/json"}) as r:
            status, raw = r.status, await r.read()
        # the simulator still serves afterwards
        async with s.post(sim.url + "/v1/completions",
                          json={"prompt": "x", "max_tokens": 1}) as ok:
            assert ok.status == 200
    assert status == 400, raw[:200]
    assert "nested too deeply" in _shape(path, json.loads(raw))
    assert "Traceback" not in caplog.text
    assert not [rec for rec in caplog.records if rec.exc_info]
