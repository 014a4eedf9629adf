"""`run` takes any stage option with --set and says which key a stage flag is; a config
saved with a byte order mark is read (issue 44: "a newcomer's second run")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_TASK1, clean_environment

from personaemp.config import load_config, read_config, set_flags
from personaemp.errors import InputError


def personaemp(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "personaemp", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=cwd,
    )


def test_set_gives_run_any_key_of_any_section_over_the_file(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[persona]\nlimit = 5\n[llm]\ntemperature = 0.0\n")
    options = load_config(
        config, env={}, settings=["persona.limit=2", "llm.base-url=http://a/v1", "llm.base_url=http://b/v1"]
    )
    assert options.persona.limit == 2  # over the file
    assert options.llm.temperature == 0.0  # the file, where --set says nothing
    assert options.llm.base_url == ["http://a/v1", "http://b/v1"]  # a list key: once per value
    assert load_config(config, env={}).persona.limit == 5


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("persona.limt=2", "[persona] has no key 'limt' — its keys: input, output, limit"),
        ("personas.limit=2", "[personas] is not a known section"),
        ("persona.limit", "--set takes SECTION.KEY=VALUE (e.g. persona.limit=8), not 'persona.limit'"),
        ("llm.steps=check", "llm.steps is a table — give --set llm.steps.STEP.KEY=VALUE or a [llm.steps.…]"),
        ("llm.model.name=x", "llm.model is not a table"),
        (
            "llm.vllm.engine.hf_token=hf_x",
            "secrets do not belong on the command line (llm.vllm.engine.hf_token)",
        ),
    ],
)
def test_set_refuses_what_is_not_a_key_in_one_line(item, message):
    with pytest.raises(InputError) as caught:
        set_flags([item])
    assert message in str(caught.value)


def test_set_reads_a_value_as_the_config_file_does():
    """Before (issue 51): `--set 'persona.users=["a","b"]'` was split on its commas into the
    users '["a"' and '"b"]'. Now a TOML value is a list, a string, a table; a bare word is text
    and the documented comma form still splits."""
    options = load_config(None, env={}, settings=[
        'persona.users=["sess_a", "sess_b"]', 'llm.model="gpt-4o-mini"', "llm.temperature=0.5",
        "queries.categories=ES,HEQ", "split.seed=7",
        "llm.vllm.engine.max_model_len=8192", "llm.vllm.engine.dtype=bfloat16",
        "llm.vllm.processor={batch_size = 64}", "llm.steps.check.temperature=0", "push.repo_id=me/data",
    ])  # fmt: skip
    assert options.persona.users == ["sess_a", "sess_b"]
    assert options.llm.model == "gpt-4o-mini" and options.llm.temperature == 0.5
    assert options.queries.categories == ["ES", "HEQ"] and options.split.seed == 7
    assert options.llm.vllm == {
        "engine": {"max_model_len": 8192, "dtype": "bfloat16"},
        "processor": {"batch_size": 64},
    }
    assert options.llm.step_sampling() == {"check": {"temperature": 0.0}}
    assert options.push.repo_id == "me/data"
    # A number for a text key stays the text written (a file would need quotes).
    assert load_config(None, env={}, settings=["llm.model=1.5"]).llm.model == "1.5"


def test_a_bad_value_given_with_set_is_named_as_given(tmp_path):
    with pytest.raises(InputError, match=r"--set persona.limit must be at least 1"):
        load_config(None, env={}, settings=["persona.limit=0"])


def test_run_given_a_stage_flag_says_which_key_it_is(tmp_path):
    """Before: "No such option: --limit" and nothing else, though the README said run takes
    the stage options."""
    result = personaemp(tmp_path, "run", "--limit", "3")
    assert result.returncode == 2
    text = " ".join(result.stderr.replace("│", " ").split())
    # issue 63: persona.limit first (extract-memories runs only on a conversation log)
    assert "--limit is persona.limit, queries.limit, extract.limit for run: --set persona.limit=..." in text
    help_text = personaemp(tmp_path, "run", "--help").stdout
    assert "--set" in help_text and "extract-memories" in help_text


def test_a_config_with_a_byte_order_mark_is_read(tmp_path):
    """Before: "not valid TOML (Invalid statement (at line 1, column 1))" for a file saved by Notepad."""
    config = tmp_path / "personaemp.toml"
    config.write_bytes(b"\xef\xbb\xbf" + (REPO / "personaemp.toml").read_bytes())
    assert read_config(config)["persona"]["require_depth"] is False


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ('[run]\nexecutor = "ray"\n', "write [llm] executor"),  # as the Ray issue first spelled it
        ("[run]\nworkers = 4\nray_address = 'ray://h:10001'\n", "write [llm] ray_address, [llm] workers"),
        ("[foo]\nbar = 1\n", "use paths, extract, filter, persona"),
        ("[run]\ninput = 'x'\n", "use paths, extract, filter, persona"),  # a key of many sections
    ],
)
def test_an_unknown_section_says_where_its_keys_live(tmp_path, text, hint):
    path = tmp_path / "personaemp.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match="is not a known section") as caught:
        read_config(path)
    assert caught.value.hint.startswith(hint)


def options_run_gets(monkeypatch, tmp_path, *args: str):
    """What `personaemp run ARGS` hands its pipeline (the pipeline itself is not run here:
    tests/e2e/test_ray.py runs the documented commands whole)."""
    from typer.testing import CliRunner

    from personaemp import pipeline
    from personaemp.cli import app

    clean_environment(monkeypatch)
    given = []
    monkeypatch.setattr(pipeline, "run_pipeline", lambda options, console: given.append(options))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", *args], env={"NO_COLOR": "1", "COLUMNS": "200"})
    return (given[0] if given else None), result


def test_run_takes_the_llm_options_as_flags_as_every_llm_stage(monkeypatch, tmp_path):
    """Before (issue 51): `run --executor ray` stopped at "No such option: --executor", and so
    did --base-url, --model, --workers, --concurrency, --llm, --vllm."""
    (tmp_path / "my.toml").write_text("[llm]\nconcurrency = 4\ntemperature = 0.2\n[persona]\nlimit = 3\n")
    options, result = options_run_gets(
        monkeypatch, tmp_path, "--config", "my.toml", "--base-url", "http://a:8000/v1", "--base-url",
        "http://b:8000/v1", "--model", "m", "--executor", "ray", "--workers", "2", "--concurrency", "64",
        "--ray-address", "ray://head:10001", "--price-in", "0.5", "--price-out", "2", "--max-cost", "3",
        "--set", "persona.limit=2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    llm = options.llm
    assert llm.base_url == ["http://a:8000/v1", "http://b:8000/v1"] and llm.model == "m"
    assert (llm.executor, llm.workers, llm.concurrency, llm.ray_address) == ("ray", 2, 64, "ray://head:10001")
    assert (llm.price_in, llm.price_out, llm.max_cost) == (0.5, 2.0, 3.0)
    assert llm.temperature == 0.2 and options.persona.limit == 2  # the file, and --set over it

    options, result = options_run_gets(
        monkeypatch, tmp_path, "--executor", "ray", "--llm", "vllm", "--model", "Qwen/Qwen2.5-7B-Instruct",
        "--vllm", "engine.max_model_len=16384", "--vllm", "processor.batch_size=64", "--estimate",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert options.llm.vllm == {"engine": {"max_model_len": 16384}, "processor": {"batch_size": 64}}
    assert options.llm.llm == "vllm" and options.llm.estimate


def test_a_bad_run_flag_is_named_by_its_flag_and_a_key_given_twice_is_refused(monkeypatch, tmp_path):
    _, result = options_run_gets(monkeypatch, tmp_path, "--workers", "0")
    assert result.exit_code == 2 and "--workers must be at least 1" in result.output
    _, result = options_run_gets(monkeypatch, tmp_path, "--executor", "ray")
    assert result.exit_code == 2 and "--executor is 'ray' but no endpoint is set" in result.output
    assert "give --base-url" in result.output
    _, result = options_run_gets(monkeypatch, tmp_path, "--model", "a", "--set", "llm.model=b")
    assert result.exit_code == 2 and "--model and --set llm.model both give llm.model" in result.output


def test_run_with_an_endpoint_and_no_model_stops_before_any_stage(tmp_path, monkeypatch):
    """Before: the filter ran and wrote its files, then infer-persona said "no model given"."""
    from typer.testing import CliRunner

    from personaemp.cli import app

    clean_environment(monkeypatch)
    monkeypatch.chdir(tmp_path)
    given = ["run", "--set", f"paths.input={SAMPLE_TASK1}", "--base-url", "http://127.0.0.1:9/v1"]
    result = CliRunner().invoke(app, given, env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 2 and "no model given for the endpoint" in result.output
    assert not (tmp_path / "data").exists()  # nothing written
