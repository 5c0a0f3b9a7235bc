"""``llmtop run --headless --record STEM --rotate-mb MB [--keep N]``, a real proxy process:
rotation from the command line, over what the environment says (flag > environment, as
every flag). Parts of 10 kB fill with a few rounds of traffic through the byte-exact tap."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from disk_support import Proxy, Tap, no_traceback
from rec_helpers import feed
from test_recording_rotation import check_chain, parts_of, read_part, rotating

pytestmark = pytest.mark.timeout(240)


async def test_rotate_mb_from_the_flag(work: Path, tap: Tap,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``--rotate-mb 0.01``: several parts, each complete, chained, every request once,
    while the environment says 1000 MB (a part that would never close)."""
    monkeypatch.setenv("LLMTOP_RECORDING_ROTATE_MB", "1000")
    stem = work / "flag.jsonl"
    proxy = Proxy(tap.url, stem, work, extra=("--rotate-mb", "0.01"))
    try:
        await proxy.until(lambda s: s["part"] >= 3, tap, max_rounds=120)
    finally:
        code = proxy.stop()
    out, err = "\n".join(proxy.out), "\n".join(proxy.err)
    assert code == 0, (out, err)
    no_traceback(out, err)
    parts = parts_of(work, "flag")
    assert len(parts) >= 3 and not stem.exists()
    assert len(check_chain(parts)) == tap.checked
    assert any(f"recording {stem} in {len(parts)} parts" in ln for ln in proxy.out), out


async def test_keep_from_the_flag_trims_the_parts(work: Path, tap: Tap,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``--rotate-mb 0.01 --keep 2`` (the environment's keep 50 overruled): once part 4 is
    open, only the two newest parts are left, the oldest deleted."""
    monkeypatch.setenv("LLMTOP_RECORDING_KEEP", "50")
    stem = work / "kept.jsonl"
    proxy = Proxy(tap.url, stem, work, extra=("--rotate-mb", "0.01", "--keep", "2"))
    try:
        await proxy.until(lambda s: s["part"] >= 4, tap, max_rounds=160)
    finally:
        code = proxy.stop()
    out, err = "\n".join(proxy.out), "\n".join(proxy.err)
    assert code == 0, (out, err)
    no_traceback(out, err)
    parts = parts_of(work, "kept")
    numbers = [read_part(p)[0]["part"] for p in parts]
    assert len(parts) == 2 and numbers[0] >= 3 and numbers == [numbers[0], numbers[0] + 1], (
        numbers, out)
    # the summary says the parts are gone, not only how many there were
    said = [ln for ln in proxy.out if f"recording {stem} in {numbers[1]} parts" in ln]
    assert len(said) == 1 and f"the oldest {numbers[1] - 2} deleted by keep 2)" in said[0], out


async def test_a_restart_says_what_keep_deleted_at_start(work: Path, sim_url: str) -> None:
    """A proxy restarted with ``--keep 2`` where an earlier run left 4+ parts: keep
    deletes all but the newest at once (with its own first part, 2) — said on the start
    line, not silent (a restart with a smaller keep deleting hours of recordings)."""
    stem = work / "again.jsonl"
    first = rotating(stem, rotate_bytes=3000)
    feed(first, 120)
    first.stop()
    run1 = parts_of(work, "again")
    assert len(run1) >= 4, run1
    proxy = Proxy(sim_url, stem, work, extra=("--rotate-mb", "1", "--keep", "2"))
    try:
        for _ in range(300):  # (the recording starts just after the proxy listens)
            if await proxy.recording() is not None:
                break
            await asyncio.sleep(0.1)
    finally:
        code = proxy.stop()
    out, err = "\n".join(proxy.out), "\n".join(proxy.err)
    assert code == 0, (out, err)
    no_traceback(out, err)
    assert [p for p in run1 if p.exists()] == run1[-1:]
    said = [ln for ln in proxy.out if ln.startswith(f"llmtop: recording to {stem} in parts")]
    assert len(said) == 1, out
    assert f"(keep 2: deleted the oldest {len(run1) - 1} parts an earlier run left)" in said[0]


async def test_the_exit_line_counts_an_earlier_runs_parts_deleted_later(work: Path,
                                                                        tap: Tap) -> None:
    """``--keep 3`` where an earlier run left 4+ parts: the first part's opening deletes all
    but its 2 newest (the start line says so), and the next parts delete those 2 as they
    take their place. The exit line counts these too; they were said nowhere (the exit
    line counted only this run's own parts past keep)."""
    stem = work / "later.jsonl"
    first = rotating(stem, rotate_bytes=3000)
    feed(first, 120)
    first.stop()
    run1 = parts_of(work, "later")
    assert len(run1) >= 4, run1
    proxy = Proxy(tap.url, stem, work, extra=("--rotate-mb", "0.01", "--keep", "3"))
    try:
        await proxy.until(lambda s: s["part"] >= 3, tap, max_rounds=160)
    finally:
        code = proxy.stop()
    out, err = "\n".join(proxy.out), "\n".join(proxy.err)
    assert code == 0, (out, err)
    no_traceback(out, err)
    assert not any(p.exists() for p in run1)
    started = [ln for ln in proxy.out if ln.startswith(f"llmtop: recording to {stem} in parts")]
    assert len(started) == 1, out
    assert f"(keep 3: deleted the oldest {len(run1) - 2} parts an earlier run left)" \
        in started[0]
    said = [ln for ln in proxy.out if ln.startswith(f"llmtop: recording {stem} in ")]
    assert len(said) == 1 and "2 more parts an earlier run left" in said[0], out
