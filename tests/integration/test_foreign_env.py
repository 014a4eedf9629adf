"""Issue 63 item 14: the test suite never spends the developer's money. With the README's
exports (and invalid PERSONAEMP_* values) in the shell, a slice of the suite run in a child
pytest sends nothing to that endpoint and passes (bench/foreign_env.py; the whole suite:
`python bench/foreign_env.py -- make test`)."""

from __future__ import annotations

import os
import sys

from conftest import REPO, foreign_environment, isolate_environment

sys.path.insert(0, str(REPO / "bench"))
from foreign_env import run_foreign  # noqa: E402

# The files that sent requests (and the key) to the shell's endpoint before conftest isolated
# every test: 108 requests and 5 failures with the README's exports, 32 failures with invalid
# PERSONAEMP_* values. test_options: the env-over-config tests. test_new_stage: a CLI subprocess.
SLICE = [
    "tests/integration/test_budget.py",
    "tests/integration/test_reward_loading.py",
    "tests/integration/test_new_stage.py",
]


def test_the_isolation_clears_every_personaemp_variable_the_key_and_the_endpoint():
    shell = {
        "OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://x", "HF_TOKEN": "t", "PERSONAEMP_MODEL": "m",
        "PERSONAEMP_ANYTHING_NEW": "1", "HTTPS_PROXY": "http://proxy", "PERSONAEMP_MODEL_CACHE": "/models",
        "PATH": "/bin", "PERSONAEMP_LOCAL_THREADS": "8",
    }  # fmt: skip
    isolate_environment(shell)
    assert not foreign_environment(shell)
    assert shell["PATH"] == "/bin" and shell["PERSONAEMP_MODEL_CACHE"] == "/models"
    assert shell["PERSONAEMP_LOCAL_THREADS"] == "1" and "OPENAI_API_KEY" not in shell
    assert not foreign_environment(os.environ)  # this process: isolated by pytest_configure


def test_a_slice_of_the_suite_sends_nothing_to_the_shells_endpoint():
    """The README's three exports (valid values: before, 108 requests reached the endpoint).
    Invalid PERSONAEMP_* values are bench/foreign_env.py's default, for the whole suite."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *SLICE]
    status, requests = run_foreign(command, cwd=REPO, timeout=600, invalid=False)
    assert requests == []
    assert status == 0
