# The two commands of the README. Each creates its own virtualenv (.venv) on first use.
# The embedded model's server (llama-cpp-python) compiles from source the first time:
# about 3 minutes on 2 cores; pip's wheel cache makes later installs quick.
VENV := .venv
BIN := $(VENV)/bin
PYTHON ?= python3
# llama-cpp-python's build, cut to what the server loads (tools/llama-lean.cmake): no
# multimodal library and no llama.cpp "common" library, and no -march=native (pip's wheel
# cache is shared by machines whose CPUs differ; the baseline is AVX2/FMA/F16C). Measured
# on 2 cores (AMD EPYC): the wheel builds in 2 min 43 s instead of 5 min 51 s
# (multimodal off, native off); as shipped, the whole first install took 8 min 50 s.
LLAMA_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$(CURDIR)/tools/llama-lean.cmake

# Let Python cache the bytecode of what it imports (in .venv and __pycache__/, both ignored
# by git): with PYTHONDONTWRITEBYTECODE set, as on some CI images, every test worker and
# every CLI subprocess compiled openai, pydantic, datasets... again (make test: 130 s vs 93 s).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: demo test test-fast record-embedded lint format chromium docs bench

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# Python 3.11's bundled pip 23.2 spends 20 s of CPU resolving this project; pip >= 25
	# resolves it in 12 s, and upgrading itself takes 3 (first install 39 s -> 35 s).
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade 'pip>=25'
	# --no-compile, then compileall on every core: pip byte-compiles one file at a time (25 of
	# 59 s). Compiled here, not on first use: where PYTHONDONTWRITEBYTECODE=1 is set (CI images,
	# containers) Python never writes what it compiles, and every start compiled openai, pydantic
	# and our modules again. Measured (2 cores, load ~16, n=6 starts each of `personaemp --help`,
	# PYTHONDONTWRITEBYTECODE=1): 1.15 s of CPU a start uncompiled, 0.71 s compiled; compiling
	# the venv's 1.6 GB of site-packages and personaemp/ costs 33 s of CPU once (skipped, file by
	# file, when up to date). bench/bytecode_bench.py measures it again.
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --quiet --no-compile --disable-pip-version-check -e '.[dev,local,docs,ray]'
	$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') personaemp >/dev/null || echo "some modules did not byte-compile: they compile when imported"
	touch $@

# The main job on the embedded defaults: the shipped AlpsBench sample through the whole
# pipeline on the local model, ending in a dataset folder (data/processed/dataset).
demo: $(BIN)/.installed
	$(BIN)/personaemp run --config personaemp.toml

# The browser tests of `personaemp review` (tests/e2e/test_review.py) drive Debian's chromium over
# a DevTools pipe, no pip package. Installed once (apt keeps the .debs in its cache); present,
# this is one `command -v`. Not root or no apt: the browser tests are skipped, and say why.
# apt's own lines (about 200: one per package unpacked and set up, which -qq leaves) go to a
# log that is shown only when the install fails.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ echo "installing chromium for the browser tests (once)"; log=$$(mktemp); \
	  if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) \
	     >$$log 2>&1; then echo "chromium installed"; \
	  else tail -n 20 $$log; echo "could not install chromium: the browser tests will be skipped"; fi; \
	  rm -f $$log; }

test: $(BIN)/.installed chromium
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	# The docs site (docs/, mkdocs.yml): a broken link, anchor or API reference fails (2 s).
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site
	$(BIN)/pytest -q -n 3 --dist loadgroup  # 3 workers on 2 cores, one of them the Ray group: see tests/conftest.py

# The edit loop: tests/unit and tests/integration (docs/development.md: the tiers), and of
# them none that needs a heavy resource (markers in pyproject.toml: the embedded model
# decoding, a real Ray, the browser, a wheel built and installed). `make test` runs them all,
# tests/e2e too.
test-fast: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/pytest -q -n 3 --dist loadgroup tests/unit tests/integration -m "not requires_model and not requires_ray and not requires_browser and not requires_wheel"

# The embedded model's replies that the stage tests on `--llm local` replay (tests/cassettes.py,
# tests/cassettes/embedded/), recorded again on the real model, one thread, temperature 0: after a
# change of the model, llama-cpp-python or a prompt (tests/integration/test_cassettes.py says which). Minutes.
record-embedded: $(BIN)/.installed
	PERSONAEMP_RECORD_EMBEDDED=1 $(BIN)/pytest -q -n 0 -p no:cacheprovider -m recorded

format: $(BIN)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The docs site, served with live reload at http://127.0.0.1:8000
docs: $(BIN)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The quick benches (bench/__main__.py), their figures written into docs/benchmarks.md with
# the machine, date and commit; a few minutes on 2 cores. `python -m bench --stale` checks age.
bench: $(BIN)/.installed
	$(BIN)/python -m bench
