"""``limit`` and ``max_age`` are plain ASCII numbers: Python's ``int``/``float`` also took
``1_0``, ``+5``, ``inf`` and other scripts' digits (``٥``), which no client means and a
cache key should not multiply on (an exponent is still taken: ``f"{x:g}"`` writes one).
Over a real admin server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
from test_admin_routes import get, make_server

__all__ = ["make_server"]  # the fixture, used by name

ODD = ["1_0", "+5", "inf", "nan", "٥", "0x5", "5 5", ""]


@pytest.mark.parametrize("raw", ODD)
async def test_odd_numbers_are_refused(make_server: Callable[..., Any], raw: str) -> None:
    srv = await make_server()
    q = quote(raw)
    status, body, _ = await get(f"{srv.url}/llmtop/v1/requests?state=recent&limit={q}")
    assert status == 400 and body["error"] == "limit must be an integer"
    for path in ("requests?state=active&", "snapshot?"):
        status, body, _ = await get(f"{srv.url}/llmtop/v1/{path}max_age={q}")
        assert status == 400 and body["error"].startswith("max_age must be a number"), path


@pytest.mark.parametrize(("limit", "max_age"), [("5", "0.5"), (" 5 ", ".5"), ("0", "5."),
                                                ("10", "0"), ("1", "1e-05"), ("2", "1.5E0")])
async def test_plain_numbers_are_taken(make_server: Callable[..., Any], limit: str,
                                       max_age: str) -> None:
    srv = await make_server()
    status, body, _ = await get(
        f"{srv.url}/llmtop/v1/requests?state=recent&limit={quote(limit)}&max_age={max_age}")
    assert status == 200 and isinstance(body, list)
    status, body, _ = await get(f"{srv.url}/llmtop/v1/snapshot?max_age={max_age}")
    assert status == 200 and "system" in body


async def test_a_negative_limit_says_its_range(make_server: Callable[..., Any]) -> None:
    srv = await make_server()
    status, body, _ = await get(f"{srv.url}/llmtop/v1/requests?state=recent&limit=-1")
    assert status == 400 and "between 0 and" in body["error"]
