"""Coverage-guided fuzzing of the stream parsers with atheris (libFuzzer for Python).

Each input picks a parser (every dialect's stream and body parser, the SSE framer, the
line splitter, the usage-chunk stripper), a maximum event size and a way to split the
bytes into reads. The target checks what tests/reliability/test_rel_fuzz_parsers.py
checks under hypothesis: nothing raises out of ``feed``/``finish``/``filter``/``flush``,
``buffered_bytes`` never exceeds the maximum (twice it for SSE: the unfinished line and the
open event are each bounded by it), the result does not depend on the split,
and the stripper only ever removes a usage event. A violated check raises, and atheris
reports the crashing input.

    .venv/bin/pip install atheris
    .venv/bin/python benchmarks/fuzz_parsers.py --runs 200000     # a bounded run
    .venv/bin/python benchmarks/fuzz_parsers.py --seconds 60

Prints ``fuzz_parsers: N iterations, ... no failures`` at the end of a clean run.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

try:
    import atheris
except ImportError:  # pragma: no cover - optional tool
    print("fuzz_parsers: atheris is not installed (.venv/bin/pip install atheris)",
          file=sys.stderr)
    raise SystemExit(2) from None

with atheris.instrument_imports(include=["llmtop"]):
    from llmtop.proxy.dialects.anthropic import AnthropicBodyParser, AnthropicStreamParser
    from llmtop.proxy.dialects.lines import LineSplitter
    from llmtop.proxy.dialects.ollama import OllamaBodyParser, OllamaStreamParser
    from llmtop.proxy.dialects.openai import (
        OpenAIBodyParser,
        OpenAIStreamParser,
        UsageChunkStripper,
    )
    from llmtop.proxy.dialects.plain import PlainParser
    from llmtop.proxy.dialects.sglang import SGLangBodyParser, SGLangStreamParser
    from llmtop.proxy.dialects.sse import SSEFramer
    from llmtop.proxy.dialects.tgi import TGIBodyParser, TGIStreamParser

PARSERS: list[tuple[str, Callable[[int], Any]]] = [
    ("openai-stream", OpenAIStreamParser), ("openai-body", OpenAIBodyParser),
    ("anthropic-stream", AnthropicStreamParser), ("anthropic-body", AnthropicBodyParser),
    ("ollama-stream", OllamaStreamParser), ("ollama-body", OllamaBodyParser),
    ("tgi-stream", TGIStreamParser), ("tgi-body", TGIBodyParser),
    ("sglang-stream", SGLangStreamParser), ("sglang-body", SGLangBodyParser),
    ("plain", lambda _max: PlainParser()),
]
SSE_PARSERS = (OpenAIStreamParser, AnthropicStreamParser, TGIStreamParser, SGLangStreamParser)
N_KINDS = len(PARSERS) + 3  # + SSE framer, line splitter, usage stripper
iterations = 0
failed = False
RUNS = 0  # set by main(): the iteration at which to print the summary
STARTED = time.perf_counter()


def report(final: bool) -> None:
    took = time.perf_counter() - STARTED
    what = "done" if final else "so far"
    print(f"fuzz_parsers: {iterations} iterations {what} in {took:.1f} s "
          f"({iterations / max(took, 1e-9):,.0f}/s) over {N_KINDS} parsers; no failures",
          flush=True)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    out, last = [], 0
    for p in [*sorted({c % (len(data) + 1) for c in cuts}), len(data)]:
        if p > last:
            out.append(data[last:p])
        last = max(last, p)
    return out


def _parse(make: Callable[[int], Any], limit: int, reads: list[bytes]) -> tuple[Any, ...]:
    p = make(limit)
    # SSE parsers bound the unfinished line and the open event's data each by the limit
    # (sse.py), so they may hold up to twice it; the others hold at most the limit
    limit *= 2 if isinstance(p, SSE_PARSERS) else 1
    events = tokens = 0
    for r in reads:
        n, t = p.feed(r)
        if n < 0 or t < 0:
            raise AssertionError(f"negative counts {n}, {t}")
        events, tokens = events + n, tokens + t
        if p.buffered_bytes > limit:
            raise AssertionError(f"{type(p).__name__} holds {p.buffered_bytes} > {limit}")
    n, t = p.finish()
    for v in (p.model, p.error):
        if v is not None:
            v.encode("utf-8")
    return (events + n, tokens + t, p.usage_completion_tokens, p.usage_prompt_tokens,
            p.model, p.error is None)


def _frame(make: Callable[[], Any], limit: int, reads: list[bytes]) -> tuple[Any, ...]:
    f = make()
    got: list[Any] = []
    for r in reads:
        got.extend(f.feed(r))
        if f.buffered_bytes > limit:
            raise AssertionError(f"{type(f).__name__} holds {f.buffered_bytes} > {limit}")
    tail = f.finish()  # SSEFramer: a list of events; LineSplitter: the last line or None
    got.extend(tail if isinstance(tail, list) else [] if tail is None else [tail])
    return (got, f.error is None)


def _strip(limit: int, reads: list[bytes]) -> bytes:
    s = UsageChunkStripper(limit)
    out = b""
    for r in reads:
        out += s.filter(r)
        if s.buffered_bytes > limit:
            raise AssertionError(f"stripper holds {s.buffered_bytes} > {limit}")
    return out + s.flush()


def target(raw: bytes) -> None:
    global iterations, failed
    iterations += 1
    try:
        _check(raw)
    except BaseException:
        failed = True
        print(f"fuzz_parsers: FAILED at iteration {iterations}", flush=True)
        raise
    if iterations == RUNS:  # libFuzzer ends the process with _exit: report now
        report(True)
    elif iterations % 20_000 == 0:
        report(False)


def _check(raw: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(raw)
    kind = fdp.ConsumeIntInRange(0, N_KINDS - 1)
    limit = fdp.ConsumeIntInRange(16, 4096)
    cuts = [fdp.ConsumeIntInRange(0, 1 << 16) for _ in range(fdp.ConsumeIntInRange(0, 8))]
    data = fdp.ConsumeBytes(fdp.remaining_bytes())
    reads = _split(data, cuts)
    whole = [data] if data else []
    if kind < len(PARSERS):
        make = PARSERS[kind][1]
        a, b = _parse(make, limit, whole), _parse(make, limit, reads)
    elif kind == len(PARSERS):
        a, b = (_frame(lambda: SSEFramer(limit), 2 * limit, whole),
                _frame(lambda: SSEFramer(limit), 2 * limit, reads))
    elif kind == len(PARSERS) + 1:
        a, b = (_frame(lambda: LineSplitter(limit), limit, whole),
                _frame(lambda: LineSplitter(limit), limit, reads))
    else:
        a, b = _strip(limit, whole), _strip(limit, reads)
        if b'"usage"' not in data and a != data:
            raise AssertionError("the stripper changed a stream without a usage event")
    if a != b:
        raise AssertionError(f"result depends on the split: {a!r} != {b!r}")


SEEDS = [
    b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"model\":\"m\"}\n\ndata: [DONE]\n\n",
    b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}\n\n",
    b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":"
    b"{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n",
    b"{\"model\":\"llama\",\"message\":{\"content\":\"hi\"},\"done\":false}\n"
    b"{\"done\":true,\"eval_count\":4}\n",
    b"data: {\"token\":{\"id\":1,\"text\":\"hi\",\"special\":false}}\r\n\r\n",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100_000, help="iterations (default 100000)")
    ap.add_argument("--seconds", type=int, default=0, help="time limit instead of --runs")
    ap.add_argument("--corpus", help="a directory for the corpus (default: seeds only)")
    args = ap.parse_args()
    import os
    import tempfile

    corpus = args.corpus or tempfile.mkdtemp(prefix="fuzz_parsers_")
    for i, seed in enumerate(SEEDS):
        for kind in range(N_KINDS):
            name = os.path.join(corpus, f"seed-{i}-{kind}")
            if not os.path.exists(name):
                with open(name, "wb") as fh:  # kind, limit, no cuts, then the bytes
                    fh.write(bytes([kind, 0, 0, 2, 0]) + seed)
    argv = [sys.argv[0], corpus, "-max_len=8192", "-rss_limit_mb=2048", "-print_final_stats=0"]
    global RUNS, STARTED
    if args.seconds:
        argv.append(f"-max_total_time={args.seconds}")
    else:
        argv.append(f"-runs={args.runs}")
        RUNS = args.runs
    STARTED = time.perf_counter()
    atheris.Setup(argv, target)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
