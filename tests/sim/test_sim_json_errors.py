"""Errors aiohttp itself raises (unknown path, wrong method, body too large) come back as
JSON in the API's error shape, as every other error of the simulator does — they were
aiohttp's plain text (``404: Not Found``), which no OpenAI-compatible server sends."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
import pytest
from sim_support import chat_body

from llmtop.sim import server
from llmtop.sim.server import running_sim


async def _request(method: str, url: str, **kwargs: Any) -> tuple[int, Any, Any]:
    """Status, headers and the body decoded as JSON (fails when it is not JSON)."""
    async with aiohttp.ClientSession() as s, s.request(method, url, **kwargs) as r:
        raw = await r.read()
        assert r.content_type == "application/json", (r.status, r.headers, raw)
        return r.status, r.headers, json.loads(raw)


def _openai_shape(body: Any, code: int, kind: str) -> str:
    assert set(body) == {"error"}, body
    err = body["error"]
    assert err["code"] == code and err["type"] == kind and err["param"] is None, err
    assert isinstance(err["message"], str) and err["message"], err
    return str(err["message"])


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
async def test_an_unknown_path_is_a_json_404(method: str) -> None:
    async with running_sim("tiny") as sim:
        status, _, body = await _request(method, sim.url + "/v1/embeddings", json={"x": 1})
    assert status == 404
    message = _openai_shape(body, 404, "NotFoundError")
    assert f"{method} /v1/embeddings" in message


async def test_a_wrong_method_is_a_json_405_that_keeps_allow() -> None:
    async with running_sim("tiny") as sim:
        status, headers, body = await _request("GET", sim.url + "/v1/chat/completions")
        assert status == 405 and headers["Allow"] == "POST"
        assert "allowed: POST" in _openai_shape(body, 405, "MethodNotAllowedError")

        status, headers, body = await _request("POST", sim.url + "/v1/models", json={})
        assert status == 405 and set(headers["Allow"].split(",")) == {"GET", "HEAD"}
        _openai_shape(body, 405, "MethodNotAllowedError")


async def test_on_a_generation_path_the_error_has_that_dialects_shape() -> None:
    async with running_sim("tiny") as sim:
        status, headers, body = await _request("GET", sim.url + "/v1/messages")
        assert status == 405 and headers["Allow"] == "POST"
        assert body["type"] == "error" and body["error"]["type"] == "api_error", body
        assert "GET /v1/messages" in body["error"]["message"]

        status, _, body = await _request("PUT", sim.url + "/api/chat")
        assert status == 405 and set(body) == {"error"} and isinstance(body["error"], str)

        status, _, body = await _request("GET", sim.url + "/generate_stream")
        assert status == 405 and isinstance(body["error"], str) and "error_type" in body


async def test_a_body_over_the_limit_is_a_json_413(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "MAX_BODY", 4096)
    big = chat_body(content="x " * 4000)
    async with running_sim("tiny") as sim:
        status, _, body = await _request("POST", sim.url + "/v1/chat/completions", json=big)
        assert status == 413
        message = _openai_shape(body, 413, "RequestEntityTooLargeError")
        assert "4096" in message

        status, _, body = await _request(
            "POST", sim.url + "/v1/messages", json={**big, "max_tokens": 8})
        assert status == 413 and body["error"]["type"] == "request_too_large", body
        # the simulator still serves
        status, _, body = await _request("GET", sim.url + "/v1/models")
        assert status == 200 and body["data"], body


async def test_the_openai_client_reads_the_404() -> None:
    """openai-python takes ``error.message`` from the body (it got the plain text)."""
    async with running_sim("tiny") as sim:
        client = openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)
        try:
            with pytest.raises(openai.NotFoundError) as err:
                await client.models.retrieve("tiny")
        finally:
            await client.close()
    assert isinstance(err.value.body, dict), err.value.body
    assert err.value.body["type"] == "NotFoundError"
    assert "GET /v1/models/tiny" in err.value.message


async def test_a_simulated_4xx_fault_has_the_type_of_its_status() -> None:
    """``X-Sim-Fault: status:404`` answered type InternalServerError (every status other
    than 400 and 429 did)."""
    async with running_sim("tiny") as sim:
        for code, kind in ((404, "NotFoundError"), (401, "AuthenticationError"),
                           (503, "InternalServerError"), (429, "RateLimitError")):
            status, _, body = await _request(
                "POST", sim.url + "/v1/chat/completions", json=chat_body(),
                headers={"X-Sim-Fault": f"status:{code}"})
            assert status == code
            _openai_shape(body, code, kind)
