# `make demo` and `make test` each set up everything they need on a fresh machine (scripts/bootstrap.sh).
.PHONY: setup engine demo test test-fast lint format bench clean

VENV_BIN := .venv/bin
PYTEST_ARGS ?=

setup:
	@bash scripts/bootstrap.sh

# The Docker engine (installed and started if needed) and the offline base image, for the docker tests.
engine: setup
	@bash scripts/docker-engine.sh

# The main job: generate and audit a task pool, supervised warm start, PPO, held-out table (about 10 minutes).
demo: setup
	$(VENV_BIN)/termgym train --preset tiny

# With branch coverage of the termgym package, printed per file and held to the floor in pyproject.toml.
test: setup engine
	$(VENV_BIN)/python -m pytest --cov --cov-report=term $(PYTEST_ARGS)

# Without the slow tests and without Docker: the embedded backend and the pure logic.
test-fast: setup
	$(VENV_BIN)/python -m pytest -m "not slow and not docker" $(PYTEST_ARGS)

# ruff (lint, then the formatter's check) and pyright in basic mode; CI runs it before the tests.
lint: setup
	$(VENV_BIN)/ruff check .
	$(VENV_BIN)/ruff format --check .
	$(VENV_BIN)/pyright

# Apply the formatter and ruff's safe fixes.
format: setup
	$(VENV_BIN)/ruff check --fix .
	$(VENV_BIN)/ruff format .

bench: engine
	$(VENV_BIN)/python bench/step_latency.py
	$(VENV_BIN)/python bench/docker_step.py
	$(VENV_BIN)/python bench/r3_gap.py
	$(VENV_BIN)/python bench/recipe.py
	$(VENV_BIN)/python bench/model_agent.py
	$(VENV_BIN)/python bench/gateway.py
	$(VENV_BIN)/python bench/frameworks.py
	$(VENV_BIN)/python bench/ray_remote.py
	$(VENV_BIN)/python bench/warm_pool.py
	$(VENV_BIN)/python bench/embedded_scale.py
	$(VENV_BIN)/python bench/verification.py
	$(VENV_BIN)/python bench/embedded_images.py

clean:
	rm -rf .venv build *.egg-info .pytest_cache
