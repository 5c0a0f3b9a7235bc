"""``llmtop sim`` as a user runs it: a real subprocess."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys

import aiohttp
import pytest

from llmtop.cli import main as cli_main

CMD = [sys.executable, "-m", "llmtop", "sim"]


async def _start(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        *CMD, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().strip()
    prefix = "llmtop: sim listening on "
    assert line.startswith(prefix), line
    return proc, line.removeprefix(prefix)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_starts_answers_and_exits_cleanly(sig: signal.Signals) -> None:
    proc, url = await _start("--listen", "127.0.0.1:0", "--set", "max_num_seqs=2",
                             "--set", "time_scale=0.5")
    try:
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/health") as r:
                assert r.status == 200
            async with s.get(url + "/sim/state") as r:
                assert (await r.json())["running"] == 0
            # an open stream must not hold up shutdown
            stream = await s.post(url + "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000,
                "stream": True})
            await stream.content.readline()
            proc.send_signal(sig)
            rc = await asyncio.wait_for(proc.wait(), 20)
            stream.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert rc == 0
    assert proc.stderr is not None
    err = (await proc.stderr.read()).decode()
    assert "Traceback" not in err


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CMD, *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_bad_profile_is_one_line_exit_2() -> None:
    res = _run("--profile", "h100-nope")
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0
    assert "unknown sim profile 'h100-nope'" in res.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "max_num_seqs=lots"], "sim parameter max_num_seqs must be a number"),
    (["--set", "max_num_seqs=nan"], "sim parameter max_num_seqs must be a finite number"),
    (["--set", "base_step_s=inf"], "sim parameter base_step_s must be a finite number"),
    (["--set", "bogus=1"], "unknown sim parameter 'bogus'"),
    (["--set", "noequals"], "--set 'noequals' must look like KEY=VALUE"),
    (["--listen", "nowhere"], "--listen 'nowhere' must be HOST:PORT"),
    (["--listen", "127.0.0.1:99999"], "port must be 0..65535"),
    (["--listen", "::1"], "an IPv6 address goes in brackets"),  # was "port '1' ..." at bind
    (["--listen", "[::1]"], "--listen '[::1]' must be HOST:PORT"),
])
def test_bad_arguments_in_process(args: list[str], message: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["sim", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmtop sim: error: ") and message in err
    assert err.count("\n") == 1


def test_port_in_use_is_one_line_exit_2() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = _run("--listen", f"127.0.0.1:{port}")
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0
    assert f"cannot listen on 127.0.0.1:{port}" in res.stderr
    assert "in use" in res.stderr


def test_help_lists_profiles_and_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli_main(["sim", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for word in ("tiny", "h200-llama8b", "max_num_seqs", "time_scale", "tokens_per_chunk",
                 "X-Sim-Fault", "--firehose", "--set KEY=VALUE"):
        assert word in out


async def _stop(proc: asyncio.subprocess.Process) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            proc.kill()
    return await proc.wait()


async def test_reuse_port_lets_several_simulators_serve_one_port() -> None:
    first, url = await _start("--listen", "127.0.0.1:0", "--firehose", "--reuse-port")
    port = url.rsplit(":", 1)[1]
    second = None
    try:
        # a plain second bind of that port fails; one that asks to share it is served
        res = await asyncio.to_thread(_run, "--listen", f"127.0.0.1:{port}")
        assert res.returncode == 2 and "in use" in res.stderr
        second, url2 = await _start("--listen", f"127.0.0.1:{port}", "--firehose",
                                    "--reuse-port", "--seed", "7")
        assert url2 == url
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        # a fresh connection each: the kernel picks a process for each; an odd number, so
        # the two counts always differ (10 and 10 read as one count: CI failed on it once)
        for _ in range(21):
            async with aiohttp.ClientSession() as s, \
                    s.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
        # each process answers with its own ground truth: two different counts adding to 21
        served: set[int] = set()
        for _ in range(40):
            async with aiohttp.ClientSession() as s, s.get(url + "/sim/requests") as r:
                served.add(len(await r.json()))
            if len(served) == 2:
                break
        assert len(served) == 2 and sum(served) == 21 and 0 not in served
        assert await _stop(first) == 0
        # the port is still served, by the second
        async with aiohttp.ClientSession() as s, \
                s.post(url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
    finally:
        await _stop(first)
        if second is not None:
            assert await _stop(second) == 0
