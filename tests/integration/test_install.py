"""Issue 63 item 9: `make` byte-compiles at install what a start imports (site-packages and
personaemp/), so where PYTHONDONTWRITEBYTECODE=1 is set a start does not compile them again
(measured by bench/bytecode_bench.py: 1.15 vs 0.71 s of CPU per `personaemp --help`)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import REPO


def test_the_install_recipe_compiles_after_pip_installs_without_compiling(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    venv = tmp_path / "venv"
    dry = subprocess.run(["make", "-n", "-B", f"VENV={venv}", f"{venv}/bin/.installed"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    install = next(n for n, line in enumerate(lines) if "pip install" in line and "-e '.[" in line)
    compiled = [n for n, line in enumerate(lines) if "-m compileall" in line]
    assert compiled and compiled[0] > install, "nothing byte-compiles what pip --no-compile installed"
    line = lines[compiled[0]]
    assert 'sysconfig.get_paths()["purelib"]' in line and " personaemp" in line and "-j 0" in line
