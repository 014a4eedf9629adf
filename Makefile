# The two commands of the README. Each creates its own virtualenv (.venv) on first use.
VENV := .venv
BIN := $(VENV)/bin
PYTHON ?= python3

.PHONY: demo test lint format

$(BIN)/.installed-dev: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

# The main job on the embedded defaults: filter the shipped AlpsBench sample.
demo: $(BIN)/.installed-dev
	$(BIN)/personaemp filter

test: $(BIN)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q

format: $(BIN)/.installed-dev
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .
