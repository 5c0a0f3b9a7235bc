"""``llmtop attach`` to a proxy whose admin API is on ``[::1]`` (tests/core/test_qa_ipv6.py
has the rest of IPv6 end to end): the real ``llmtop run`` and simulator processes, the TUI
in process."""

from __future__ import annotations

import re
from collections.abc import Iterator

import aiohttp
import pytest
from net_support import loopback_v6
from tui_support import screen_text, shows
from views_agree import ADMIN_PREFIX, LISTEN_PREFIX, SIM_PREFIX, Announced, llmtop_cmd, quiet_env

from llmtop.tui.app import LlmtopApp
from llmtop.tui.source import AdminSource, normalize_admin_url


@pytest.fixture
def v6_proxy() -> Iterator[tuple[str, str]]:
    if not loopback_v6():
        pytest.skip("no ::1 on this machine")
    sim = Announced(llmtop_cmd("sim", "--listen", "[::1]:0"), (SIM_PREFIX,), quiet_env())
    try:
        proxy = Announced(
            llmtop_cmd("run", "--headless", "--upstream", sim.found[SIM_PREFIX], "--listen",
                       "[::1]:0", "--admin", "[::1]:0"),
            (LISTEN_PREFIX, ADMIN_PREFIX), quiet_env())
        try:
            yield proxy.found[LISTEN_PREFIX], proxy.found[ADMIN_PREFIX]
        finally:
            proxy.stop()
    finally:
        sim.stop()


async def test_attach_to_a_v6_admin_api(v6_proxy: tuple[str, str]) -> None:
    """``llmtop attach http://[::1]:PORT`` (or ``[::1]:PORT``, no scheme): the TUI shows the
    ``::1`` client as the user and the bracketed addresses in its header."""
    url, admin = v6_proxy
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    async with aiohttp.ClientSession() as s, \
            s.post(f"{url}/v1/chat/completions", json=body) as r:
        assert r.status == 200
    assert normalize_admin_url(admin.removeprefix("http://")) == admin
    app = LlmtopApp(AdminSource([admin]), refresh_hz=10, proxy=url, admin=admin)
    async with app.run_test(size=(160, 48)) as pilot:
        await shows(pilot, " ::1 ")
        line1 = screen_text(app).splitlines()[0]
    assert f"proxy {url}" in line1, line1
    assert f"admin {admin}" in line1 or f"admin :{admin.rpartition(':')[2]}" in line1, line1


async def test_run_with_its_tui_on_v6_names_the_bracketed_proxy() -> None:
    """``llmtop run --listen [::1]:0`` in a terminal, in front of a simulator on ``[::1]``:
    the start-up line and the TUI's header both give the bracketed proxy URL."""
    if not loopback_v6():
        pytest.skip("no ::1 on this machine")
    from pty_support import llmtop_run_in_pty

    from llmtop.sim.server import running_sim

    async with running_sim("tiny", host="::1") as sim:
        run = await llmtop_run_in_pty(sim.url, listen="[::1]:0")
        try:
            text = run.screen().decode(errors="replace")
        finally:
            await run.close()
    printed = re.search(r"llmtop: proxy listening on (http://\[::1\]:[1-9][0-9]*)", text)
    assert printed is not None, text[-2000:]
    assert f"proxy {printed.group(1)}" in text, text[-2000:]
