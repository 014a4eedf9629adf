"""A command never writes over, or into, what it reads (personaemp/paths.py): refused with
exit 2 and one line naming both paths, before anything is written."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from conftest import write_jsonl
from typer.testing import CliRunner

from personaemp.catalogue import COMMANDS
from personaemp.cli import app
from personaemp.paths import check_command
from personaemp.registry import RunOptions


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def invoke_llm(*args):
    """An LLM command with an endpoint nobody listens on: its paths are checked before any request."""
    return invoke(*args, "--base-url", "http://127.0.0.1:9/v1")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refused(result, *names: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    line = result.stderr.strip()
    assert line.count("\n") == 0, line
    assert "would write" in line or "lies inside" in line, line
    for name in names:
        assert name in line, (name, line)


@pytest.fixture
def rows(tmp_path) -> Path:
    return write_jsonl(tmp_path / "data" / "rows.jsonl", [{"user_id": "u1"}, {"user_id": "u2"}])


def test_filter_output_equal_to_its_source_file_is_refused(sample_copy):
    target = sample_copy / "model_input.jsonl"
    before = digest(target)
    result = invoke("filter", "--input", sample_copy, "--output", target)
    refused(result, "--output", "--input", str(sample_copy))
    assert digest(target) == before
    assert not (sample_copy / "filter_report.json").exists()


@pytest.mark.parametrize("command", ["infer-persona", "gen-queries", "criteria"])
def test_llm_stage_output_equal_to_input_is_refused(command, rows):
    before = digest(rows)
    result = invoke_llm(command, "--input", rows, "--output", rows)
    refused(result, "--output", "--input", str(rows))
    assert digest(rows) == before
    assert sorted(p.name for p in rows.parent.iterdir()) == ["rows.jsonl"]


def test_a_symlinked_output_is_the_file_it_points_to(rows):
    link = rows.with_name("link.jsonl")
    link.symlink_to(rows)
    result = invoke_llm("infer-persona", "--input", rows, "--output", link)
    refused(result, "--output", "--input")


def test_a_hard_link_is_the_same_file(rows):
    link = rows.with_name("hard.jsonl")
    os.link(rows, link)
    result = invoke_llm("gen-queries", "--input", rows, "--output", link)
    refused(result, "--output", "--input")


def test_a_sidecar_over_the_input_is_refused(tmp_path, rows):
    # gen-queries writes rejected.jsonl beside its output: an input of that name is lost too
    rejected = write_jsonl(tmp_path / "out" / "rejected.jsonl", [{"user_id": "u1"}])
    result = invoke_llm(
        "gen-queries", "--input", rejected, "--output", tmp_path / "out" / "queries.jsonl",
    )  # fmt: skip
    refused(result, "rejected.jsonl", "--input")


def test_split_into_the_folder_its_input_lies_in_is_refused(tmp_path):
    splits = tmp_path / "splits"
    train = write_jsonl(splits / "random" / "train.jsonl", [{"user_id": "u1"}])
    before = digest(train)
    result = invoke("split", "--input", train, "--out-dir", splits)
    refused(result, "--input", "--out-dir")
    assert digest(train) == before


def test_a_work_dir_holding_the_input_is_refused(tmp_path, rows):
    result = invoke_llm(
        "infer-persona", "--input", rows, "--output", tmp_path / "p.jsonl", "--work-dir", rows.parent,
    )  # fmt: skip
    refused(result, "--work-dir", "--input")


@pytest.fixture
def splits(tmp_path) -> Path:
    folder = tmp_path / "splits"
    write_jsonl(folder / "random" / "test.jsonl", [{"user_id": "u1"}])
    return folder


def test_evaluate_report_over_the_criteria_file_is_refused(tmp_path, splits):
    criteria = write_jsonl(tmp_path / "criteria.jsonl", [{"query_id": "q"}])
    responses = write_jsonl(tmp_path / "resp.jsonl", [{"query_id": "q", "response": "r"}])
    before = digest(criteria)
    result = invoke_llm(
        "evaluate", "--splits", splits, "--criteria", criteria, "--responses", responses,
        "--output", criteria,
    )  # fmt: skip
    refused(result, "--output", "--criteria")
    assert digest(criteria) == before


# run.scores.jsonl: the report's scores; run.gpt.scores.jsonl: a panel judge's, beside the report
@pytest.mark.parametrize("sidecar", ["run.scores.jsonl", "run.gpt.scores.jsonl"], ids=["report", "judge"])
def test_evaluate_sidecar_over_a_responses_file_is_refused(tmp_path, splits, sidecar):
    criteria = write_jsonl(tmp_path / "criteria.jsonl", [{"query_id": "q"}])
    responses = write_jsonl(tmp_path / sidecar, [{"query_id": "q", "response": "r"}])
    result = invoke_llm(
        "evaluate", "--splits", splits, "--criteria", criteria, "--responses", responses,
        "--output", tmp_path / "run.json",
    )  # fmt: skip
    refused(result, f"--output's {sidecar}", "--responses")


def test_respond_into_the_splits_folder_is_refused(splits):
    result = invoke_llm(
        "respond", "--splits", splits, "--output", splits / "random" / "test.jsonl",
    )  # fmt: skip
    refused(result, "--output", "--splits")


def test_push_out_over_the_splits_is_refused(splits):
    result = invoke("push", "--splits", splits / "random", "--dry-run", "--out-dir", splits)
    refused(result, "--splits", "--out-dir")


def test_run_refuses_a_config_whose_stage_writes_its_input(tmp_path):
    config = tmp_path / "personaemp.toml"
    processed = tmp_path / "processed"
    config.write_text(
        f'[paths]\nprocessed = "{processed}"\n[persona]\noutput = "{processed}/filtered.jsonl"\n',
        encoding="utf-8",
    )
    result = invoke("run", "--config", config)
    refused(result, "persona.output", "persona.input")
    assert not processed.exists()  # not even the filter ran


def test_merge_output_equal_to_input_is_refused(rows):
    result = invoke("merge", "infer-persona", "--input", rows, "--output", rows)
    refused(result, "--output", "--input")


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_defaults_of_every_command_pass(command):
    options = RunOptions()
    check_command(command, lambda name: getattr(options, name))


def test_table_output_over_a_report_is_refused(tmp_path):
    report = tmp_path / "report.json"
    report.write_text("{}")
    refused(invoke("table", "--report", report, "--output", report), "--output", "--report")
