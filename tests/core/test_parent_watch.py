"""``llmtop.parent_watch``: a child watches only the parent that named itself."""

from __future__ import annotations

import asyncio
import gzip
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp

from llmtop.events import RequestRecord
from llmtop.parent_watch import ENV, child_env
from llmtop.recording.reader import RecordingReader
from llmtop.sim.server import running_sim

PROBE = """
import os
from llmtop.parent_watch import ENV, watch_parent
print(watch_parent(interval_s=0.05), ENV in os.environ)
"""


def probe(value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if value is not None:
        env[ENV] = value
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, timeout=60, check=True).stdout.strip()


def test_only_the_real_parent_is_watched_and_the_variable_is_not_passed_on() -> None:
    assert probe(str(os.getpid())) == "True False"  # this process is the probe's parent
    assert probe("1") == "False False"  # init: not a parent to watch
    assert probe(str(os.getpid() + 100000)) == "False False"  # not its parent
    assert probe("x") == "False False"
    assert probe(None) == "False False"


def test_child_env_names_this_process() -> None:
    assert child_env({"A": "1"}) == {"A": "1", ENV: str(os.getpid())}


# A parent that starts a recording proxy reading its output through pipes, then dies.
PARENT = """
import subprocess, sys, time
from llmtop.parent_watch import child_env
proc = subprocess.Popen(
    [sys.executable, "-m", "llmtop", "run", "--headless", "--upstream", sys.argv[2],
     "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--gpu-source", "none",
     "--record", sys.argv[1]],
    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
    start_new_session=True)
url = proc.stdout.readline().split()[-1]
while "admin listening" not in proc.stdout.readline():
    pass
print(proc.pid, url, flush=True)
time.sleep(60)
"""


async def test_a_child_whose_parent_and_pipes_die_still_closes_its_recording(
        tmp_path: Path) -> None:
    """QA (a TUI's terminal hung up, or the TUI was kill -9'd, with streams open): the
    proxy's shutdown lines went to the dead pipes, EPIPE killed it half way, its recording
    had no footer (gzip: 'unexpected end of file') and its streams were cut. Its output
    now goes to /dev/null first, and the open stream finishes."""
    rec = tmp_path / "r.jsonl.gz"
    async with running_sim("tiny", time_scale=1.0) as sim:
        parent = await asyncio.create_subprocess_exec(
            sys.executable, "-c", PARENT, str(rec), sim.url, stdout=asyncio.subprocess.PIPE)
        assert parent.stdout is not None
        pid_s, url = (await asyncio.wait_for(parent.stdout.readline(), 60)).decode().split()
        child = int(pid_s)
        async with aiohttp.ClientSession() as s:
            resp = await s.post(url + "/v1/chat/completions", json={
                "model": "m", "stream": True, "max_tokens": 60,
                "messages": [{"role": "user", "content": "hi"}]})
            assert resp.status == 200
            await resp.content.readline()  # streaming
            parent.kill()  # the pipes to the child lose their reader with it
            await parent.wait()
            body = await asyncio.wait_for(resp.read(), 30)  # the stream still finishes
        assert body.rstrip().endswith(b"data: [DONE]")
        for _ in range(300):
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            await asyncio.sleep(0.1)
        else:
            os.kill(child, signal.SIGKILL)
            raise AssertionError("the child did not stop")
    with RecordingReader(rec) as r:
        records = [e for e in r if isinstance(e, RequestRecord)]
        assert r.footer is not None, "the recording was not closed"
    assert [x.outcome for x in records] == ["ok"]
    with gzip.open(rec) as f:
        assert f.read()  # a complete gzip stream
