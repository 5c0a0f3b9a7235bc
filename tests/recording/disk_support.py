"""Real failing disks for the recording QA tests (tests/recording/test_rec_qa_real_disk.py):
``llmtop`` children under a low ``RLIMIT_FSIZE`` (writes past it fail with EFBIG), writing
where they may not, or to ``/dev/full`` (ENOSPC) — no fake file objects.

Unprivileged: a child of a root test run loses ``CAP_DAC_OVERRIDE`` and
``CAP_DAC_READ_SEARCH`` (from its bounding set, so its ``exec`` does not give them back):
it stays uid 0 — it can still run the interpreter under /root — but file permissions hold
for it as for any user (root writes through a read-only directory). A non-root run
changes nothing.
A byte-exact tap sits between the proxy and ``llmtop sim``, so a test compares what the
client got with what the engine sent.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
LISTEN_PREFIX = "llmtop: proxy listening on "
ADMIN_PREFIX = "llmtop: admin listening on "
ROOTED = os.geteuid() == 0
_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2
_LIBC = ctypes.CDLL(None, use_errno=True)  # (loaded here: the forked child only calls it)


@contextmanager
def workdir() -> Iterator[Path]:
    """A directory the test's children may read and write, removed afterwards (whatever
    permissions a test left on what it holds)."""
    d = Path(tempfile.mkdtemp(prefix="llmtop-disk-"))
    try:
        yield d
    finally:
        for p in [d, *d.rglob("*")]:  # (a read-only directory a test left)
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(d, ignore_errors=True)


def child_setup(fsize: int | None = None) -> Callable[[], None]:
    """``preexec_fn``: the file size limit, and (under root) file permissions that hold."""

    def setup() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if ROOTED:
            for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
                if _LIBC.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                    raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    return setup


def child_env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"LLMTOP_GPU_SOURCE": "none", "LLMTOP_RECORDING_FLUSH_S": "0.1",
                "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
                "LLMTOP_SALT_FILE": str(work / "salt"), "HOME": str(work)})
    return env


def llmtop(*args: str, work: Path, fsize: int | None = None,
           timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    """One ``llmtop`` command run to its end, as the unprivileged user."""
    return subprocess.run([sys.executable, "-m", "llmtop", *args], capture_output=True,
                          text=True, cwd=ROOT, env=child_env(work), timeout=timeout_s,
                          preexec_fn=child_setup(fsize), check=False)


class Proxy:
    """``llmtop run --headless [--record FILE]`` as a child: stdout and stderr kept apart."""

    def __init__(self, upstream: str, record: Path | None, work: Path, *,
                 fsize: int | None = None, extra: tuple[str, ...] = ()) -> None:
        self.out: list[str] = []
        self.err: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmtop", "run", "--headless", "--upstream", upstream,
             "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
             *(["--record", str(record)] if record is not None else []), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, cwd=ROOT, env=child_env(work), preexec_fn=child_setup(fsize))
        self._listening = threading.Event()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._threads = [threading.Thread(target=self._pump, args=(self.proc.stdout, self.out),
                                          daemon=True),
                         threading.Thread(target=self._pump, args=(self.proc.stderr, self.err),
                                          daemon=True)]
        for t in self._threads:
            t.start()
        self._listening.wait(60)
        self.url = self._found(LISTEN_PREFIX)
        self.admin = self._found(ADMIN_PREFIX)

    def _pump(self, stream: Any, into: list[str]) -> None:
        for raw in iter(stream.readline, ""):
            into.append(raw.rstrip("\n"))
            if self._found(LISTEN_PREFIX) and self._found(ADMIN_PREFIX):
                self._listening.set()
        self._listening.set()

    def _found(self, prefix: str) -> str:
        for line in self.out:
            if line.startswith(prefix):
                return line[len(prefix):].strip()
        return ""

    def stop(self, timeout_s: float = 30) -> int:
        """SIGINT, as Ctrl-C; SIGKILL after ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for t in self._threads:
            t.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return int(self.proc.returncode)

    async def recording(self) -> dict[str, Any] | None:
        async with aiohttp.ClientSession() as s, \
                s.get(self.admin + "/llmtop/v1/recording") as r:
            assert r.status == 200
            body: dict[str, Any] = await r.json()
        rec: dict[str, Any] | None = body["recording"]
        return rec

    async def until(self, ok: Callable[[dict[str, Any]], bool], traffic: Tap,
                    *, max_rounds: int = 60) -> dict[str, Any]:
        """Forward traffic (checked byte for byte) until the recording status is ``ok``."""
        for _ in range(max_rounds):
            st = await self.recording()
            if st is not None and ok(st):  # (None: not yet started, just after listening)
                return st
            await traffic.round(self.url)
            await asyncio.sleep(0.15)  # a writer pass or two (flush_s 0.1)
        raise AssertionError(f"recording status never got there: {await self.recording()}")


class Tap:
    """An upstream in front of the simulator that keeps what the simulator sent, per request
    (``X-Tap-Id``), so the client's bytes can be held to the engine's."""

    def __init__(self, sim_url: str) -> None:
        self.sim_url = sim_url
        self.sent: dict[str, bytes] = {}
        self.url = ""
        self.n = 0
        self.checked = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with aiohttp.ClientSession() as s, s.request(
                request.method, self.sim_url + request.path_qs, data=body or None,
                headers={"Content-Type": request.headers.get("Content-Type", "")}) as up:
            resp = web.StreamResponse(status=up.status)
            resp.content_type = up.content_type
            await resp.prepare(request)
            got = bytearray()
            async for piece in up.content.iter_any():
                got += piece
                await resp.write(piece)
            self.sent[request.headers.get("X-Tap-Id", "")] = bytes(got)
            await resp.write_eof()
            return resp

    async def one(self, proxy_url: str) -> None:
        """One streamed chat completion through the proxy: the client's body must be the
        simulator's, byte for byte."""
        self.n += 1
        tid = f"t{self.n}"
        async with aiohttp.ClientSession() as s, s.post(
                proxy_url + "/v1/chat/completions",
                json={"model": "sim-tiny", "max_tokens": 12, "stream": True,
                      "stream_options": {"include_usage": True},
                      "messages": [{"role": "user", "content": "hi"}]},
                headers={"X-Tap-Id": tid, "X-LLMTOP-User": tid},
                timeout=aiohttp.ClientTimeout(total=30)) as r:
            assert r.status == 200, await r.text()
            got = await r.read()
        assert got == self.sent[tid], (tid, got[-200:], self.sent.get(tid, b"")[-200:])
        assert got.rstrip().endswith(b"data: [DONE]")
        self.checked += 1

    async def round(self, proxy_url: str, n: int = 4) -> None:
        await asyncio.gather(*(self.one(proxy_url) for _ in range(n)))


@asynccontextmanager
async def running_tap(sim_url: str) -> AsyncIterator[Tap]:
    tap = Tap(sim_url)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", tap.handle)  # (the proxy scrapes GET /metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    tap.url = f"http://127.0.0.1:{port}"
    try:
        yield tap
    finally:
        await runner.cleanup()


def no_traceback(*texts: str) -> None:
    for t in texts:
        assert "Traceback" not in t and "Exception ignored" not in t, t
