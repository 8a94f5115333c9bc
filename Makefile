# `make demo` and `make test` each set up everything they need on a fresh machine (scripts/bootstrap.sh).
.PHONY: setup demo test test-fast bench clean

VENV_BIN := .venv/bin
PYTEST_ARGS ?=

setup:
	@bash scripts/bootstrap.sh

demo: setup
	$(VENV_BIN)/termgym demo

test: setup
	$(VENV_BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(VENV_BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

bench: setup
	$(VENV_BIN)/python bench/step_latency.py

clean:
	rm -rf .venv build *.egg-info .pytest_cache
