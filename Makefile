# The two commands of the README. Each creates its own virtualenv (.venv) on first use.
# The embedded model's server (llama-cpp-python) compiles from source the first time:
# about 6 minutes on 2 cores; pip's wheel cache makes later installs quick.
VENV := .venv
BIN := $(VENV)/bin
PYTHON ?= python3

.PHONY: demo test lint format

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev,local]'
	touch $@

# The main job on the embedded defaults: the shipped AlpsBench sample through the whole
# pipeline on the local model, ending in a dataset folder (data/processed/dataset).
demo: $(BIN)/.installed
	$(BIN)/personaemp run --config personaemp.toml

test: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q

format: $(BIN)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .
