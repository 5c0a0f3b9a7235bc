"""`llmtop bench` loads this machine without --allow-remote: its loopback addresses, and also
the addresses of its own interfaces (its LAN address, its link-local address with a zone).

Before, only 127/8, ::1 and localhost passed the check, and a user benchmarking an engine
that listens on the host's own address (a container's port published on the LAN address, a
link-local address) was told "is not this machine". The check exists so that a mistyped
URL does not load somebody else's server; an address a socket here can bind to is no one
else's. No DNS is asked: a host name other than localhost still needs --allow-remote."""

from __future__ import annotations

import asyncio
import json
import socket
import sys

import pytest
from net_support import link_local_v6

from llmtop.config import is_this_machine
from llmtop.sim.server import running_sim


def own_ipv4() -> str | None:
    """A non-loopback IPv4 address of this machine: the source address a route to a
    documentation address would use (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))
        except OSError:
            return None
        addr: str = s.getsockname()[0]
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


OWN_V4 = own_ipv4()
LINK_LOCAL = link_local_v6()


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.9.9.9", "::1", "[::1]"])
def test_loopback_is_this_machine(host: str) -> None:
    assert is_this_machine(host)


@pytest.mark.parametrize("host", ["10.255.254.253", "203.0.113.77", "2001:db8::77",
                                  "example.com", "127.0.0.1.nip.io", "fe80::1%no-such-if0", ""])
def test_other_hosts_are_not(host: str) -> None:
    assert not is_this_machine(host)


@pytest.mark.skipif(OWN_V4 is None, reason="no non-loopback IPv4 address here")
def test_an_address_of_this_machines_own_interface_is_this_machine() -> None:
    assert OWN_V4 is not None
    assert is_this_machine(OWN_V4)


@pytest.mark.skipif(LINK_LOCAL is None, reason="no link-local IPv6 address here")
@pytest.mark.parametrize("written", ["%25", "%"])
def test_own_link_local_with_its_zone_is_this_machine(written: str) -> None:
    assert LINK_LOCAL is not None
    assert is_this_machine(LINK_LOCAL.replace("%", written, 1))


async def _bench(url: str, *extra: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmtop", "bench", url, "--concurrency", "1", "--requests", "2",
        "--max-tokens", "4", "--json", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.skipif(OWN_V4 is None, reason="no non-loopback IPv4 address here")
async def test_bench_runs_against_this_machines_lan_address_without_allow_remote() -> None:
    assert OWN_V4 is not None
    async with running_sim("tiny", host=OWN_V4) as sim:
        assert OWN_V4 in sim.url
        code, out, err = await _bench(sim.url)
    assert code == 0, err
    step = json.loads(out)["steps"][0]
    assert step["requests"] == 2 and step["errors"] == 0, step


async def test_bench_still_refuses_another_machine_without_allow_remote() -> None:
    code, _, err = await _bench("http://203.0.113.77:8000")
    assert code == 2
    assert "is not this machine" in err and "--allow-remote" in err
    assert len(err.strip().splitlines()) == 1, err
