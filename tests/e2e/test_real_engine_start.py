"""tools/real_engine.py says how llama-server died when it never became healthy: a crash
(this stop's AMX segfault read only "did not become healthy" and a log that stopped
mid-line) is named by its signal, an exit by its code."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from e2e_support import load_real_engine


def fake_server(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "llama-server"
    path.write_text(f"#!/bin/sh\necho 'init: llama threadpool init'\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize(("body", "said"), [
    ("kill -SEGV $$", "it was killed by SIGSEGV"),
    ("exit 3", "it exited with code 3"),
])
def test_a_server_that_dies_at_start_is_named_with_how(
        tmp_path: Path, body: str, said: str) -> None:
    re_ = load_real_engine()
    paths = re_.EnginePaths(server=fake_server(tmp_path, body), model=tmp_path / "m.gguf")
    with pytest.raises(re_.PrepareError) as err:
        re_.start_server(paths, port=0, startup_timeout=10,
                         log_path=tmp_path / "server.log")
    text = str(err.value)
    assert text.startswith(f"llama-server did not become healthy: {said}; its log ends "
                           "with:\n"), text
    assert "llama threadpool init" in text
