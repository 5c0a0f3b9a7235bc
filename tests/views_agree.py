"""Three views of one run, gathered for the agreement tests: ``llmtop bench``'s (its JSON
summary and its recording), the proxy's (``llmtop run --headless``: its recording, admin
snapshot, ``/metrics`` and ``llmtop report`` of the recording) and, when the engine can
say, the engine's own. Shared by tests/bench/test_qa_bench_agrees_with_proxy.py (the
simulator) and tests/e2e/test_e2e_qa_bench_agrees.py (llama.cpp); importable from any test
folder (pytest puts ``tests/`` on ``sys.path`` for its ``conftest.py``).

Everything here runs llmtop as users do: separate processes, real sockets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
LISTEN_PREFIX = "llmtop: proxy listening on "
ADMIN_PREFIX = "llmtop: admin listening on "
SIM_PREFIX = "llmtop: sim listening on "


def llmtop_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmtop", *args]


def quiet_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"LLMTOP_GPU_SOURCE": "none", "LLMTOP_RECORDING_FLUSH_S": "0.1",
                "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


class Announced:
    """A long-running llmtop child whose start-up lines name its addresses."""

    def __init__(self, cmd: list[str], prefixes: tuple[str, ...], env: dict[str, str],
                 preexec_fn: Callable[[], None] | None = None):
        self.lines: list[str] = []
        self.found: dict[str, str] = {}
        self._prefixes = prefixes
        self._ready = threading.Event()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, env=env, cwd=ROOT,
                                     preexec_fn=preexec_fn)
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()
        self._ready.wait(60)
        if set(prefixes) - self.found.keys():
            self.stop()
            raise RuntimeError(f"{cmd[3:5]} did not announce its addresses:\n"
                               + "\n".join(self.lines[-30:]))

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, ""):
            line = raw.rstrip("\n")
            self.lines.append(line)
            for prefix in self._prefixes:
                if line.startswith(prefix) and prefix not in self.found:
                    self.found[prefix] = line[len(prefix):].strip()
            if not set(self._prefixes) - self.found.keys():
                self._ready.set()
        self._ready.set()

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGINT (a user's Ctrl-C); SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._thread.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return int(self.proc.returncode)


def start_sim(*args: str) -> tuple[Announced, str]:
    sim = Announced(llmtop_cmd("sim", "--listen", "127.0.0.1:0", *args), (SIM_PREFIX,),
                    quiet_env())
    return sim, sim.found[SIM_PREFIX]


def start_proxy(upstream: str, record: Path, **env: str) -> tuple[Announced, str, str]:
    proxy = Announced(
        llmtop_cmd("run", "--upstream", upstream, "--listen", "127.0.0.1:0",
                   "--admin", "127.0.0.1:0", "--record", str(record), "--headless"),
        (LISTEN_PREFIX, ADMIN_PREFIX), quiet_env(**env))
    return proxy, proxy.found[LISTEN_PREFIX], proxy.found[ADMIN_PREFIX]


@dataclass
class BenchRun:
    """One ``llmtop bench … --json --record FILE`` run: its JSON and its recording."""

    args: list[str]
    code: int
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    stderr: str


def bench(url: str, record: Path, *args: str, timeout_s: float = 90.0) -> BenchRun:
    argv = ["bench", url, *args, "--record", str(record), "--json"]
    p = subprocess.run(llmtop_cmd(*argv), capture_output=True, text=True, cwd=ROOT,
                       env=quiet_env(), timeout=timeout_s, check=False)
    assert p.returncode == 0, f"llmtop {' '.join(argv)} exited {p.returncode}:\n{p.stderr}"
    return BenchRun(argv, p.returncode, json.loads(p.stdout), requests_of(record), p.stderr)


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def requests_of(path: Path) -> list[dict[str, Any]]:
    return [r for r in read_lines(path) if r.get("type") == "request"]


def report(path: Path, *args: str) -> dict[str, Any]:
    p = subprocess.run(llmtop_cmd("report", str(path), "--format", "json", *args),
                       capture_output=True, text=True, cwd=ROOT, env=quiet_env(), timeout=60,
                       check=False)
    assert p.returncode == 0, p.stderr
    out: dict[str, Any] = json.loads(p.stdout)
    return out


async def get_json(url: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def get_text(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.text()


def prom_values(text: str) -> dict[str, float]:
    """``name{labels} value`` lines of a Prometheus exposition, keyed by name and labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


@dataclass
class Level:
    """One bench level and the proxy records that fall inside it."""

    step: dict[str, Any]
    client: list[dict[str, Any]]
    proxy: list[dict[str, Any]] = field(default_factory=list)


def split_by_level(runs: list[BenchRun], proxy: list[dict[str, Any]]) -> list[Level]:
    """Bench's levels, each with the proxy records whose t0 lies within the level's span
    (bench starts a level only once the previous one has ended, so spans do not overlap; a
    proxy t0 comes after the client's send and before its end)."""
    levels: list[Level] = []
    for run in runs:
        for n, step in enumerate(run.summary["steps"]):
            # the recording's request lines come level by level, in step order
            start = sum(s["requests"] for s in run.summary["steps"][:n])
            client = run.records[start:start + step["requests"]]
            levels.append(Level(step, client))
    left = list(proxy)
    for lv in levels:
        lo = min(r["t_start"] for r in lv.client)
        hi = max(r["t_start"] + r["e2e_s"] for r in lv.client)
        lv.proxy = [r for r in left if lo <= r["t_start"] <= hi]
        left = [r for r in left if r not in lv.proxy]
    assert not left, f"{len(left)} proxy records belong to no bench level: {left[:2]}"
    return levels


def completion_sum(records: list[dict[str, Any]]) -> int:
    return sum(r["completion_tokens"] or 0 for r in records)


def prompt_sum(records: list[dict[str, Any]]) -> int:
    return sum(r["prompt_tokens"] or 0 for r in records)
