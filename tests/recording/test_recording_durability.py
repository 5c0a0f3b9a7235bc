"""Durability and back-pressure: kill -9 loses at most the last second; a disk slower than
the traffic never blocks the publisher — lines are dropped and counted instead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from rec_helpers import T0, FakeDisk, FullDisk, request

from llmtop.events import RequestRecord
from llmtop.recording.reader import RecordingReader
from llmtop.recording.writer import Recorder

CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from llmtop.bus import EventBus
    from llmtop.events import RequestRecord
    from llmtop.recording.writer import Recorder

    async def main(path):
        bus = EventBus()
        rec = Recorder(path, header={"upstream": "http://child"}, flush_s=1.0)
        rec.start()
        bus.subscribe(rec.on_events)
        pump = asyncio.create_task(bus.pump(0.05))
        i = 0
        while True:
            now = time.time()
            bus.publish(RequestRecord(
                id=f"q{i}", user="u", model="m", dialect="openai", path="/v1/completions",
                stream=True, status=200, outcome="ok", t_start=now - 0.5, ttft_s=0.1,
                e2e_s=0.5, prompt_tokens=10, completion_tokens=20, token_source="usage",
                chunk_offsets_s=(0.1, 0.3, 0.5), chunk_tokens=(1, 10, 9)))
            print(f"q{i} {now!r}", flush=True)
            i += 1
            await asyncio.sleep(0.01)

    asyncio.run(main(sys.argv[1]))
    """
)


class Pauses:
    """A thread sleeping 10 ms at a time, noting each sleep that took 50 ms longer: when
    this process was not running (a paused machine pauses the child with it)."""

    def __init__(self) -> None:
        self.gaps: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = time.time()
        while not self._stop.wait(0.01):
            now = time.time()
            if now - last > 0.06:
                self.gaps.append((last + 0.01, now))
            last = now

    def lost(self, lo: float, hi: float) -> float:
        """Seconds of [lo, hi] the sleeper lost."""
        self._stop.set()
        self._thread.join()
        return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in self.gaps)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_kill_9_loses_at_most_the_last_second(tmp_path: Path, suffix: str) -> None:
    """What a request line needs is the writer's next passes — the hold, then a write and a
    flush, within 0.875 s of being queued — so 'the last second' is of running time: a
    pause of the machine in the last second before the kill (the child stopped with this
    process: 'q165 missing' after a 0.5 s one) adds its length to what may be lost."""
    path = tmp_path / f"killed{suffix}"
    finished: dict[str, float] = {}
    pauses = Pauses()
    with subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE,
                          text=True) as proc:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        first: float | None = None
        for line in proc.stdout:  # ~2.5 s of steady traffic (more, if paused: 200 lines)
            rid, t = line.split()
            finished[rid] = float(t)
            first = first or float(t)
            if (float(t) - first > 2.5 and len(finished) >= 200) or time.monotonic() > deadline:
                break
        kill_t = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        for line in proc.stdout.read().splitlines():
            rid, t = line.split()
            finished[rid] = float(t)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    lost = pauses.lost(kill_t - 3.0, kill_t)
    must_have = {rid for rid, t in finished.items() if t < kill_t - 1.0 - lost}
    assert len(must_have) > 50
    with RecordingReader(path) as r:
        got = {e.id for e in r if isinstance(e, RequestRecord)}
        assert r.footer is None  # killed: no footer
        assert r.truncated_lines <= 1
    missing = must_have - got
    assert not missing, (f"{len(missing)} requests finished >1 s before the kill are missing "
                         f"(paused {lost:.2f} s)")


class SlowFile(FakeDisk):
    """A file whose every write after the header (start() writes that one) takes `delay`
    seconds, or until `release` is set: a disk slower than the traffic."""

    def __init__(self, path: Path, delay: float) -> None:
        super().__init__(path)
        self.delay = delay
        self.release = threading.Event()

    def write(self, data: bytes) -> int:
        if self.writes:
            self.release.wait(self.delay)
        return super().write(data)


def test_slow_disk_never_blocks_publishing_and_counts_drops(tmp_path: Path) -> None:
    path = tmp_path / "slow.jsonl"
    sinks: list[SlowFile] = []

    def opener(p: Path, overwrite: bool) -> SlowFile:
        # a write takes 10 s while the test publishes (1.5 s): a publisher that waited for
        # one would be held past the loop's end, 5+ s over the bound below, which leaves
        # room for a stalled machine (with 0.3 s writes and a 0.1 s bound, a 0.1 s pause of
        # the test process inside on_events read as blocking)
        sinks.append(SlowFile(p, delay=10.0))
        return sinks[0]

    rec = Recorder(path, header={"upstream": "u"}, queue_max=500, flush_s=0.2,
                   opener=opener)  # type: ignore[arg-type]
    rec.start()
    durations: list[float] = []
    total = 0
    t_end = time.monotonic() + 1.5
    i = 0
    while time.monotonic() < t_end:
        batch = [request(i + k, T0 + i + k) for k in range(100)]
        i += 100
        t = time.perf_counter()
        rec.on_events(batch)
        durations.append(time.perf_counter() - t)
        total += len(batch)
        time.sleep(0.005)
    st = rec.status()
    sinks[0].release.set()
    assert st["dropped"] > 0 and st["dropped_requests"] == st["dropped"]
    # one slow write takes 10 s; publishing never waited for one
    assert max(durations) < 2.0, f"on_events blocked for {max(durations):.3f} s"
    final = rec.stop()
    assert final["dropped"] >= st["dropped"]
    assert final["requests"] + final["dropped_requests"] == total
    with RecordingReader(path) as r:
        n = sum(1 for e in r if isinstance(e, RequestRecord))
        assert r.footer is not None
        assert r.footer["dropped"] == final["dropped"]
        assert r.footer["requests"] == n == final["requests"]


def test_write_error_is_reported_not_raised(tmp_path: Path) -> None:
    """A disk that fails (full, unplugged): the error shows in status, events are counted as
    dropped, the writer thread survives and stop() still returns."""

    def opener(p: Path, overwrite: bool) -> FullDisk:
        return FullDisk(p)

    rec = Recorder(tmp_path / "full.jsonl", header={}, flush_s=0.1,
                   opener=opener)  # type: ignore[arg-type]
    rec.start()
    rec.on_events([request(i, T0 + i) for i in range(10)])
    for _ in range(100):
        if rec.status()["error"]:
            break
        threading.Event().wait(0.02)
    st = rec.stop()
    assert st["error"] and "No space left" in st["error"]
    assert st["dropped"] == 10 and st["requests"] == 0


async def test_kill_9_of_a_recording_proxy_mid_session(tmp_path: Path) -> None:
    """`llmtop run --headless --record` in front of the simulator, steady traffic from the
    openai SDK, then kill -9: every request the client saw finish more than a second before
    the kill is in the recording."""
    import asyncio
    import re

    import openai

    from llmtop.sim.server import running_sim

    path = tmp_path / "proxy.jsonl.gz"
    async with running_sim("tiny", seed=5) as sim:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llmtop", "run", "--headless", "--upstream", sim.url,
            "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--gpu-source", "none",
            "--record", str(path), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        assert proc.stdout is not None
        proxy_url = ""
        try:
            while not proxy_url:
                line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
                assert line, "llmtop run exited before listening"
                m = re.search(r"proxy listening on (http://\S+)", line)
                proxy_url = m.group(1) if m else ""
            finished: dict[str, float] = {}
            stop = asyncio.Event()
            async with openai.AsyncOpenAI(base_url=proxy_url + "/v1", api_key="sk-x",
                                          max_retries=0) as client:

                async def worker(w: int) -> None:
                    i = 0
                    while not stop.is_set():
                        user = f"w{w}-{i}"
                        i += 1
                        try:
                            stream = await client.chat.completions.create(
                                model="sim-tiny", max_tokens=8, stream=True,
                                messages=[{"role": "user", "content": "hi"}],
                                extra_headers={"X-LLMTOP-User": user})
                            async for _ in stream:
                                pass
                        except openai.APIError:
                            return  # the proxy was killed under us
                        finished[user] = time.time()

                workers = [asyncio.create_task(worker(w)) for w in range(3)]
                await asyncio.sleep(3.0)
                kill_t = time.time()
                proc.kill()  # SIGKILL
                await proc.wait()
                stop.set()
                await asyncio.gather(*workers, return_exceptions=True)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    must_have = {u for u, t in finished.items() if t < kill_t - 1.0}
    assert len(must_have) >= 10
    with RecordingReader(path) as r:
        got = {e.user for e in r if isinstance(e, RequestRecord)}
        assert r.footer is None
    missing = must_have - got
    assert not missing, f"{len(missing)} of {len(must_have)} requests finished >1 s before " \
                        "the kill are missing from the recording"
