"""The wheel carries everything a run needs: build it, install it alone, run the pipeline.

Slow (marked `slow`, about 10 s): it builds a wheel with pip, makes a virtualenv and runs
`python -m personaemp run` in a child process. It guards against a wheel without its data
files (the prompt templates, default_rules.toml), which the editable install of the other
tests cannot notice because it reads them from the checkout.

The new virtualenv gets only the wheel; a .pth file appends the outer virtualenv's
site-packages to sys.path so the dependencies import. Such a path line is only appended:
the .pth files in that folder, among them the editable-install hook that maps
`personaemp` to the checkout, are not run, so `personaemp` comes from the wheel.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_TASK1, read_jsonl
from fake_openai import FakeOpenAI

pytestmark = pytest.mark.requires_wheel

# Every template of the checkout, subfolders (prompts/compact/) included.
PROMPTS = sorted(path.relative_to(REPO / "prompts").as_posix() for path in (REPO / "prompts").rglob("*.md"))
DATA_FILES = [f"personaemp/prompts/{name}" for name in PROMPTS] + ["personaemp/default_rules.toml"]
REVIEW_ASSETS = ("index.html", "review.js", "dialogue.js", "review.css")
DATA_FILES += [f"personaemp/assets/review/{name}" for name in REVIEW_ASSETS]
# What a wheel is built from; the build runs on a copy so the checkout gets no build/ or *.egg-info.
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "personaemp", "prompts")
# Where the new virtualenv's python finds the package and the prompts it loads by default.
LOCATE = "import personaemp, personaemp.prompts as p; print(personaemp.__file__); print(p.prompts_dir())"
CHILD_ENV_DROPPED = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PERSONAEMP_PROMPTS",
    "PERSONAEMP_WORK_DIR",
    "PERSONAEMP_CONCURRENCY",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "PERSONAEMP_MODEL",
    "HF_TOKEN",
)


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=300, **kwargs)


def can_build_without_isolation() -> bool:
    """Whether the test's own environment has a setuptools that builds wheels (>= 70.1, or
    an older one with the `wheel` package); else pip builds in an isolated environment,
    fetching the backend named in [build-system] from the configured index."""
    try:
        version = tuple(int(part) for part in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    if version >= (70, 1):
        return True
    try:
        importlib.metadata.version("wheel")
    except importlib.metadata.PackageNotFoundError:
        return False
    return version >= (68, 0)


def build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
            shutil.copytree(path, source / name, ignore=ignore)
        else:
            shutil.copy2(path, source / name)
    dist = tmp_path / "dist"
    command = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-w", str(dist), "-q"]
    if can_build_without_isolation():
        command.append("--no-build-isolation")
    result = run(command)
    assert result.returncode == 0, result.stdout + result.stderr
    wheels = list(dist.glob("personaemp-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def make_venv(tmp_path: Path, wheel: Path) -> tuple[Path, Path]:
    """A virtualenv holding only the wheel; the dependencies come from the outer site-packages."""
    venv = tmp_path / "venv"
    result = run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert result.returncode == 0, result.stderr
    python = venv / "bin" / "python"
    query = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(run([str(python), "-c", query]).stdout.strip())
    assert site.is_relative_to(venv), site
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q"]
    result = run([*pip, "--target", str(site), str(wheel)])
    assert result.returncode == 0, result.stdout + result.stderr
    outer = Path(sysconfig.get_paths()["purelib"])
    (site / "_outer_dependencies.pth").write_text(f"{outer}\n", encoding="utf-8")
    return python, site


def child_env(server: FakeOpenAI, home: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in CHILD_ENV_DROPPED}
    env.update(
        OPENAI_BASE_URL=server.base_url,
        OPENAI_API_KEY="sk-test",
        PERSONAEMP_MODEL="fake",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        PYTHONNOUSERSITE="1",
        HF_HOME=str(home / "hf"),
        HF_HUB_DISABLE_TELEMETRY="1",
        NO_COLOR="1",
        COLUMNS="200",
    )
    return env


def write_config(path: Path, data: Path, processed: Path) -> Path:
    # The fake's schema-valid replies are not a good model's: all users get the same Big
    # Five levels (no OOD split) and the queries fail the length and language checks, so
    # only checks that such replies pass decide, and the split is the random one.
    path.write_text(
        f"""[paths]
input = {json.dumps(str(data))}
processed = {json.dumps(str(processed))}

[persona]
limit = 3
require_depth = false

[queries]
enforce = ["memory_ids_valid", "not_duplicate"]

[split]
ood = false

[push]
""",
        encoding="utf-8",
    )
    return path


def test_wheel_ships_the_data_files_and_runs_the_pipeline_when_installed(tmp_path):
    checkout_before = sorted(p.name for p in REPO.iterdir())

    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(DATA_FILES) <= names, sorted(set(DATA_FILES) - names)
    assert "personaemp/prompts/__init__.py" in names

    python, site = make_venv(tmp_path, wheel)
    work = tmp_path / "work"  # the child's cwd: outside the checkout, nothing to import from
    work.mkdir()
    data = work / "task1"
    shutil.copytree(SAMPLE_TASK1, data)
    processed = work / "processed"
    config = write_config(work / "run.toml", data, processed)

    with FakeOpenAI() as server:
        env = child_env(server, tmp_path)
        located = run([str(python), "-c", LOCATE], cwd=work, env=env)
        assert located.returncode == 0, located.stderr
        module, prompts = (Path(line) for line in located.stdout.splitlines())
        assert module.is_relative_to(site), module
        assert prompts.is_relative_to(site), prompts
        assert not module.resolve().is_relative_to(REPO.resolve())

        result = run([str(python), "-m", "personaemp", "run", "--config", str(config)], cwd=work, env=env)
        requests = server.count

    output = result.stdout + result.stderr
    assert "cannot read the prompt" not in result.stderr, output
    assert result.returncode == 0, output
    assert requests > 0
    assert (processed / "personas.jsonl").is_file()
    assert (processed / "queries.jsonl").is_file()
    dataset = processed / "dataset"
    assert dataset.is_dir() and any(dataset.iterdir()), output

    # The recorded prompt hashes are those of the shipped files.
    for persona in read_jsonl(processed / "personas.jsonl"):
        for name in ("persona",):  # the Big Five levels come in the persona reply
            # A step's hash covers its template and shared.md (the preamble and context blocks).
            text = "".join(
                (site / "personaemp" / "prompts" / f"{part}.md").read_text(encoding="utf-8")
                for part in (name, "shared")
            )
            assert persona["provenance"]["prompts"][name] == hashlib.sha256(text.encode()).hexdigest()[:12]

    assert sorted(p.name for p in REPO.iterdir()) == checkout_before  # no build/ left behind
