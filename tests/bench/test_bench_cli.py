"""`llmtop bench` as users run it: safety, clear errors, JSON, a recording the reader reads."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmtop.sim.server import running_sim


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmtop", "bench", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_refuses_a_remote_target_without_allow_remote() -> None:
    p = bench("http://10.1.2.3:8000", "--requests", "1")
    assert p.returncode == 2
    assert "--allow-remote" in p.stderr and "Traceback" not in p.stderr


def test_bad_arguments_exit_2_with_one_line() -> None:
    for args in (["http://127.0.0.1:1", "--concurrency", "1,x"],
                 ["http://127.0.0.1:1", "--prompt-tokens", "9-3"],
                 ["ftp://127.0.0.1:1"],
                 ["http://127.0.0.1:1", "--workload", "/nonexistent.jsonl"],
                 ["http://127.0.0.1:1", "--duration", "600", "--concurrency", "1,2,4,8,16,32,64"]):
        p = bench(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert "Traceback" not in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_bad_workload_file_is_a_one_line_usage_error(tmp_path: Path) -> None:
    # These used to end in a traceback and exit 1 (UnicodeDecodeError, OverflowError),
    # or call a directory "not found".
    bad = {"binary.jsonl": b'\xff\xfe{"max_tokens": 4, "prompt_tokens": 5}\n',
           "huge_max.jsonl": b'{"max_tokens": 1e400, "prompt_tokens": 5}\n',
           "huge_prompt.jsonl": b'{"max_tokens": 4, "prompt_tokens": -1e400}\n'}
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "dir.jsonl").mkdir()
    for name, says in (("binary.jsonl", "not UTF-8"), ("huge_max.jsonl", ":1: not a workload"),
                       ("huge_prompt.jsonl", ":1: not a workload"),
                       ("dir.jsonl", "is a directory")):
        p = bench("http://127.0.0.1:1", "--workload", str(tmp_path / name), "--requests", "1")
        assert p.returncode == 2, (name, p.stderr)
        assert "Traceback" not in p.stderr and says in p.stderr, (name, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


async def test_json_output_and_recording(tmp_path: Path) -> None:
    rec = tmp_path / "bench.jsonl"
    async with running_sim("tiny") as sim:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llmtop", "bench", sim.url, "--concurrency", "1,2",
            "--requests", "4", "--max-tokens", "8", "--prompt-tokens", "16", "--json",
            "--record", str(rec),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode()
    data = json.loads(out)
    assert [s["level"] for s in data["steps"]] == [1.0, 2.0]
    assert all(s["requests"] >= 4 and s["token_sources"] == {"usage": s["requests"]}
               for s in data["steps"])
    assert "max concurrency meeting" in data["verdict"]
    from llmtop.recording.reader import iter_recording

    lines = list(iter_recording(rec))
    kinds = [type(x).__name__ for x in lines]
    assert kinds.count("RequestRecord") == sum(s["requests"] for s in data["steps"])


async def test_gpu_readings_per_level_through_an_llmtop_proxy() -> None:
    """With --admin pointing at an llmtop proxy, each level carries the GPU readings the
    proxy has (here the simulator's, marked simulated) and the table prints them."""
    from llmtop.config import load_config
    from llmtop.server import LlmtopServer

    async with running_sim("tiny") as sim:
        cfg = load_config(None, env={}, overrides={
            "upstream": sim.url, "listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
            "gpu.source": "sim", "gpu.interval_s": 0.2})
        server = LlmtopServer(cfg)
        await server.start()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "llmtop", "bench", server.proxy_url, "--concurrency", "2",
                "--requests", "4", "--max-tokens", "8", "--admin", server.admin_url,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 90)
        finally:
            await server.stop(1.0)
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    assert "GPU 0 (simulated) at 2: memory" in text and "DRAM bandwidth" in text


async def test_an_admin_url_that_gives_no_readings_is_refused_before_any_load() -> None:
    # `--admin` was never checked: a mistyped or dead admin URL ran the whole bench and
    # printed no GPU readings, with no word why.
    async with running_sim("tiny") as sim:
        for admin, says in (("notaurl", "needs a port"),
                            ("http://127.0.0.1:1", "connection refused"),
                            (sim.url, "HTTP 404")):  # the engine, not an llmtop admin API
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "llmtop", "bench", sim.url, "--requests", "2",
                "--max-tokens", "4", "--admin", admin,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            _, err = await asyncio.wait_for(proc.communicate(), 60)
            text = err.decode()
            assert proc.returncode == 2, text
            assert says in text and len(text.strip().splitlines()) == 1, text
            assert "starting" not in text  # no level began


async def test_an_admin_api_with_a_token_is_asked_with_llmtop_admin_token() -> None:
    """A token-protected admin API gives its readings to a bench that has the token in
    $LLMTOP_ADMIN_TOKEN (as `llmtop attach` takes it); without it, the bench is refused
    before any load with a line that says what to set, and a wrong one is said to be."""
    from llmtop.config import load_config
    from llmtop.server import LlmtopServer

    token = "s3cret-admin-token"
    async with running_sim("tiny") as sim:
        cfg = load_config(None, env={}, overrides={
            "upstream": sim.url, "listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
            "admin_token": token, "gpu.source": "sim", "gpu.interval_s": 0.2})
        server = LlmtopServer(cfg)
        await server.start()
        try:
            runs = []
            for env_token in (token, None, "wrong"):
                env = {k: v for k, v in os.environ.items() if k != "LLMTOP_ADMIN_TOKEN"}
                if env_token is not None:
                    env["LLMTOP_ADMIN_TOKEN"] = env_token
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "llmtop", "bench", server.proxy_url,
                    "--concurrency", "1", "--requests", "2", "--max-tokens", "4",
                    "--admin", server.admin_url, env=env,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
                out, err = await asyncio.wait_for(proc.communicate(), 90)
                runs.append((proc.returncode, out.decode(), err.decode()))
        finally:
            await server.stop(1.0)
    (ok, out, err), (no, _, no_err), (bad, _, bad_err) = runs
    assert ok == 0, err
    assert "GPU 0 (simulated) at 1: memory" in out
    assert no == 2 and "LLMTOP_ADMIN_TOKEN" in no_err and "HTTP 401" in no_err, no_err
    assert bad == 2 and "token was refused" in bad_err, bad_err
    assert token not in out + err + no_err + bad_err


def test_a_recording_that_failed_is_said_and_exits_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # `llmtop bench … --record FILE` on a disk that filled up said "recorded 0 requests to
    # FILE" (the file held 51), no word of the failure, and exited 0.
    import llmtop.recording.writer as writer
    from llmtop.cli import main

    class FullDisk(io.BytesIO):
        def write(self, data: bytes) -> int:  # type: ignore[override]
            if self.tell():  # the header gets through, then the disk is full
                raise OSError(28, "No space left on device")
            return super().write(data)

    monkeypatch.setattr(writer, "_default_opener", lambda p, o: FullDisk())
    sim = subprocess.Popen([sys.executable, "-m", "llmtop", "sim", "--listen", "127.0.0.1:0"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert sim.stdout is not None
        url = sim.stdout.readline().split()[-1]
        assert url.startswith("http://127.0.0.1:"), url
        code = main(["bench", url, "--requests", "3", "--max-tokens", "4",
                     "--record", str(tmp_path / "b.jsonl")])
    finally:
        sim.terminate()
        sim.communicate(timeout=10)
    err = capsys.readouterr().err
    assert code == 1, err
    assert "No space left on device" in err and "Traceback" not in err
