# The README's two commands are `make run` and `make test`. Each one creates the
# virtual environment and installs what it needs, so a fresh clone needs nothing first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck unit browser bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/conveyor serve $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP) browser
	$(BIN)/python -m pytest $(PYTEST_ARGS)

browser:
	@scripts/ensure-chromium.sh

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python bench/engine_cost.py
	$(BIN)/python bench/feed_cost.py
	$(BIN)/python bench/e2e.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
