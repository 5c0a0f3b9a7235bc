"""QA of ``llmtop bench``'s command line: a malformed URL (bad IPv6 literal, port out of
range) is a one-line usage error, not a traceback or a run of failed requests; a level
listed twice is refused; --search runs given levels in ascending order, each once."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from llmtop.cli import main
from llmtop.sim.server import running_sim


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:99999",
                                 "http://127.0.0.1:abc"])
def test_malformed_url_is_one_line_usage_error(url: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", url, "--requests", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"llmtop bench: error: URL '{url}' is not a valid URL"), err


@pytest.mark.parametrize("args", [["--concurrency", "2,1,2"], ["--rate", "1,0.5,1"]])
def test_a_level_listed_twice_is_refused(args: list[str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "http://127.0.0.1:1", *args, "--requests", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "more than once" in err, err


async def test_search_runs_levels_in_ascending_order_once() -> None:
    """--search --concurrency 4,1 --max-level 4: runs 1 and 4, not 4, 1, 2 and 4 again."""
    async with running_sim("tiny") as sim:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "llmtop", "bench", sim.url, "--search", "--concurrency",
            "4,1", "--max-level", "4", "--requests", "2", "--max-tokens", "4",
            "--slo", "ttft=10,itl=10", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    levels = [s["level"] for s in json.loads(out)["steps"]]
    assert levels == [1, 4], levels
