"""End-to-end fixtures: a real llama.cpp ``llama-server`` with a real model, and
``llmtop run --headless`` in front of it.

The engine is prepared (built once per machine into ``${LLMTOP_CACHE:-~/.cache/llmtop}``,
see ``tools/real_engine.py``) after collection and before the first test, outside any
test's timeout, and only when a selected test needs it. The build's progress is shown
live. If preparation fails, every test that needs the engine FAILS with the reason — they
are never skipped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import LlmtopProcess, load_real_engine

HERE = Path(__file__).resolve().parent
real_engine = load_real_engine()

_prepared: dict[str, Any] = {}


def _in_e2e(item: pytest.Item) -> bool:
    return HERE in Path(str(item.path)).resolve().parents


def _needs_engine(item: pytest.Item) -> bool:
    return _in_e2e(item) and "engine" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _in_e2e(item):
            item.add_marker(pytest.mark.e2e)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build/fetch the engine before the tests run (a first build takes minutes)."""
    if session.config.option.collectonly or not any(_needs_engine(i) for i in session.items):
        return
    capman = session.config.pluginmanager.getplugin("capturemanager")
    shown = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    with shown:
        try:
            _prepared["paths"] = real_engine.prepare()
        except real_engine.PrepareError as exc:
            _prepared["error"] = str(exc)
            print(f"\n[real_engine] FAILED: {exc}", flush=True)


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A running llama-server (``-np 4 -c 8192 --metrics --slots``), stopped at session end."""
    if "error" in _prepared:
        pytest.fail(f"the real engine could not be prepared: {_prepared['error']}", pytrace=False)
    try:
        paths = _prepared.get("paths") or real_engine.prepare()
        log = tmp_path_factory.mktemp("engine") / "llama-server.log"
        # the lowest CPU priority: on a CPU-only machine the engine's compute thread must
        # give way at once whenever the proxy or the test client wakes to timestamp a chunk
        # (on a GPU it would not compete with them at all)
        server = real_engine.start_server(paths, log_path=log, nice=19)
    except real_engine.PrepareError as exc:
        pytest.fail(f"the real engine could not be started: {exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def llmtop(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlmtopProcess]:
    """``llmtop run --headless`` in front of the engine, recording every request."""
    record = tmp_path_factory.mktemp("llmtop") / "e2e.jsonl"
    proc = LlmtopProcess(engine.url, record)
    yield proc
    code = proc.stop()
    assert code == 0, "llmtop run --headless did not exit cleanly:\n" + "\n".join(proc.lines)
