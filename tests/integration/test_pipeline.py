"""`personaemp run`: personaemp.config (personaemp.toml, env over file) and the whole pipeline.

Parity between the commands and `run` (same options, defaults, env vars and stage
arguments) is tested in test_options.py.

The end-to-end runs go through the fake OpenAI server with bench/dataset/cost_bench.py's scripted
"capable model" on the shipped AlpsBench sample, into tmp_path, and end with a dataset
folder that `datasets.load_dataset` opens.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_TASK1, clean_environment, order_free_responder, read_jsonl
from fake_openai import FakeOpenAI
from rich.console import Console
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.config import llm_settings, load_config
from personaemp.dataset.options import PersonaOptions
from personaemp.errors import InputError
from personaemp.pipeline import run_pipeline
from personaemp.registry import RunOptions
from personaemp.shared_options import LLMOptions, PathsOptions

SECRET = "sk-test-SecretKeyThatMustNotLeak-42"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    clean_environment(monkeypatch)


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
    assert load_config(None) == RunOptions()


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("[split]\nseeed = 3\n", "seeed"),
        ("[pipeline]\nx = 1\n", "pipeline"),
        ("[llm]\nmodle = 'x'\n", "modle"),
        ("[llm.steps.check]\ntemprature = 0.0\n", "llm.steps.check.temprature"),
        ("[llm.steps.chek]\ntemperature = 0.0\n", "llm.steps.chek"),
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


# --- the engine settings of a run --------------------------------------------------------------


FILE_LLM = """
[paths]
processed = "/somewhere/processed"

[llm]
base_url = ["http://file-endpoint/v1"]
model = "file-model"
concurrency = 3
"""


def test_settings_come_from_the_file_without_env(tmp_path):
    options = load_config(write_config(tmp_path / "p.toml", FILE_LLM), env={})
    settings = llm_settings(options.llm, env={})
    assert settings.base_urls == ["http://file-endpoint/v1"]
    assert settings.model == "file-model"
    assert settings.concurrency == 3
    assert settings.api_key is None
    assert settings.work_dir == Path("/somewhere/processed/.personaemp")


def test_env_overrides_the_file(tmp_path):
    env = {
        "OPENAI_BASE_URL": "http://a.example/v1, http://b.example/v1,",
        "PERSONAEMP_MODEL": "env-model",
        "PERSONAEMP_CONCURRENCY": "5",
        "PERSONAEMP_WORK_DIR": str(tmp_path / "work"),
        "OPENAI_API_KEY": SECRET,
    }
    options = load_config(write_config(tmp_path / "p.toml", FILE_LLM), env=env)
    settings = llm_settings(options.llm, env=env)

    assert settings.base_urls == ["http://a.example/v1", "http://b.example/v1"]
    assert settings.model == "env-model"
    assert settings.concurrency == 5
    assert settings.work_dir == tmp_path / "work"
    assert settings.api_key == SECRET
    assert SECRET not in repr(settings)
    assert SECRET not in json.dumps(settings.public(), default=str)


def test_paths_rebase_the_stage_files_and_explicit_paths_win(tmp_path):
    """[paths] processed moves every default output, and each stage reads the output of
    the stage before it, also when that output was moved."""
    path = write_config(
        tmp_path / "p.toml",
        """
[paths]
input = "raw/in"
processed = "out"

[persona]
output = "elsewhere/personas.jsonl"

[push]
out_dir = "published"
""",
    )
    options = load_config(path, env={})
    assert options.filter.input == "raw/in"
    assert options.filter.output == Path("out/filtered.jsonl")
    assert options.persona.input == Path("out/filtered.jsonl")
    assert options.persona.output == Path("elsewhere/personas.jsonl")
    assert options.queries.input == Path("elsewhere/personas.jsonl")
    assert options.queries.output == Path("out/queries.jsonl")
    assert options.split.input == Path("out/queries.jsonl")
    assert options.split.out_dir == Path("out/splits")
    assert options.push.splits == Path("out/splits")
    assert options.push.out_dir == Path("published")
    assert options.llm.work_dir == Path("out/.personaemp")
    # built in Python, the same rule holds
    built = RunOptions(paths=PathsOptions(processed=Path("out")))
    assert built.persona.input == Path("out/filtered.jsonl") and built.push.out_dir == Path("out/dataset")


def test_env_input_wins_over_the_file(tmp_path):
    text = '[paths]\ninput = "from-paths"\n[filter]\ninput = "from-filter"\n'
    path = write_config(tmp_path / "p.toml", text)
    assert load_config(path, env={}).filter.input == "from-filter"
    assert load_config(path, env={"PERSONAEMP_INPUT": "from-env"}).filter.input == "from-env"


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("", {"PERSONAEMP_CONCURRENCY": "abc"}, "PERSONAEMP_CONCURRENCY must be a whole number, not 'abc'"),
        ("", {"PERSONAEMP_CONCURRENCY": "0"}, "PERSONAEMP_CONCURRENCY must be at least 1"),
        ("[llm]\nconcurrency = 0\n", {}, "p.toml: llm.concurrency must be at least 1"),
        ("[queries]\nenforce = []\n", {}, "p.toml: queries.enforce is empty"),
        ("[queries]\nenforce = ['length_ok', 'bogus']\n", {}, "p.toml: queries.enforce must be"),
        ("[queries]\ncategories = ['ES', 'XX']\n", {}, "p.toml: queries.categories must be 'ES', 'HEQ'"),
        ("[persona]\nlimit = 0\n", {}, "p.toml: persona.limit must be at least 1"),
        ("[split]\nk_min = 5\nk_max = 3\n", {}, "p.toml: split.k_min must be at most split.k_max"),
        ("[push]\nrepo_id = 'a/b'\ndry_run = true\n", {}, "p.toml: push.dry_run and push.repo_id exclude"),
        ("[llm]\nllm = 'remote'\n", {}, "p.toml: llm.llm is 'remote' but no endpoint is set"),
        ("llm = 3\n", {}, "p.toml: llm must be a table"),
    ],
)
def test_bad_values_are_one_line_input_errors(tmp_path, text, env, message):
    path = write_config(tmp_path / "p.toml", text)
    with pytest.raises(InputError) as caught:
        load_config(path, env=env)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_run_with_a_bad_env_var_exits_2_with_one_line(tmp_path, monkeypatch):
    """BUG: `run` turned PERSONAEMP_CONCURRENCY=abc into a ValueError traceback (the CLI exited 2)."""
    monkeypatch.setenv("PERSONAEMP_CONCURRENCY", "abc")
    monkeypatch.chdir(tmp_path)  # nothing may be written, not even by the filter
    result = CliRunner().invoke(app, ["run"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == "Error: PERSONAEMP_CONCURRENCY must be a whole number, not 'abc'"
    assert isinstance(result.exception, SystemExit)
    assert list(tmp_path.iterdir()) == []


def test_run_with_an_empty_enforce_exits_2(tmp_path, monkeypatch):
    """BUG: `enforce = []` silently meant every check."""
    monkeypatch.chdir(tmp_path)
    path = write_config(tmp_path / "p.toml", "[queries]\nenforce = []\n")
    result = CliRunner().invoke(app, ["run", "--config", str(path)])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert "queries.enforce is empty" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.toml"]


# --- the whole pipeline -----------------------------------------------------------------------


@pytest.fixture
def server():
    with FakeOpenAI(responder=order_free_responder()) as fake:
        yield fake
        assert fake.errors == []


def pipeline_config(processed: Path, base_url: str) -> RunOptions:
    return RunOptions(
        paths=PathsOptions(input=str(SAMPLE_TASK1), processed=processed),
        llm=LLMOptions(base_url=[base_url], model="fake"),
        persona=PersonaOptions(limit=8),
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
    quiet.file.flush()
    assert "infer-persona → gen-queries" in (tmp_path / "console.txt").read_text(), "the chained LLM stages"
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
    # the LLM stages are skipped whole (manifest.py), their counts those of the run that made them
    assert second.reports["infer-persona"] is None and second.reports["gen-queries"] is None
    assert second.results["infer-persona"].counts == result.results["infer-persona"].counts
    assert second.results["infer-persona"].counts["done"] == 8  # the persona limit
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
    assert f"wrote {processed / 'dataset'}" in result.stderr
    # The closing line: every stage's wall time, in order, and their total.
    closing = result.stderr.strip().splitlines()[-1]
    stages = "filter", "infer-persona → gen-queries", "split", "stats", r"push \(dry run\)", "total"
    assert re.fullmatch("run: " + " · ".join(f"{name} [0-9.]+ s" for name in stages), closing), closing
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
