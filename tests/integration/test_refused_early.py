"""Issue 63 items 15 and 19: a value given for a key-like name is never shown; values refused
at option time, not after the filter; nothing left behind by a run whose input is missing;
an error naming 10,000 ids stays short; `python -m bench --stale` tells what it cannot know."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_TASK1

from personaemp.config import load_config, set_flags
from personaemp.errors import InputError


def personaemp(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "personaemp", *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=cwd)  # fmt: skip


# --- 15: a secret echoed back --------------------------------------------------------------------


@pytest.mark.parametrize(
    "item",
    [
        "llm.api_key=sk-live-SECRET-9f8e",
        "llm.vllm.engine.hf_token=hf_SECRET-9f8e",
        "llm.password=SECRET-9f8e",
    ],
)
def test_set_never_shows_a_value_given_for_a_key_like_name(item):
    with pytest.raises(InputError) as caught:
        set_flags([item])
    assert "SECRET-9f8e" not in str(caught.value)
    assert "secrets do not belong on the command line" in str(caught.value)
    assert "[redacted]" in str(caught.value)


def test_the_cli_refusal_of_a_key_on_the_command_line_does_not_print_it(tmp_path):
    done = personaemp(tmp_path, "run", "--set", "llm.api_key=sk-live-SECRET-9f8e")
    assert done.returncode == 2
    assert "SECRET-9f8e" not in done.stdout + done.stderr
    assert "llm.api_key=[redacted]" in done.stderr


def test_a_judge_spec_with_a_key_does_not_print_it():
    spec = "name=a;api_key=sk-live-SECRET-7a7a;bad"
    with pytest.raises(InputError) as caught:
        load_config(None, env={}, settings=[f"evaluate.judges={spec!r}"]).evaluate  # noqa: B018
    assert "SECRET-7a7a" not in str(caught.value) and "api_key=[redacted]" in str(caught.value)


# --- 19: refused too late ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ('persona.users=["a", "b"', "Unclosed array"),
        ('llm.model="gpt-4o-mini', "Unterminated string"),
        ("llm.vllm.processor={batch_size = 64", "not a TOML value"),
    ],
)
def test_bad_toml_in_set_is_an_error_not_text(item, problem):
    with pytest.raises(InputError) as caught:
        set_flags([item])
    assert "not a TOML value" in str(caught.value) and problem in str(caught.value)


def test_bare_words_in_set_stay_text():
    options = load_config(None, env={}, settings=["llm.model=gpt-4o-mini", "queries.categories=ES,HEQ"])
    assert options.llm.model == "gpt-4o-mini" and options.queries.categories == ["ES", "HEQ"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["llm.temperature=inf"], "temperature"),
        (["llm.timeout=nan"], "timeout"),
        (["llm.steps.check.temperature=inf"], "temperature"),
        (["llm.base_url=file:///etc/passwd", "llm.model=m"], "takes an http:// or https:// endpoint"),
        (["llm.base_url=ftp://host/v1", "llm.model=m"], "takes an http:// or https:// endpoint"),
    ],
)
def test_an_infinite_number_or_a_non_http_endpoint_is_refused_at_option_time(settings, message):
    with pytest.raises(InputError) as caught:
        load_config(None, env={}, settings=settings).llm  # noqa: B018
    assert message in str(caught.value)


def test_a_non_http_endpoint_is_refused_before_the_filter_runs(tmp_path):
    done = personaemp(tmp_path, "run", "--set", f"paths.input={SAMPLE_TASK1}", "--base-url", "file:///etc/passwd",
                      "--model", "m", "--set", "paths.processed=out")  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "takes an http:// or https:// endpoint" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_missing_input_leaves_nothing_in_a_fresh_output_folder(tmp_path):
    done = personaemp(tmp_path, "run", "--set", f"paths.input={tmp_path / 'nowhere'}", "--base-url",
                      "http://127.0.0.1:9/v1", "--model", "m", "--set", "paths.processed=out")  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "nowhere: no such file or folder" in done.stderr
    assert not (tmp_path / "out").exists()  # before: personas.jsonl, queries.jsonl, locks, the cache


def test_an_error_naming_ten_thousand_ids_is_one_short_line(tmp_path):
    from personaemp.io import pick_units

    wanted = [f"user-{i:05d}" for i in range(10_000)]
    with pytest.raises(InputError) as caught:
        pick_units(["a", "b"], tmp_path / "personas.jsonl", users=wanted)
    message = str(caught.value)
    assert len(message) < 400 and "\n" not in message
    assert "user-00000, user-00001" in message and "and 9,990 more" in message


# --- 19: python -m bench --stale -----------------------------------------------------------------


def bench_main():
    spec = importlib.util.spec_from_file_location("bench_main_for_tests", REPO / "bench" / "__main__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page(folder: Path, state: dict | None) -> Path:
    docs = folder / "benchmarks.md"
    marker = f"<!-- bench:state {json.dumps(state)} -->\n" if state is not None else ""
    docs.write_text("# Benchmarks\n\n" + marker, encoding="utf-8")
    return docs


def test_stale_without_git_history_says_it_cannot_tell(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    bench = bench_main()
    docs = page(tmp_path, {"engine": "73c086e", "cost": "73c086e"})
    assert bench.stale(None, docs, tmp_path) == 1
    out = capsys.readouterr().out
    assert "all current" not in out and "cannot tell" in out and "2 not known" in out


def test_stale_without_its_doc_or_marker_says_so(tmp_path, capsys):
    bench = bench_main()
    assert bench.stale(None, tmp_path / "missing.md", REPO) == 1
    assert "missing" in capsys.readouterr().out
    assert bench.stale(None, page(tmp_path, None), REPO) == 1
    assert "marker" in capsys.readouterr().out


def test_stale_honours_name_filters(tmp_path, capsys):
    bench = bench_main()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("no git history here")
    docs = page(tmp_path, {"engine": head.stdout.strip(), "cost": "uncommitted"})
    assert bench.stale(["engine"], docs, REPO) == 0
    out = capsys.readouterr().out
    assert "all current (1 of 2 benches checked)" in out and "cost" not in out
    assert bench.stale(["nothing-like-it"], docs, REPO) == 1


def test_a_long_list_of_names_is_cut_with_a_count():
    from personaemp.errors import some

    assert some(range(12)) == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 2 more"
    assert some(["a", "b"]) == "a, b"
