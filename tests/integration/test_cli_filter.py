"""`personaemp filter` through typer's CliRunner, and `python -m personaemp` once for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import (
    REPO,
    SAMPLE_KEPT,
    SAMPLE_USERS,
    files_in,
    memory_item,
    raw_record,
    read_jsonl,
    write_jsonl,
)
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.rules import default_rules_text


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def invoke(runner, *args):
    return runner.invoke(app, [str(a) for a in args])


def test_filter_sample(runner, tmp_path, sample_task1):
    output = tmp_path / "out" / "filtered.jsonl"
    result = invoke(runner, "filter", "--input", sample_task1, "--output", output)
    assert result.exit_code == 0, result.output
    assert len(read_jsonl(output)) == SAMPLE_KEPT
    assert "filter funnel" in result.stderr
    assert _row(result.stderr, "users read") == str(SAMPLE_USERS)
    assert _row(result.stderr, "kept") == str(SAMPLE_KEPT)
    assert _row(result.stderr, "dropped by memory_labels").isdigit()
    assert "flagged false memories dropped: 20 of 113" in result.stderr
    assert f"wrote {output}" in result.stderr
    assert result.stdout == ""  # data goes to files, the summary to stderr
    report = json.loads((output.parent / "filter_report.json").read_text())
    assert report["users_in"] == SAMPLE_USERS and report["kept"] == SAMPLE_KEPT
    # (manifest.json: the stage records itself in its folder's manifest, see manifest.py)
    assert files_in(output.parent) == ["filter_report.json", "filtered.jsonl", "manifest.json"]


def _row(text: str, step: str) -> str:
    """The number in the funnel table's row for `step`."""
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip("│┃ ").split("│")]
        if len(cells) == 2 and cells[0] == step:
            return cells[1]
    raise AssertionError(f"no row {step!r} in:\n{text}")


def test_filter_bad_input_exits_2_with_one_line(runner, tmp_path, sample_copy):
    path = sample_copy / "model_input.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines.insert(4, "{not json\n")
    path.write_text("".join(lines), encoding="utf-8")
    output = tmp_path / "out" / "filtered.jsonl"

    result = invoke(runner, "filter", "--input", sample_copy, "--output", output)

    assert result.exit_code == 2
    assert result.stderr.strip().startswith("Error: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert f"{path}:5: not valid JSON" in result.stderr
    assert "--on-error skip" in result.stderr
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)
    assert not output.exists()
    assert files_in(output.parent) == []  # no temp file, no report

    result = invoke(runner, "filter", "--input", sample_copy, "--output", output, "--on-error", "skip")
    assert result.exit_code == 0, result.output
    assert "bad rows skipped: 1" in result.stderr
    assert _row(result.stderr, "users read") == str(SAMPLE_USERS)
    assert len(read_jsonl(output)) == SAMPLE_KEPT
    report = json.loads((output.parent / "filter_report.json").read_text())
    assert report["bad_rows_skipped"] == 1
    assert report["skipped_rows"][0].startswith(f"{path}:5: not valid JSON")


def test_filter_missing_input_exits_2(runner, tmp_path):
    result = invoke(runner, "filter", "--input", tmp_path / "nowhere", "--output", tmp_path / "f.jsonl")
    assert result.exit_code == 2
    assert "Error:" in result.stderr and "nowhere: no such file or folder" in result.stderr
    assert "Traceback" not in result.output


def test_filter_show_rules(runner):
    result = invoke(runner, "filter", "--show-rules")
    assert result.exit_code == 0
    assert result.stdout == default_rules_text()
    assert "[memories]" in result.stdout and "flagged_value_pattern" in result.stdout


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--format", "bogus", "--format must be 'auto', 'task1', 'raw' or 'hf', not 'bogus'"),
        ("--on-error", "ignore", "--on-error must be 'fail' or 'skip'"),
        ("--turns", "assistant", "--turns must be 'user' or 'all'"),
    ],
)
def test_filter_bad_option_values_exit_2(runner, tmp_path, sample_task1, option, value, message):
    output = tmp_path / "out" / "filtered.jsonl"
    result = invoke(runner, "filter", "--input", sample_task1, "--output", output, option, value)
    assert result.exit_code == 2
    assert "Error:" in result.stderr and message in result.stderr
    assert "Traceback" not in result.output
    assert not output.exists()


def test_filter_rules_file_and_turns_all(runner, tmp_path):
    source = write_jsonl(
        tmp_path / "export.jsonl",
        [raw_record("en_user", language="English"), raw_record("zh_user", language="Chinese")],
    )
    rules = tmp_path / "rules.toml"
    rules.write_text('[language]\nallow = ["zh"]\n')
    output = tmp_path / "out" / "filtered.jsonl"
    result = invoke(
        runner, "filter", "-i", source, "-o", output, "--rules", rules, "--turns", "all", "--format", "raw"
    )
    assert result.exit_code == 0, result.output
    [row] = read_jsonl(output)
    assert row["user_id"] == "zh_user"
    assert [t["role"] for t in row["turns"]] == ["user", "assistant"]
    assert _row(result.stderr, "dropped by language") == "1"


def test_filter_bad_rules_file_exits_2(runner, tmp_path, sample_task1):
    rules = tmp_path / "rules.toml"
    rules.write_text("[memories]\nflagged_value_pattern = '('\n")
    result = invoke(runner, "filter", "-i", sample_task1, "-o", tmp_path / "f.jsonl", "--rules", rules)
    assert result.exit_code == 2
    assert f"{rules}: memories.flagged_value_pattern" in result.stderr


def test_filter_input_from_environment(runner, tmp_path, sample_task1):
    output = tmp_path / "filtered.jsonl"
    result = runner.invoke(
        app, ["filter", "--output", str(output)], env={"PERSONAEMP_INPUT": str(sample_task1)}
    )
    assert result.exit_code == 0, result.output
    assert len(read_jsonl(output)) == SAMPLE_KEPT


def test_help_lists_filter(runner):
    result = invoke(runner, "--help")
    assert result.exit_code == 0
    assert "filter" in result.stdout
    result = invoke(runner, "filter", "--help")
    assert result.exit_code == 0
    for option in ("--input", "--format", "--rules", "--output", "--on-error", "--show-rules"):
        assert option in result.stdout


def test_python_dash_m_help():
    result = subprocess.run(
        [sys.executable, "-m", "personaemp", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "120"},
    )
    assert result.returncode == 0, result.stderr
    assert "Usage: personaemp" in result.stdout
    assert "filter" in result.stdout


@pytest.mark.parametrize(
    ("args", "code", "stream", "text"),
    [
        (["--version"], 0, "stdout", "."),
        (["filter", "--input", "no/such/folder", "--output", "{tmp}/f.jsonl"], 2, "stderr", "Error:"),
        (["no-such-command"], 2, "stderr", "No such command"),
        (["filter", "--on-error", "maybe"], 2, "stderr", "maybe"),
    ],
)
def test_the_program_exits_at_once_with_the_command_s_code_and_all_its_output(
    tmp_path, args, code, stream, text
):
    """cli.entry ends the process with os._exit after the work (Python's teardown of what a
    run imports took 0.6 s): the exit code and every line written must survive it."""
    program = [sys.executable, "-m", "personaemp", *(a.format(tmp=tmp_path) for a in args)]
    result = subprocess.run(
        program, capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"}
    )
    assert result.returncode == code, result.stderr
    assert text in getattr(result, stream)
    if code == 0:
        assert result.stdout.endswith("\n")


def test_the_console_script_is_the_quick_exit_entry():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "personaemp"]
    assert script.value == "personaemp.cli:entry"


def test_a_long_output_through_a_pipe_is_whole_after_the_quick_exit(runner):
    result = subprocess.run(
        [sys.executable, "-m", "personaemp", "filter", "--show-rules"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    in_process = runner.invoke(app, ["filter", "--show-rules"])
    assert len(result.stdout) > 2000 and result.stdout == in_process.stdout


def test_a_filter_that_keeps_nobody_says_which_rule_dropped_how_many_and_points_to_rules(runner, tmp_path):
    """Your own labels (not AlpsBench's taxonomy): every user falls at the label gate, and
    the summary says so, names the prefixes the rules look for and the way to change them."""
    records = [raw_record(f"u{i}", memory_items=[memory_item(label="work/projects")]) for i in range(3)]
    records.append(raw_record("u3", memory_items=[]))  # no memory at all: min_memories
    source = write_jsonl(tmp_path / "mine.jsonl", records)
    output = tmp_path / "out" / "filtered.jsonl"
    result = invoke(runner, "filter", "--input", source, "--output", output)
    assert result.exit_code == 0, result.output
    assert read_jsonl(output) == []
    hint = " ".join(result.stderr.split())  # the console wraps long lines
    assert "nobody kept: of 4 users, 3 by memory_labels ([labels] prefixes" in hint
    assert "1 by min_memories" in hint
    assert "Social_Relationships, States_Experiences" in hint and "UNMAPPED" in hint
    assert "personaemp filter --show-rules > my_rules.toml" in hint and "--rules my_rules.toml" in hint
    report = json.loads((output.parent / "filter_report.json").read_text())
    assert report["nobody_kept"].startswith("nobody kept: of 4 users")


def test_a_filter_that_keeps_someone_gives_no_such_hint(runner, tmp_path, sample_task1):
    output = tmp_path / "out" / "filtered.jsonl"
    result = invoke(runner, "filter", "--input", sample_task1, "--output", output)
    assert result.exit_code == 0 and "nobody kept" not in result.stderr
