"""Re-runs skip finished stages (personaemp.manifest): filter, split, stats and push's dry
run are skipped with one line when their inputs, options and code are those of their last
finished run and their outputs are as it left them; --force redoes them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import SAMPLE_TASK1, order_free_responder
from fake_openai import FakeOpenAI
from rich.console import Console

from personaemp import manifest
from personaemp.dataset import filter as filter_stage
from personaemp.dataset.filter import filter_users
from personaemp.pipeline import run_pipeline
from personaemp.registry import RunOptions
from personaemp.shared_options import LLMOptions, PathsOptions

QUIET = Console(quiet=True)
# Which stage runs is the point here, not the plots: placeholder bytes for them (conftest).
pytestmark = pytest.mark.usefixtures("plots_undrawn")


def digests(folder: Path) -> dict[str, str]:
    """The build's files (not the LLM stages' run report: every run adds its accounting)."""
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
        and not path.name.endswith(".lock")
        and path.name not in ("manifest.json", "run_report.json")
    }


@pytest.fixture
def filtered(tmp_path):
    output = tmp_path / "out" / "filtered.jsonl"
    report = filter_users(SAMPLE_TASK1, output, report_path=output.with_name("filter_report.json")).report
    return output, report


def unread(monkeypatch):
    """The filter's reader, made to fail: a skipped filter must not call it."""

    def refuse(*args, **kwargs):
        raise AssertionError("the input was read")

    monkeypatch.setattr(filter_stage, "read_users", refuse)


def test_a_current_filter_reads_nothing_and_returns_its_last_report(filtered, monkeypatch):
    output, first = filtered
    before = output.read_bytes(), output.stat().st_mtime_ns
    unread(monkeypatch)
    again = filter_users(SAMPLE_TASK1, output, report_path=output.with_name("filter_report.json")).report
    assert again.unchanged_since.startswith("filter: unchanged since ")
    assert again.saved() == first.saved()
    assert (output.read_bytes(), output.stat().st_mtime_ns) == before
    streamed = []
    filter_users(
        SAMPLE_TASK1, output, report_path=output.with_name("filter_report.json"), on_kept=streamed.append
    )
    assert b"".join(streamed) == before[0], "`run` gets the kept rows from the output"
    with pytest.raises(AssertionError, match="the input was read"):
        filter_users(SAMPLE_TASK1, output, report_path=output.with_name("filter_report.json"), force=True)


@pytest.mark.parametrize(
    "change",
    ["input", "option", "output edited", "output gone", "report gone", "code"],
)
def test_a_filter_runs_again_when_anything_it_depends_on_changed(filtered, tmp_path, monkeypatch, change):
    output, _ = filtered
    source = SAMPLE_TASK1
    options = {"report_path": output.with_name("filter_report.json")}
    if change == "input":
        source = tmp_path / "copy"
        source.mkdir()
        for name in ("model_input.jsonl", "reference_output.jsonl"):
            (source / name).write_bytes((SAMPLE_TASK1 / name).read_bytes())
        filter_users(source, output, **options)  # recorded for the copy
        with (source / "model_input.jsonl").open("a") as handle:
            handle.write("\n")  # the same users, a file changed
    elif change == "option":
        options["keep_turns"] = "all"
    elif change == "output edited":
        output.write_bytes(output.read_bytes() + b"\n")
    elif change == "output gone":
        output.unlink()
    elif change == "report gone":
        options["report_path"].unlink()
    else:
        monkeypatch.setattr(manifest, "code_version", lambda: "another version")
    report = filter_users(source, output, **options).report
    assert report.unchanged_since is None
    assert options["report_path"].exists() and output.exists()


def test_a_hub_input_is_never_current():
    assert manifest.fingerprint(["hf:owner/name"], {}) is None
    assert manifest.current("filter", Path("x/filtered.jsonl"), None) is None


def run_options(processed: Path, base_url: str, **changes) -> RunOptions:
    """`run`'s options on the sample; `changes`: section -> {option: value}."""
    options = RunOptions(
        paths=PathsOptions(input=str(SAMPLE_TASK1), processed=processed),
        llm=LLMOptions(base_url=[base_url], model="fake"),
    )
    update = {name: getattr(options, name).model_copy(update=values) for name, values in changes.items()}
    return options.model_copy(update=update)


def unchanged(result) -> dict[str, bool]:
    return {
        name: bool(getattr(result.reports[name], "unchanged_since", None))
        for name in ("filter", "split", "stats", "push")
    }


def test_a_rerun_skips_every_stage_and_an_edited_option_redoes_only_the_stages_it_touches(tmp_path):
    processed = tmp_path / "processed"
    with FakeOpenAI(responder=order_free_responder()) as server:
        first = run_pipeline(run_options(processed, server.base_url), QUIET)
        assert unchanged(first) == dict.fromkeys(("filter", "split", "stats", "push"), False)
        built, sent = digests(processed), server.count

        again = run_pipeline(run_options(processed, server.base_url), QUIET)
        assert server.count == sent
        assert unchanged(again) == dict.fromkeys(("filter", "split", "stats", "push"), True)
        assert digests(processed) == built, "a skipped run writes nothing"
        assert again.results["split"].as_dict()["report"] == first.results["split"].as_dict()["report"]
        assert again.reports["push"].rows == first.reports["push"].rows

        # Another split seed: the filter and the LLM stages stay, split and what reads it redo.
        seed = run_pipeline(run_options(processed, server.base_url, split={"seed": 99}), QUIET)
        assert server.count == sent
        assert unchanged(seed) == {"filter": True, "split": False, "stats": False, "push": False}
        changed = {name for name, digest in digests(processed).items() if built.get(name) != digest}
        assert any(name.startswith("splits/random/") for name in changed)
        assert not any(name.startswith(("filtered", "personas", "queries")) for name in changed)

        # The dialogue published: push alone.
        options = run_options(processed, server.base_url, split={"seed": 99}, push={"include_dialogue": True})
        dialogue = run_pipeline(options, QUIET)
        assert unchanged(dialogue) == {"filter": True, "split": True, "stats": True, "push": False}

        forced = run_options(
            processed, server.base_url, split={"seed": 99, "force": True}, push={"include_dialogue": True}
        )
        forced = run_pipeline(forced, QUIET)
        # Forced, split writes its files anew (the same bytes, a new time): what reads them redoes.
        assert unchanged(forced) == {"filter": True, "split": False, "stats": False, "push": False}
        assert server.count == sent
    manifest = json.loads((processed / "manifest.json").read_text())
    assert {"filter", "split", "stats", "push"} <= {
        name for name, entry in manifest.items() if "fresh" in entry
    }


def test_the_one_line_of_a_skipped_stage_is_printed(tmp_path, capsys):
    from typer.testing import CliRunner

    from personaemp.cli import app

    output = tmp_path / "filtered.jsonl"
    runner = CliRunner()
    args = ["filter", "--input", str(SAMPLE_TASK1), "--output", str(output)]
    assert runner.invoke(app, args).exit_code == 0
    second = runner.invoke(app, args)
    assert second.exit_code == 0
    assert "filter: unchanged since" in second.stderr and "filter funnel" not in second.stderr
    third = runner.invoke(app, [*args, "--force"])
    assert "unchanged" not in third.stderr and "filter funnel" in third.stderr


def test_a_rerun_reads_none_of_the_llm_stages_files_and_an_llm_option_redoes_them(tmp_path, monkeypatch):
    """The LLM stages of `run` are skipped whole (their files not read: a re-run at 15K users
    spent 26 s re-reading them) when the filter's output, their options, the engine's reply
    options and the code are those of their last finished run."""
    from personaemp.dataset import persona, queries

    processed = tmp_path / "processed"
    with FakeOpenAI(responder=order_free_responder()) as server:
        first = run_pipeline(run_options(processed, server.base_url), QUIET)
        sent = server.count

        def refuse(*args, **kwargs):
            raise AssertionError("an LLM stage ran")

        with monkeypatch.context() as patched:
            patched.setattr(persona, "persona_stage", refuse)
            patched.setattr(queries, "queries_stage", refuse)
            again = run_pipeline(run_options(processed, server.base_url, llm={"concurrency": 3}), QUIET)
        assert server.count == sent
        assert again.results["gen-queries"].counts == first.results["gen-queries"].counts
        assert unchanged(again)["split"], "the stages after it see the same files"
        # An option that shapes a reply: the LLM stages run again.
        hotter = run_pipeline(run_options(processed, server.base_url, llm={"temperature": 0.5}), QUIET)
        assert hotter.results["infer-persona"].report is not None


def test_runs_chain_is_stamped_with_the_file_infer_persona_reads(tmp_path):
    """With [persona] input not the filter's output, the chain's record stamped the filter's
    output: an edited persona input was skipped as current."""
    processed = tmp_path / "processed"
    with FakeOpenAI(responder=order_free_responder()) as server:
        run_pipeline(run_options(processed, server.base_url), QUIET)
        mine = tmp_path / "mine.jsonl"
        mine.write_bytes((processed / "filtered.jsonl").read_bytes())
        options = run_options(processed, server.base_url, persona={"input": mine})
        run_pipeline(options, QUIET)
        assert run_pipeline(options, QUIET).reports["infer-persona"] is None, "current: skipped"
        mine.write_text("".join(mine.read_text().splitlines(keepends=True)[:-1]))  # one user fewer
        again = run_pipeline(options, QUIET)
    assert again.reports["infer-persona"] is not None, "the edited input is read again"
    users = {json.loads(line)["user_id"] for line in mine.read_text().splitlines()}
    assert {
        json.loads(line)["user_id"] for line in (processed / "personas.jsonl").read_text().splitlines()
    } == users


def test_infer_persona_and_gen_queries_alone_skip_when_current(tmp_path, monkeypatch):
    """Each LLM command, run again on the same input, options and code, reads nothing and
    prints one line; an edited input, --force or an option that shapes a reply runs it."""
    from typer.testing import CliRunner

    from personaemp.cli import app
    from personaemp.dataset import persona, queries

    filtered = tmp_path / "filtered.jsonl"
    filter_users(SAMPLE_TASK1, filtered)
    personas, made = tmp_path / "personas.jsonl", tmp_path / "queries.jsonl"
    runner = CliRunner()
    with FakeOpenAI(responder=order_free_responder()) as server:
        llm = ["--base-url", server.base_url, "--model", "fake", "--work-dir", str(tmp_path / "work")]
        commands = {
            "infer-persona": ["infer-persona", "-i", str(filtered), "-o", str(personas), *llm],
            "gen-queries": ["gen-queries", "-i", str(personas), "-o", str(made), *llm],
        }
        for args in commands.values():
            first = runner.invoke(app, args)
            assert first.exit_code == 0, first.stderr
            assert "unchanged since" not in first.stderr
        sent, built = server.count, digests(tmp_path)

        def refuse(*args, **kwargs):
            raise AssertionError("the stage ran")

        with monkeypatch.context() as patched:
            patched.setattr(persona, "persona_stage", refuse)
            patched.setattr(queries, "queries_stage", refuse)
            for name, args in commands.items():
                again = runner.invoke(app, [*args, "--concurrency", "3"])  # runtime only: still current
                assert again.exit_code == 0, again.output
                assert again.stderr.strip().endswith("--force redoes it")
                assert f"{name}: unchanged since" in again.stderr
        assert server.count == sent and digests(tmp_path) == built

        forced = runner.invoke(app, [*commands["gen-queries"], "--force"])
        assert forced.exit_code == 0 and "unchanged since" not in forced.stderr
        assert server.count == sent, "forced, it resumes: every unit is done, nothing is sent"

        hotter = runner.invoke(app, [*commands["infer-persona"], "--temperature", "0.5"])
        assert hotter.exit_code == 0 and "unchanged since" not in hotter.stderr
        assert server.count > sent

        # infer-persona wrote personas.jsonl anew: gen-queries' input changed, so it runs.
        after = runner.invoke(app, commands["gen-queries"])
        assert after.exit_code == 0 and "unchanged since" not in after.stderr
