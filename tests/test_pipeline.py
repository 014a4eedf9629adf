"""`personaemp run`: personaemp.config (personaemp.toml, env over file) and the whole pipeline.

The end-to-end runs go through the fake OpenAI server with bench/cost_bench.py's scripted
"capable model" on the shipped AlpsBench sample, into tmp_path, and end with a dataset
folder that `datasets.load_dataset` opens.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_TASK1, read_jsonl
from fake_openai import FakeOpenAI
from rich.console import Console
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.config import LLMConfig, PathsConfig, PersonaConfig, RunConfig, llm_settings_from, load_config
from personaemp.errors import InputError
from personaemp.pipeline import run_pipeline

sys.path.insert(0, str(REPO / "bench"))
from cost_bench import responder as capable_responder  # noqa: E402

ENV_NAMES = (
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "PERSONAEMP_MODEL",
    "PERSONAEMP_CONCURRENCY",
    "PERSONAEMP_WORK_DIR",
    "HF_TOKEN",
)
SECRET = "sk-test-SecretKeyThatMustNotLeak-42"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def write_config(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --- load_config ------------------------------------------------------------------------------


def test_shipped_config_loads():
    path = REPO / "personaemp.toml"
    config = load_config(path)
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    assert raw, "the shipped config is empty"
    for section, values in raw.items():
        for name, value in values.items():
            got = getattr(getattr(config, section), name)
            assert (str(got) if isinstance(got, Path) else got) == value, f"{section}.{name}"
    assert config.push.repo_id is None  # the shipped run is a dry run


def test_llm_max_tokens_is_a_setting_not_a_secret(tmp_path):
    path = write_config(tmp_path / "p.toml", "[llm]\nmax_tokens = 512\n")
    assert load_config(path).llm.max_tokens == 512


def test_no_config_file_gives_the_defaults():
    assert load_config(None) == RunConfig()


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("[split]\nseeed = 3\n", "seeed"),
        ("[pipeline]\nx = 1\n", "pipeline"),
        ("[llm]\nmodle = 'x'\n", "modle"),
    ],
)
def test_unknown_key_is_an_input_error_naming_it(tmp_path, text, name):
    path = write_config(tmp_path / "p.toml", text)
    with pytest.raises(InputError) as caught:
        load_config(path)
    assert name in str(caught.value)
    assert str(path) in str(caught.value)


def test_wrong_type_is_an_input_error(tmp_path):
    path = write_config(tmp_path / "p.toml", "[persona]\nlimit = 'many'\n")
    with pytest.raises(InputError, match="persona.limit"):
        load_config(path)


def test_invalid_toml_is_an_input_error(tmp_path):
    path = write_config(tmp_path / "p.toml", "[llm\nmodel = \n")
    with pytest.raises(InputError, match="not valid TOML"):
        load_config(path)


@pytest.mark.parametrize(("section", "name"), [("llm", "api_key"), ("llm", "openai_api_key")])
def test_api_key_in_the_file_is_refused(tmp_path, section, name):
    path = write_config(tmp_path / "p.toml", f'[{section}]\nmodel = "m"\n{name} = "{SECRET}"\n')
    with pytest.raises(InputError, match="secrets") as caught:
        load_config(path)
    assert SECRET not in str(caught.value)
    assert "OPENAI_API_KEY" in str(caught.value)


def test_missing_config_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no such config file"):
        load_config(tmp_path / "absent.toml")


# --- llm_settings_from ------------------------------------------------------------------------


def file_config() -> RunConfig:
    return RunConfig(
        paths=PathsConfig(processed=Path("/somewhere/processed")),
        llm=LLMConfig(base_url=["http://file-endpoint/v1"], model="file-model", concurrency=3),
    )


def test_settings_come_from_the_file_without_env():
    settings = llm_settings_from(file_config())
    assert settings.base_urls == ["http://file-endpoint/v1"]
    assert settings.model == "file-model"
    assert settings.concurrency == 3
    assert settings.api_key is None
    assert settings.work_dir == Path("/somewhere/processed/.personaemp")


def test_env_overrides_the_file(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://a.example/v1, http://b.example/v1,")
    monkeypatch.setenv("PERSONAEMP_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)

    settings = llm_settings_from(file_config())

    assert settings.base_urls == ["http://a.example/v1", "http://b.example/v1"]
    assert settings.model == "env-model"
    assert settings.api_key == SECRET
    assert SECRET not in repr(settings)
    assert SECRET not in json.dumps(settings.public(), default=str)


# --- the whole pipeline -----------------------------------------------------------------------


def order_free_responder(seed: int = 7):
    """cost_bench's capable model, with each reply drawn from the request itself, so the
    replies do not depend on the order concurrent requests arrive in."""

    def answer(body: dict, number: int):
        digest = hashlib.sha256(json.dumps(body["messages"], sort_keys=True).encode()).hexdigest()
        return capable_responder(random.Random(f"{seed}:{digest}"))(body, number)

    return answer


@pytest.fixture
def server():
    with FakeOpenAI(responder=order_free_responder()) as fake:
        yield fake
        assert fake.errors == []


def pipeline_config(processed: Path, base_url: str) -> RunConfig:
    return RunConfig(
        paths=PathsConfig(input=str(SAMPLE_TASK1), processed=processed),
        llm=LLMConfig(base_url=[base_url], model="fake"),
        persona=PersonaConfig(limit=8),
    )


def load(folder: Path, config: str, cache: Path):
    from datasets import load_dataset

    return load_dataset(str(folder), config, cache_dir=str(cache), download_mode="force_redownload")


def split_files(splits: Path) -> dict[str, bytes]:
    return {str(p.relative_to(splits)): p.read_bytes() for p in sorted(splits.rglob("*.jsonl"))}


def test_pipeline_end_to_end_then_resumes_without_requests(tmp_path, server):
    processed = tmp_path / "processed"
    config = pipeline_config(processed, server.base_url)
    quiet = Console(file=open(tmp_path / "console.txt", "w"))  # noqa: SIM115

    result = run_pipeline(config, quiet)

    assert server.count > 0
    for name in ("filtered.jsonl", "filter_report.json", "personas.jsonl", "queries.jsonl"):
        assert (processed / name).is_file(), name
    assert (processed / ".personaemp" / "run_report.json").is_file()
    personas = read_jsonl(processed / "personas.jsonl")
    assert len(personas) == 8  # the persona limit
    splits = processed / "splits"
    assert (splits / "split_report.json").is_file()
    for setting in ("random", "ood"):
        for split in ("train", "test"):
            assert (splits / setting / f"{split}.jsonl").is_file()
    dataset = processed / "dataset"
    assert (dataset / "README.md").is_file()
    assert len(list(dataset.glob("*/*.parquet"))) == 4

    queries = {row["user_id"]: row for row in read_jsonl(processed / "queries.jsonl")}
    for setting in ("random", "ood"):
        data = load(dataset, setting, tmp_path / f"cache-{setting}")
        for split in ("train", "test"):
            users = read_jsonl(splits / setting / f"{split}.jsonl")
            expected = sum(len(queries[u["user_id"]]["queries"]) for u in users)
            assert expected > 0
            assert len(data[split]) == expected
            assert result.reports["push"].rows[setting][split] == expected
            assert set(data[split]["user_id"]) == {u["user_id"] for u in users}

    # a second run: everything is resumed or cached, nothing changes
    before = server.count
    first_splits = split_files(splits)
    second = run_pipeline(config, quiet)

    assert server.count == before
    assert split_files(splits) == first_splits
    stages = json.loads((processed / ".personaemp" / "run_report.json").read_text())["stages"]
    assert stages["infer-persona"]["done"] == 0 and stages["infer-persona"]["done_before"] == 8
    assert stages["gen-queries"]["done"] == 0
    assert second.reports["push"].rows == result.reports["push"].rows


def test_run_cli_with_a_config_file(tmp_path, server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    processed = tmp_path / "processed"
    path = write_config(
        tmp_path / "personaemp.toml",
        f"""
[paths]
input = "{SAMPLE_TASK1}"
processed = "{processed}"

[llm]
base_url = ["{server.base_url}"]
model = "fake"
concurrency = 4

[persona]
limit = 8

[split]
seed = 13
ood = true
""",
    )

    result = CliRunner().invoke(app, ["run", "--config", str(path)])

    assert result.exit_code == 0, result.output
    assert server.count > 0
    assert {r.body["model"] for r in server.chat_requests} == {"fake"}
    assert all(r.headers.get("authorization") == f"Bearer {SECRET}" for r in server.chat_requests)
    assert (processed / "dataset" / "README.md").is_file()
    assert "dataset:" in result.stderr
    data = load(processed / "dataset", "ood", tmp_path / "cache")
    assert len(data["train"]) > 0 and len(data["test"]) > 0
    assert SECRET not in result.output
    for file in processed.rglob("*"):
        if file.is_file():
            assert SECRET.encode() not in file.read_bytes(), file


def test_run_cli_with_a_bad_config_exits_2(tmp_path):
    path = write_config(tmp_path / "personaemp.toml", "[paths]\nimput = 'x'\n")
    result = CliRunner().invoke(app, ["run", "--config", str(path)])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("Error:")
    assert "imput" in result.stderr
    assert "Traceback" not in result.output
