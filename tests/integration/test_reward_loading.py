"""The reward as the trainers load it: verl 0.9's file loader (a fresh module name, nothing
put in sys.modules), `pkg://personaemp.reward`, and its errors in Python's words."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest
from fake_openai import FakeOpenAI
from test_reward import expected, judge, row, verl_config

import personaemp.reward as public
from personaemp.errors import InputError
from personaemp.llm.settings import LLMSettings
from personaemp.training.reward import PereGRM


def load_as_verl_09(path: str, name: str = "custom_module"):
    """verl 0.9.1's load_extern_object for a file path: spec_from_file_location under a fresh
    name, module_from_spec, exec_module; the module is *not* registered in sys.modules."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert name not in sys.modules
    return module


def test_the_documented_reward_file_loads_under_verl_09s_loader(tmp_path, monkeypatch):
    """The docs' `custom_reward_function.path`: personaemp.reward's file. Loaded as verl 0.9
    loads it (no sys.modules entry), its dataclasses did not import before (AttributeError)."""
    with FakeOpenAI(responder=judge) as server:
        verl_config(server, tmp_path, monkeypatch)
        loaded = load_as_verl_09(public.__file__)
        score = loaded.compute_score(
            data_source="personaemp", solution_str="an answer", ground_truth="", extra_info=row("q2")
        )
    assert score == pytest.approx(expected("q2"))
    assert loaded.PereGRM is PereGRM  # the package's own objects, not copies


def test_pkg_form_imports_the_same_functions():
    module = importlib.import_module("personaemp.reward")
    assert module.compute_score is importlib.import_module("personaemp.training.reward").compute_score


def test_a_sampling_error_names_the_joint_step_in_pythons_words(tmp_path):
    settings = LLMSettings(
        base_urls=["http://127.0.0.1:9/v1"], model="m", work_dir=tmp_path,
        steps={"judge_joint": {"temperature": 0.0}},
    )  # fmt: skip
    with pytest.raises(InputError) as raised:
        PereGRM(settings, samples=4, joint=True)  # as docs/training.md writes it
    text = str(raised.value)
    assert "step judge_joint" in text and 'steps={"judge_joint": {"temperature": 0.3}}' in text
    assert "--step" not in text and "--samples" not in text


def test_the_same_error_speaks_flags_on_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from personaemp.cli import app

    result = CliRunner().invoke(
        app,
        ["evaluate", "--dynamic", "--samples", "3", "--step", "judge_dynamic.temperature=0",
         "--responses", str(tmp_path / "r.jsonl"), "--criteria", str(tmp_path / "c.jsonl"),
         "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--splits", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--samples 3" in result.stderr and "--step judge_dynamic.temperature=0.3" in result.stderr


def test_a_trainers_worker_reads_the_whole_config_without_the_cli(tmp_path):
    """A verl/TRL worker imports only the reward: the shipped personaemp.toml's stage sections
    ([filter], [persona]...) are known there too. Before: "[filter] is not a known section"
    once the sections moved beside their stages and only the registry gathered them."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    code = (
        "import sys; from personaemp.training.reward import from_config; "
        "reward = from_config(sys.argv[1], env={'PERSONAEMP_BASE_URL': 'http://127.0.0.1:9/v1', "
        "'PERSONAEMP_MODEL': 'judge'}); print(type(reward).__name__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(repo / "personaemp.toml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
