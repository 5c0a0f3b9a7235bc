"""Regenerate tests/fixtures/recordings/ from a real session: `llmtop sim` (tiny) behind
llmtop's proxy, three users on the openai SDK, concurrency stepping 1 → 8 (past the
simulator's 4 sequence slots, so queueing and the capacity knee show), recorded with GPU
and engine readings.

    .venv/bin/python tests/recording/make_fixtures.py

Writes ``sim_tiny_ramp.jsonl.gz`` (the whole ramp) and ``sim_tiny_short.jsonl`` (its first
requests, plain text, small enough to read).
"""

from __future__ import annotations

import asyncio
import gzip
import io
import sys
from pathlib import Path

import openai

from llmtop.config import load_config
from llmtop.server import LlmtopServer
from llmtop.sim.server import running_sim

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "recordings"
USERS = ("alice", "bob", "carol")
STEPS = (1, 2, 3, 4, 5, 6, 8)
STEP_S = 4.0


async def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "sim_tiny_ramp.jsonl.gz"
    path.unlink(missing_ok=True)
    async with running_sim("tiny", seed=7) as sim:
        cfg = load_config(None, env={}, overrides={
            "upstream": sim.url, "listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
            "gpu.source": "sim", "gpu.interval_s": 1.0, "engine.interval_s": 1.0,
            "recording.path": str(path), "slo.ttft_s": 0.25, "slo.itl_p95_s": 0.04,
        })
        server = LlmtopServer(cfg, out=io.StringIO())
        await server.start()
        n = [0]
        async with openai.AsyncOpenAI(base_url=server.proxy_url + "/v1", api_key="sk-fixture",
                                      max_retries=0) as client:

            async def user_loop(k: int, until: float) -> None:
                loop = asyncio.get_running_loop()
                while loop.time() < until:
                    i = n[0]
                    n[0] += 1
                    stream = await client.chat.completions.create(
                        model="sim-tiny", max_tokens=12 + (i * 7) % 24, stream=True,
                        messages=[{"role": "user", "content": "tell me a story " * (1 + i % 5)}],
                        extra_headers={"X-LLMTOP-User": USERS[(k + i) % 3]})
                    async for _ in stream:
                        pass

            for conc in STEPS:
                until = asyncio.get_running_loop().time() + STEP_S
                await asyncio.gather(*(user_loop(k, until) for k in range(conc)))
        await asyncio.sleep(1.2)
        await server.stop()
    lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
    short = [ln for ln in lines if b'"type":"request"' in ln][:30]
    (OUT / "sim_tiny_short.jsonl").write_bytes(lines[0] + b"".join(short))
    print(f"{path}: {len(lines)} lines, {path.stat().st_size} bytes; {n[0]} requests",
          file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
