"""personaemp.manifest (stage manifests, the lock) and the LLM run report (llm.stage.append_report).

Concurrency is tested with real processes on real files under tmp_path; nothing is timed.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
from pathlib import Path

import pytest
from conftest import write_json

from personaemp.errors import InputError
from personaemp.llm.settings import LLMSettings
from personaemp.llm.stage import append_report
from personaemp.manifest import MANIFEST_FILE, locked, read_manifest, record_stage, stage_chain

# fork where there is one: a spawned child re-imports this module and personaemp (about 1.5 s
# of CPU each, seven children in this file).
START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def stored(folder: Path) -> dict:
    return json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))


# --- record_stage / read_manifest ----------------------------------------------------------------


def test_record_stage_writes_the_entry_beside_the_output(tmp_path):
    processed = tmp_path / "processed"
    processed.mkdir()
    work = tmp_path / "work"
    path = record_stage(
        processed / "queries.jsonl",
        "gen-queries",
        report=work / "run_report.json",
        failures=processed / "gen-queries.failures.jsonl",
        full=True,
    )
    assert path == processed / MANIFEST_FILE
    entry = stored(processed)["gen-queries"]
    assert set(entry) == {"output", "report", "failures", "finished_at", "full"}
    # inside the folder: relative (the folder can move); elsewhere: absolute
    assert entry["output"] == "queries.jsonl"
    assert entry["failures"] == "gen-queries.failures.jsonl"
    assert entry["report"] == str((work / "run_report.json").resolve())
    assert entry["full"] is True
    assert entry["finished_at"].endswith("+00:00")

    manifest = read_manifest(processed)
    assert manifest["gen-queries"]["output"] == str(processed / "queries.jsonl")
    assert manifest["gen-queries"]["failures"] == str(processed / "gen-queries.failures.jsonl")
    assert manifest["gen-queries"]["report"] == str(work / "run_report.json")


def test_record_stage_with_relative_paths_and_no_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("data").mkdir()
    record_stage(Path("data/filtered.jsonl"), "filter", report=None, failures=None, full=False)
    entry = stored(tmp_path / "data")["filter"]
    assert entry["output"] == "filtered.jsonl"
    assert entry["report"] is None and entry["failures"] is None
    assert entry["full"] is False
    assert "input" not in entry
    # read from anywhere: the paths do not depend on the working directory
    monkeypatch.chdir("/")
    assert read_manifest(tmp_path / "data")["filter"]["output"] == str(tmp_path / "data" / "filtered.jsonl")


def test_a_moved_folder_keeps_its_manifest_valid(tmp_path):
    first = tmp_path / "first"
    first.mkdir()
    record_stage(first / "queries.jsonl", "gen-queries", report=first / "r.json", failures=None, full=True)
    moved = first.rename(tmp_path / "moved")
    entry = read_manifest(moved)["gen-queries"]
    assert entry["output"] == str(moved / "queries.jsonl")
    assert entry["report"] == str(moved / "r.json")


def test_record_stage_keeps_other_stages_and_replaces_its_own(tmp_path):
    record_stage(tmp_path / "filtered.jsonl", "filter", report=tmp_path / "f.json", failures=None, full=True)
    record_stage(tmp_path / "personas.jsonl", "infer-persona", report=None, failures=None, full=False)
    record_stage(
        tmp_path / "personas.jsonl", "infer-persona", report=tmp_path / "r.json", failures=None, full=True
    )
    manifest = stored(tmp_path)
    assert sorted(manifest) == ["filter", "infer-persona"]
    assert manifest["infer-persona"]["report"] == "r.json"
    assert manifest["infer-persona"]["full"] is True
    assert manifest["filter"]["report"] == "f.json"


def test_read_manifest_of_a_folder_without_one_is_empty(tmp_path):
    assert read_manifest(tmp_path) == {}
    assert read_manifest(tmp_path / "nowhere") == {}


@pytest.mark.parametrize("content", ["{broken", "[1, 2]", '{"filter": 3}'], ids=["not json", "list", "entry"])
def test_a_corrupt_manifest_is_an_input_error_to_read_and_is_replaced_by_a_stage(tmp_path, content):
    (tmp_path / MANIFEST_FILE).write_text(content, encoding="utf-8")
    with pytest.raises(InputError) as caught:
        read_manifest(tmp_path)
    assert str(tmp_path / MANIFEST_FILE) in str(caught.value)
    assert "delete it" in str(caught.value)

    record_stage(tmp_path / "filtered.jsonl", "filter", report=None, failures=None, full=True)
    assert list(read_manifest(tmp_path)) == ["filter"]


# --- the lock --------------------------------------------------------------------------------------


def _hold_lock(path: str, acquired, release) -> None:
    with locked(Path(path)):
        acquired.set()
        release.wait()


def test_locked_excludes_another_process(tmp_path):
    target = tmp_path / MANIFEST_FILE
    context = multiprocessing.get_context(START_METHOD)
    acquired, release = context.Event(), context.Event()
    holder = context.Process(target=_hold_lock, args=(str(target), acquired, release))
    holder.start()
    try:
        assert acquired.wait(60), "the child never took the lock"
        with (tmp_path / f".{MANIFEST_FILE}.lock").open("a") as handle:
            with pytest.raises(BlockingIOError):
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            release.set()
            holder.join(60)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the child is done
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    finally:
        release.set()
        holder.join(60)
    assert holder.exitcode == 0


def _record_many(folder: str, worker: int, count: int, start) -> None:
    start.wait()
    for n in range(count):
        output = Path(folder) / f"out-{worker}-{n}.jsonl"
        record_stage(output, f"stage-{worker}-{n}", report=None, failures=None, full=True)


def at_once(target, path: Path, count: int) -> None:
    """target(path, worker, count, start) in three processes let go at the same moment; each ends well."""
    context = multiprocessing.get_context(START_METHOD)
    start = context.Event()
    workers = [context.Process(target=target, args=(str(path), w, count, start)) for w in range(3)]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0


def test_two_processes_recording_at_once_lose_no_entry(tmp_path):
    at_once(_record_many, tmp_path, 40)
    assert len(read_manifest(tmp_path)) == 3 * 40


# --- stage_chain ----------------------------------------------------------------------------------


def finished(output: Path, stage: str, *, report: Path | None = None, input: Path | None = None) -> None:
    """A finished full run of `stage` into `output` (no failures file), recorded in the manifest."""
    record_stage(output, stage, report=report, failures=None, full=True, input=input)


def test_stage_chain_by_stage_order_in_one_folder(tmp_path):
    for stage, output in (("filter", "filtered"), ("infer-persona", "personas"), ("gen-queries", "queries")):
        finished(tmp_path / f"{output}.jsonl", stage, report=tmp_path / f"{stage}.json")
    chain = stage_chain(tmp_path / "queries.jsonl")
    assert list(chain) == ["gen-queries", "infer-persona", "filter"]
    assert chain["filter"]["report"] == str(tmp_path / "filter.json")


def test_stage_chain_follows_inputs_across_folders(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder in (a, b, c):
        folder.mkdir()
    finished(a / "filtered.jsonl", "filter", report=a / "filter_report.json")
    finished(b / "personas.jsonl", "infer-persona", input=a / "filtered.jsonl")
    finished(c / "queries.jsonl", "gen-queries", input=b / "personas.jsonl")
    # a decoy in c's manifest: another run's filter, not the one this data came from
    finished(c / "filtered.jsonl", "filter", report=c / "other.json")
    chain = stage_chain(c / "queries.jsonl")
    assert list(chain) == ["gen-queries", "infer-persona", "filter"]
    assert chain["filter"]["report"] == str(a / "filter_report.json")


def test_stage_chain_ignores_entries_of_another_output(tmp_path):
    record_stage(tmp_path / "trial.jsonl", "gen-queries", report=None, failures=None, full=False)
    assert stage_chain(tmp_path / "queries.jsonl") == {}
    assert stage_chain(tmp_path / "nowhere" / "queries.jsonl") == {}


def test_stage_chain_stops_on_a_cycle(tmp_path):
    finished(tmp_path / "x.jsonl", "gen-queries", input=tmp_path / "y.jsonl")
    finished(tmp_path / "y.jsonl", "infer-persona", input=tmp_path / "x.jsonl")
    assert list(stage_chain(tmp_path / "x.jsonl")) == ["gen-queries", "infer-persona"]


# --- the LLM run report ----------------------------------------------------------------------------


def entry(stage: str, units: int, **extra) -> dict:
    return {"stage": stage, "units": units, "model": "m", **extra}


def test_a_quick_look_does_not_replace_the_full_run(tmp_path):
    """BUG: the run report kept only the latest run per stage: a `--users X` look made the
    card say "1 user"."""
    path = tmp_path / "run_report.json"
    settings = LLMSettings()
    append_report(path, entry("gen-queries", 500), settings, full=True)
    append_report(path, entry("gen-queries", 1), settings, full=False)
    report = json.loads(path.read_text(encoding="utf-8"))
    assert report["stages"]["gen-queries"]["units"] == 500
    assert report["stages"]["gen-queries"]["full"] is True
    assert report["quick_looks"]["gen-queries"]["units"] == 1
    assert report["quick_looks"]["gen-queries"]["full"] is False

    append_report(path, entry("gen-queries", 2), settings, full=False)
    append_report(path, entry("gen-queries", 600), settings, full=True)
    report = json.loads(path.read_text(encoding="utf-8"))
    assert report["stages"]["gen-queries"]["units"] == 600
    assert report["quick_looks"]["gen-queries"]["units"] == 2  # the latest look stays visible
    assert report["stages"]["gen-queries"]["settings"] == settings.public()


def test_append_report_reads_full_from_the_entry_when_not_given(tmp_path):
    path = tmp_path / "run_report.json"
    append_report(path, entry("infer-persona", 9), LLMSettings())
    append_report(path, entry("infer-persona", 1, full=False), LLMSettings())
    report = json.loads(path.read_text(encoding="utf-8"))
    assert report["stages"]["infer-persona"]["units"] == 9
    assert report["quick_looks"]["infer-persona"]["units"] == 1


def test_append_report_keeps_other_stages_and_replaces_a_broken_file(tmp_path):
    path = tmp_path / "run_report.json"
    write_json(path, {"stages": {"infer-persona": entry("infer-persona", 7)}})
    append_report(path, entry("gen-queries", 5), LLMSettings())
    report = json.loads(path.read_text(encoding="utf-8"))
    assert sorted(report["stages"]) == ["gen-queries", "infer-persona"]

    path.write_text("[1, 2", encoding="utf-8")
    append_report(path, entry("gen-queries", 5), LLMSettings())
    assert list(json.loads(path.read_text(encoding="utf-8"))["stages"]) == ["gen-queries"]


def _append_many(path: str, worker: int, count: int, start) -> None:
    start.wait()
    for n in range(count):
        append_report(Path(path), entry(f"stage-{worker}-{n}", n), LLMSettings(), full=n % 2 == 0)


def test_two_processes_appending_at_once_lose_no_entry(tmp_path):
    path = tmp_path / "run_report.json"
    at_once(_append_many, path, 30)
    report = json.loads(path.read_text(encoding="utf-8"))
    assert len(report["stages"]) + len(report["quick_looks"]) == 3 * 30


# --- a copied or moved build reads its own folder -----------------------------------------------


def test_a_copied_build_reads_its_own_folder_once_the_original_is_gone(tmp_path, monkeypatch):
    """Issue 63: a build's manifest and reports name its files relative to the build, so the
    copy's stats and push read the copy (no warning about the first folder's reports) and
    stats names the files as the user does, without the machine's paths."""
    import shutil

    from conftest import SAMPLE_TASK1, order_free_responder
    from fake_openai import FakeOpenAI
    from rich.console import Console
    from typer.testing import CliRunner

    from personaemp.cli import app
    from personaemp.dataset.options import PersonaOptions
    from personaemp.pipeline import run_pipeline
    from personaemp.registry import RunOptions
    from personaemp.shared_options import LLMOptions, PathsOptions

    original, copy = tmp_path / "first", tmp_path / "copy"
    with FakeOpenAI(responder=order_free_responder()) as fake:
        options = RunOptions(
            paths=PathsOptions(input=str(SAMPLE_TASK1), processed=original / "data" / "processed"),
            persona=PersonaOptions(users=["sess_2118bd2f7f0c__8724", "sess_468a9b772d5b__44135"]),
            llm=LLMOptions(base_url=[fake.base_url], model="fake"),
        )
        run_pipeline(options, Console(quiet=True))
    shutil.copytree(original, copy)
    shutil.rmtree(original)
    monkeypatch.chdir(copy)
    runner = CliRunner()

    stats = runner.invoke(app, ["stats", "--force"])
    assert stats.exit_code == 0, stats.output
    assert "filter_report: data/processed/filter_report.json" in stats.output
    assert "queries: data/processed/queries.jsonl" in stats.output
    assert str(tmp_path) not in stats.output

    push = runner.invoke(app, ["push", "--dry-run", "--force"])
    assert push.exit_code == 0, push.output
    assert "warning" not in push.output.lower(), push.output
    assert str(original) not in push.output
    card = (copy / "data" / "processed" / "dataset" / "README.md").read_text(encoding="utf-8")
    assert "infer-persona" in card or "persona" in card
    for kept in ("manifest.json", "splits/split_report.json", ".personaemp/run_report.json"):
        assert str(tmp_path) not in (copy / "data" / "processed" / kept).read_text(encoding="utf-8"), kept
