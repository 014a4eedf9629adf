"""CLI habits: -h everywhere, completion, clean help, one spelling per kind of option (the
earlier spellings still read, with a notice), -q/--quiet, --json, output not cut when it
is not a terminal, a progress column that shows an ETA only when the total is known, and
dead ends that name the next step."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import typer.main
from conftest import REPO, SAMPLE_TASK1, clean_environment, order_free_responder, read_jsonl
from fake_openai import FakeOpenAI
from rich.progress import Progress
from typer.testing import CliRunner

from personaemp.catalogue import COMMANDS
from personaemp.cli import app
from personaemp.options import specs

COMMAND_NAMES = sorted(typer.main.get_command(app).commands)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    clean_environment(monkeypatch)
    monkeypatch.chdir(tmp_path)


def invoke(*args, env=None):
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


# --- help ----------------------------------------------------------------------------------------


def test_every_command_is_registered_here():
    assert {"filter", "infer-persona", "gen-queries", "split", "stats", "push", "run", "merge"} <= set(
        COMMAND_NAMES
    )


@pytest.mark.parametrize("command", ["", *COMMAND_NAMES])
def test_dash_h_is_help_on_every_command(command):
    result = invoke(*([command] if command else []), "-h")
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    # clean help: no type placeholder after a flag, no <path>/<str>/<int> (a metavar says it)
    assert not re.search(r"<(bool|path|str|int|float|text)>", result.output), result.output


def test_shell_completion_script_and_completions():
    script = subprocess.run(  # from bash, as a user would: the shell is detected
        ["bash", "-c", f"'{sys.executable}' -m personaemp --show-completion; exit $?"],  # bash stays
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert script.returncode == 0, script.stderr
    assert "_PERSONAEMP_COMPLETE=complete_bash" in script.stdout
    completed = subprocess.run(
        [sys.executable, "-m", "personaemp"],
        cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "_PERSONAEMP_COMPLETE": "complete_bash",
             "COMP_WORDS": "personaemp gen-q", "COMP_CWORD": "1"},
    )  # fmt: skip
    assert completed.stdout.split() == ["gen-queries"], completed


# --- the renamed options -------------------------------------------------------------------------

RENAMED = [
    (command, option) for command, sections in COMMANDS.items() for section in sections
    for option in specs(section) if option.old_flag
]  # fmt: skip


def test_the_renames():
    """The table of the closing note: old -> new."""
    assert {(command, option.old_flag, option.flag) for command, option in RENAMED} == {
        ("filter", "--split", "--benchmark-split"),
        ("stats", "--out", "--out-dir"),
        ("push", "--out", "--out-dir"),
        ("evaluate", "--criteria-file", "--criteria"),
        ("evaluate", "--report", "--output"),
    }


def test_one_spelling_per_kind_of_output():
    """A file written is --output/-o, a folder written --out-dir, in every command."""
    for command, sections in COMMANDS.items():
        for option in specs(sections[0]):
            if option.opt.io == "write":  # (a file a command reads and adds to is io="update")
                assert option.flags[:1] == ("--output",), (command, option.name)
            if option.opt.io == "folder":
                assert option.flag == "--out-dir", (command, option.name)


def test_old_spellings_work_with_a_notice(tmp_path):
    """Old flags name the same options: the paths check refuses the same clash, by new names."""
    criteria = tmp_path / "criteria.jsonl"
    criteria.write_text("", encoding="utf-8")
    (tmp_path / "splits").mkdir()
    result = invoke(
        "evaluate", "--splits", tmp_path / "splits", "--criteria-file", criteria,
        "--responses", tmp_path / "r.jsonl", "--report", criteria,
        "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "warning: --criteria-file is deprecated, use --criteria" in result.stderr
    assert "warning: --report is deprecated, use --output" in result.stderr
    assert "--output" in result.stderr.splitlines()[-1] and "--criteria" in result.stderr.splitlines()[-1]


def test_old_flag_and_old_toml_key_reach_the_stage(tmp_path):
    """`stats --out DIR` and `[stats] out = DIR` still write into DIR (a notice each)."""
    processed = tmp_path / "build"
    done = invoke("filter", "--input", SAMPLE_TASK1, "--output", processed / "filtered.jsonl", "-q")
    assert done.exit_code == 0, done.output
    result = invoke("stats", "--processed", processed, "--out", tmp_path / "old-flag")
    assert result.exit_code == 0, result.output
    assert "warning: --out is deprecated, use --out-dir" in result.stderr
    assert (tmp_path / "old-flag" / "stats.json").is_file()
    config = tmp_path / "p.toml"
    config.write_text(
        f'[stats]\nprocessed = "{processed}"\nout = "{tmp_path / "old-key"}"\n', encoding="utf-8"
    )
    result = invoke("stats", "--config", config)
    assert result.exit_code == 0, result.output
    assert f"warning: {config}: stats.out is deprecated, use stats.out_dir" in result.stderr
    assert (tmp_path / "old-key" / "stats.json").is_file()


def test_old_benchmark_split_flag_reaches_the_reader(tmp_path):
    result = invoke("filter", "--input", SAMPLE_TASK1, "--split", "nosuch", "--output", tmp_path / "f.jsonl")
    assert result.exit_code == 2
    assert "warning: --split is deprecated, use --benchmark-split" in result.stderr
    assert "--benchmark-split nosuch" in result.stderr


# --- -q, --json, wide output ---------------------------------------------------------------------


def test_no_help_line_breaks_mid_sentence():
    """Issue 63: a command's help kept its docstring's line breaks, so `--help` and the command
    list broke mid-sentence ("checking that / every user is in exactly one shard")."""
    commands = typer.main.get_command(app).commands
    broken = {name: c.help for name, c in commands.items() if re.search(r"[^\n]\n[^\n]", c.help or "")}
    assert not broken, broken
    listed = invoke("--help", env={"COLUMNS": "100", "TERMINAL_WIDTH": "100"}).output
    assert "checking that every user" in " ".join(listed.replace("│", " ").split())
    assert not re.search(r"│ merge .*that\s+│", listed), listed


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_an_option_of_one_value_given_twice_is_refused_on_every_command(command):
    """Issue 63: click keeps the last of a one-value option given twice and drops the others
    silently (`push --dialogues A --dialogues B` published B only). Every command refuses it."""
    params = typer.main.get_command(app).commands[command].params
    single = [p for p in params if p.param_type_name == "option" and not p.multiple and not p.is_flag
              and not p.hidden]  # fmt: skip
    assert single, command
    option = single[0]
    result = invoke(command, option.opts[0], "1", option.opts[0], "2")
    assert result.exit_code == 2, result.output
    assert f"{option.opts[0]} takes one value and was given 2 times" in result.output


def test_a_key_given_twice_in_a_repeatable_option_is_refused(tmp_path):
    """`--step`, `--vllm` and `run --set` take KEY=VALUE again and again: the same key twice
    with two values was the last one, silently."""
    for args in (
        ["gen-queries", "--step", "check.temperature=0", "--step", "check.temperature=1"],
        ["run", "--vllm", "engine.max_model_len=8192", "--vllm", "engine.max_model_len=4096"],
        ["run", "--set", "persona.limit=8", "--set", "persona.limit=9"],
        ["run", "--set", "llm.vllm.engine.max_model_len=8192", "--set", "llm.vllm.engine.max_model_len=1"],
    ):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "given twice" in result.output, (args, result.output)


def test_json_and_quiet(tmp_path):
    out = tmp_path / "f.jsonl"
    loud = invoke("filter", "--input", SAMPLE_TASK1, "--output", out)
    assert loud.exit_code == 0 and "filter funnel" in loud.stderr and loud.stdout == ""

    result = invoke("filter", "--input", SAMPLE_TASK1, "--output", out, "--json", "-q")
    assert result.exit_code == 0, result.output
    assert result.stderr == "", "quiet: nothing on stderr"
    data = json.loads(result.stdout)
    assert data["stage"] == "filter" and data["counts"]["kept"] == 16 == len(read_jsonl(out))
    assert data["output"] == str(out) and data["report"]["users_in"] == 48


def test_quiet_still_shows_errors(tmp_path):
    result = invoke("filter", "--input", tmp_path / "nowhere", "-q")
    assert result.exit_code == 2 and result.stderr.startswith("Error:")


def test_an_llm_command_and_run_print_json_and_tables_are_not_cut(tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # as in a pipe: no terminal, no width given
    with FakeOpenAI(responder=order_free_responder()) as server:
        filtered = tmp_path / "f.jsonl"
        assert invoke("filter", "--input", SAMPLE_TASK1, "--output", filtered, "-q").exit_code == 0
        result = invoke(
            "infer-persona", "--input", filtered, "--output", tmp_path / "p.jsonl", "--limit", 2,
            "--base-url", server.base_url, "--model", "fake", "--work-dir", tmp_path / "w", "--json",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["counts"]["done"] == 2 and data["report"]["stage"] == "infer-persona"
        # the step table in full: at rich's default 80 columns its headers were cut ("cach…")
        assert "…" not in result.stderr and "cached" in result.stderr and "tok out" in result.stderr
        estimate = invoke(
            "infer-persona", "--input", filtered, "--output", tmp_path / "p.jsonl", "--limit", 4,
            "--base-url", server.base_url, "--model", "fake", "--work-dir", tmp_path / "w", "--estimate",
            "--json", "-q",
        )  # fmt: skip
        assert estimate.exit_code == 0, estimate.output
        assert json.loads(estimate.stdout)["estimate"]["units_pending"] == 2  # 2 of the 4 are done

        config = tmp_path / "p.toml"
        config.write_text(
            f'[paths]\ninput = "{SAMPLE_TASK1}"\nprocessed = "{tmp_path / "build"}"\n'
            f'[llm]\nbase_url = ["{server.base_url}"]\nmodel = "fake"\n[persona]\nlimit = 4\n',
            encoding="utf-8",
        )
        run = invoke("run", "--config", config, "--json", "--quiet")
        assert run.exit_code == 0, run.output
        assert run.stderr == ""
        stages = json.loads(run.stdout)["stages"]
        assert list(stages) == ["filter", "infer-persona", "gen-queries", "split", "stats", "push"]
        assert stages["infer-persona"]["counts"]["done"] == 4


# --- progress ------------------------------------------------------------------------------------


def test_the_progress_column_shows_a_rate_while_the_total_grows():
    from personaemp.llm.stage import TimeLeftOrRate

    column = TimeLeftOrRate()
    with Progress(column, disable=True) as progress:
        growing = progress.add_task("infer-persona", total=10, grows=True)
        known = progress.add_task("gen-queries", total=10, grows=False)
        progress.update(growing, completed=3)
        progress.update(known, completed=3)
        assert "units/s" in column.render(progress.tasks[growing]).plain
        assert "units/s" not in column.render(progress.tasks[known]).plain  # an ETA (or -:--:--)


# --- dead ends -----------------------------------------------------------------------------------


def test_too_few_users_to_split_names_the_next_step(tmp_path):
    from test_split import user

    queries = tmp_path / "queries.jsonl"
    rows = [user("x", eligible=False), user("y", queries=0)]
    queries.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    result = invoke("split", "--input", queries, "--out-dir", tmp_path / "s")
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert "0 user(s) can be split" in line and "left out: 1 ineligible, 1 no_accepted_query" in line
    # the checks rejected y's queries: the hint points at why, not at building more users
    assert f"the checks rejected every query of 1 user(s): {tmp_path / 'rejected.jsonl'} has each" in line
    assert "--limit" not in line


def test_too_few_users_with_every_query_accepted_says_build_more_users(tmp_path):
    from test_split import user

    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps(user("x")) + "\n", encoding="utf-8")
    result = invoke("split", "--input", queries, "--out-dir", tmp_path / "s")
    assert result.exit_code == 2 and "raise infer-persona's --limit" in result.stderr


@pytest.mark.parametrize(
    ("imported", "heavy"),
    [
        ("from personaemp.cli import app", ("personaemp.api", "personaemp.pipeline", "openai", "polars")),
        ("import personaemp.pipeline", ("openai", "personaemp.llm.engine")),
    ],
    ids=["help", "run"],
)
def test_imports_stay_light(imported, heavy):
    """`personaemp -h` imports no stage, engine or API module; `run`'s module loads the LLM
    engine only when it asks an LLM (it loaded openai on import: +0.4 s on a re-run with
    nothing left to ask, when the stages' argument helpers were imported at its top)."""
    code = f"import sys; {imported}\non = [m for m in {heavy!r} if m in sys.modules]\nassert not on, on"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_readme_and_docs_use_the_new_spellings():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for page in pages:
        body = page.read_text(encoding="utf-8")
        if page.name == "options.md":  # the generated tables name the old spellings ("Formerly")
            body = body.split("<!-- options:begin -->")[0] + body.split("<!-- options:end -->")[1]
        for old in ("--criteria-file", "evaluate --report", "`--report`", "--out runs", "`--out`"):
            assert old not in body, (page.name, old)
    assert "--benchmark-split dev" in (REPO / "docs" / "commands" / "filter.md").read_text(encoding="utf-8")


def test_dead_ends_name_the_next_step(tmp_path):
    filtered = tmp_path / "f.jsonl"
    assert invoke("filter", "--input", SAMPLE_TASK1, "--output", filtered, "-q").exit_code == 0
    merged = invoke("merge", "infer-persona", "--input", filtered, "--output", tmp_path / "p.jsonl")
    assert merged.exit_code == 2 and "run the stage with --shard I/N" in merged.stderr
    (tmp_path / "p.jsonl").write_text("", encoding="utf-8")
    shown = invoke("infer-persona", "--output", tmp_path / "p.jsonl", "--show", "ghost")
    assert shown.exit_code == 2 and "personaemp infer-persona --users ghost" in shown.stderr
    missing = invoke("run", "--config", tmp_path / "nowhere.toml")
    assert missing.exit_code == 2 and "copy personaemp.toml" in missing.stderr


def test_dash_h_survives_a_command_first_used_outside_its_group():
    """click keeps a command's help option from the first context it sees: a command used alone
    first (as docs checks do) must not cost the next `personaemp split -h` its -h."""
    alone = typer.main.get_command(app).commands["split"]
    alone.get_help_option(alone.context_class(alone))  # its help option now: --help only
    result = CliRunner().invoke(app, ["split", "-h"])
    assert result.exit_code == 0 and "Usage:" in result.output, result.output
