"""Failures that looked like success (issue 44): a stage whose every unit failed exits 1,
`run` stops there; a result whose output is gone raises; an empty view keeps its columns.

The all-failed run's exit 1 is the CLI in a child process against the fake endpoint, as a
user would run it; the other runs are the same commands in this process (conftest.cli_here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLE_TASK1, cli_here
from fake_openai import FakeOpenAI, default_content, reply
from rich.console import Console

from personaemp.dataset.filter import filter_users
from personaemp.results import StageResult

USERS = 3
NOT_JSON = "I am sorry, I cannot produce JSON today."


@pytest.fixture
def filtered(tmp_path) -> Path:
    output = tmp_path / "filtered.jsonl"
    filter_users(str(SAMPLE_TASK1), output, console=Console(quiet=True))
    output.write_text("\n".join(output.read_text().splitlines()[:USERS]) + "\n")
    return output


def personaemp(tmp_path: Path, *args: str, here: bool = False) -> subprocess.CompletedProcess:
    """The CLI in a child process; `here`: in this process (conftest.cli_here), for the runs
    whose exit is not the point of the process boundary (the all-failed exit 1 keeps its child)."""
    if here:
        return cli_here(list(args), {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": None, "NO_COLOR": "1",
                                     "COLUMNS": "200"}, tmp_path)  # fmt: skip
    env = {**os.environ, "OPENAI_API_KEY": "sk-test", "NO_COLOR": "1", "COLUMNS": "200"}
    env.pop("OPENAI_BASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "personaemp", *args], capture_output=True, text=True, env=env, timeout=180,
        cwd=tmp_path,
    )  # fmt: skip


def infer(
    tmp_path: Path, filtered: Path, base_url: str, *extra: str, here: bool = False
) -> subprocess.CompletedProcess:
    return personaemp(
        tmp_path, "infer-persona", "--input", str(filtered), "--output", str(tmp_path / "personas.jsonl"),
        "--work-dir", str(tmp_path / "work"), "--base-url", base_url, "--model", "fake", "--max-reasks", "0",
        *extra, here=here,
    )  # fmt: skip


def test_a_stage_whose_every_unit_failed_exits_1_and_says_where_the_reasons_are(tmp_path, filtered):
    """Before: exit 0, as if it had worked."""
    with FakeOpenAI(responder=lambda body, n: reply(NOT_JSON)) as server:
        first = infer(tmp_path, filtered, server.base_url, "--json")
        again = infer(tmp_path, filtered, server.base_url)  # failed earlier, not retried: still failed
    failures = tmp_path / "infer-persona.failures.jsonl"
    for result in (first, again):
        assert result.returncode == 1, result.stderr
        [line] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert f"infer-persona: all {USERS} of its units failed ({failures} says why)" in line
        assert "--retry-failed" in line and "Traceback" not in result.stderr
    assert len(failures.read_text().splitlines()) == USERS
    assert json.loads(first.stdout)["counts"]["failed"] == USERS  # --json still printed the result


def test_a_stage_with_some_units_done_exits_0_and_counts_the_failed(tmp_path, filtered):
    first = json.loads(filtered.read_text().splitlines()[0])["memories"][0]["value"]

    def answer(body, number):  # every request about the first user fails; the rest work
        return reply(
            NOT_JSON if first in json.dumps(body["messages"], ensure_ascii=False) else default_content(body)
        )

    with FakeOpenAI(responder=answer) as server:
        result = infer(tmp_path, filtered, server.base_url, here=True)
    assert result.returncode == 0, result.stderr
    assert f"{USERS - 1} done + 0 done earlier + 1 failed" in result.stderr
    assert len((tmp_path / "infer-persona.failures.jsonl").read_text().splitlines()) == 1


def test_run_stops_with_exit_1_when_every_persona_failed(tmp_path):
    """Before: run went on to gen-queries (nothing to do) and split, and said the input was empty."""
    config = tmp_path / "personaemp.toml"
    config.write_text(
        f'[paths]\ninput = "{SAMPLE_TASK1}"\nprocessed = "{tmp_path / "processed"}"\n'
        f'[persona]\nlimit = {USERS}\n[llm]\nmax_reasks = 0\nmodel = "fake"\n'
    )
    with FakeOpenAI(responder=lambda body, n: reply(NOT_JSON)) as server:
        result = personaemp(
            tmp_path, "run", "--config", str(config), "--set", f"llm.base_url={server.base_url}", here=True
        )
    assert result.returncode == 1, result.stderr
    assert "infer-persona: all 3 of its units failed" in result.stderr
    assert not (tmp_path / "processed" / "splits").exists()


def test_rows_of_an_output_that_is_gone_raise_instead_of_reading_as_empty(tmp_path):
    """Before: [] and a frame with no columns, as for a stage that produced nothing."""
    gone = StageResult("infer-persona", tmp_path / "personas.jsonl")
    for read in (gone.rows, gone.to_polars, gone.queries):
        with pytest.raises(FileNotFoundError, match="infer-persona's output is not there"):
            read()


@pytest.mark.parametrize("stage", ["gen-queries", "infer-persona", "filter"])
def test_an_empty_output_reads_as_frames_with_their_columns(tmp_path, stage):
    """Before: a frame with 0 columns (`frame["query"]` raised ColumnNotFoundError)."""
    empty = tmp_path / "out.jsonl"
    empty.write_text("")
    result = StageResult(stage, empty)
    assert result.rows() == []
    queries = result.queries()
    assert queries.height == 0
    assert {"user_id", "query_id", "category", "query", "openness", "passed"} <= set(queries.columns)
    assert str(queries.schema["memory_ids"]) == "List(String)"
    frame = result.to_polars()
    assert frame.height == 0 and {"user_id", "memories"} <= set(frame.columns)
    if stage != "filter":
        assert {"big_five", "openness", "profile"} <= set(frame.columns)
    if stage == "gen-queries":
        assert "queries" in frame.columns and frame.schema["queries"].inner.fields  # a list of structs
    scores = StageResult("evaluate", empty, files={"scores": empty}).scores()
    assert scores.height == 0 and {"system", "query_id", "resonation", "harmonic"} <= set(scores.columns)


def test_a_stage_that_finished_nothing_still_reads_as_empty(tmp_path, filtered):
    """rows() raising on a missing file needs a stage to write its output even when it made
    no row (here every unit failed): then rows() is [] and the frame has the record's columns."""
    import personaemp as pe

    with FakeOpenAI(responder=lambda body, n: reply(NOT_JSON)) as server:
        personas = pe.infer_personas(
            filtered, tmp_path / "personas.jsonl", base_url=[server.base_url], model="fake",
            work_dir=tmp_path / "work", max_reasks=0,
        )  # fmt: skip
    assert personas.counts["failed"] == USERS and personas.failed_entirely()
    assert personas.rows() == [] and {"user_id", "big_five", "openness"} <= set(personas.to_polars().columns)


def test_an_llm_stage_writing_elsewhere_says_where_its_cache_went(tmp_path, filtered):
    """Before: only extract-memories said it; infer-persona -o elsewhere left its cache and run
    report in ./data/processed/.personaemp without a word."""
    with FakeOpenAI() as server:
        elsewhere = personaemp(
            tmp_path, "infer-persona", "--input", str(filtered), "--output", "out/personas.jsonl",
            "--base-url", server.base_url, "--model", "fake", here=True,
        )  # fmt: skip
        beside = infer(
            tmp_path, filtered, server.base_url, here=True
        )  # --work-dir tmp_path/work, beside the output
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert "cache and run report: data/processed/.personaemp (--work-dir moves them)" in elsewhere.stderr
    assert (tmp_path / "data" / "processed" / ".personaemp").is_dir()
    assert "cache and run report" not in beside.stderr
