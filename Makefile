# llmtop — two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck unit e2e-engine screenshots bench clean

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

test: lint typecheck unit

screenshots: $(STAMP)
	$(PY) tools/screenshots.py

bench: $(STAMP)
	$(PY) benchmarks/sim_firehose.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
