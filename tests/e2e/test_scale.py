"""Scale: `run` feeds gen-queries while infer-persona still runs, LLM stages read their input
lazily, and shards on several processes merge into what one run writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import SAMPLE_TASK1, copy_sample, order_free_responder, read_jsonl
from fake_openai import FakeOpenAI, server_error
from rich.console import Console
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.filter import filter_users
from personaemp.dataset.options import SplitOptions
from personaemp.dataset.persona import infer_personas
from personaemp.dataset.queries import generate_queries
from personaemp.errors import InputError, PersonaempError
from personaemp.io import read_stage_rows
from personaemp.llm.settings import LLMSettings
from personaemp.pipeline import persona_and_queries, run_pipeline
from personaemp.records import User
from personaemp.registry import STAGES, RunOptions
from personaemp.shards import shard_of
from personaemp.shared_options import LLMOptions, PathsOptions

QUIET = Console(quiet=True)
# What `run` streams, shards and stops is the point here, not its plots: placeholder bytes
# for stats' and push's figures (conftest.plots_undrawn; the drawing: test_stats.py).
pytestmark = pytest.mark.usefixtures("plots_undrawn")


def step_of(body: dict) -> str:
    properties = body["response_format"]["json_schema"]["schema"]["properties"]
    return "persona" if "depth" in properties else "gen-queries"


def comparable(path: Path) -> list[dict]:
    """A stage file's rows without the time they were made at (which a queries row's
    input_hash covers: its input row holds the persona's)."""
    rows = read_jsonl(path)
    for row in rows:
        row.get("provenance", {}).pop("created_at", None)
        if "queries" in row:
            row.pop("input_hash")
        for query in [*row.get("queries", []), *row.get("rejected_queries", [])]:
            query["provenance"].pop("created_at", None)
    return rows


def one_stage_at_a_time(folder: Path, base_url: str) -> None:
    """The reference: filter, then each LLM stage alone over its whole input."""
    filter_users(str(SAMPLE_TASK1), folder / "filtered.jsonl", console=QUIET)
    settings = LLMSettings(base_urls=[base_url], model="fake", work_dir=folder / "work")
    infer_personas(folder / "filtered.jsonl", folder / "personas.jsonl", settings, console=QUIET)
    generate_queries(folder / "personas.jsonl", folder / "queries.jsonl", settings, console=QUIET)


def test_run_starts_gen_queries_before_the_last_persona_and_writes_what_the_stages_write(tmp_path):
    """Before: gen-queries waited for the slowest persona (the endpoint idled meanwhile)."""
    with FakeOpenAI(responder=order_free_responder(), latency=lambda: 0.01) as server:
        processed = tmp_path / "processed"
        options = RunOptions(
            paths=PathsOptions(input=str(SAMPLE_TASK1), processed=processed),
            llm=LLMOptions(base_url=[server.base_url], model="fake", concurrency=2),
            split=SplitOptions(ood=False),
        )
        STAGES["filter"].run(options, QUIET)
        made = persona_and_queries(options, QUIET)  # what `run` calls: see test_pipeline
        result = SimpleNamespace(reports={"infer-persona": made[0].report, "gen-queries": made[1].report})
        steps = [step_of(request.body) for request in server.chat_requests]
        assert steps.index("gen-queries") < len(steps) - 1 - steps[::-1].index("persona")

        sent = server.count
        again = [made.report for made in persona_and_queries(options, QUIET)]
        assert server.count == sent, "a re-run sends nothing"
        assert again[0].outcome.done == 0
        assert again[1].outcome.done_before == result.reports["gen-queries"].outcome.units
        # The command alone finds every row the chain wrote finished (same input hashes).
        settings = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=processed / ".personaemp")
        alone = generate_queries(processed / "personas.jsonl", processed / "queries.jsonl", settings).report
        assert alone.outcome.done_before == alone.outcome.units and server.count == sent

        one_stage_at_a_time(tmp_path / "alone", server.base_url)
    for name in ("personas.jsonl", "queries.jsonl", "rejected.jsonl"):
        assert comparable(processed / name) == comparable(tmp_path / "alone" / name), name
    for report in result.reports["infer-persona"], result.reports["gen-queries"]:
        assert report.outcome.balanced and report.outcome.done == report.outcome.units > 0
    steps_of = {name: set(result.reports[name].steps) for name in ("infer-persona", "gen-queries")}
    assert steps_of == {
        "infer-persona": {"persona"},
        "gen-queries": {"situations", "check"},
    }
    manifest = json.loads((processed / "manifest.json").read_text())
    assert {"infer-persona", "gen-queries"} <= set(manifest)


def test_a_stopped_chain_keeps_what_both_stages_finished(tmp_path):
    """The endpoint goes away mid-run: the next run sends only what was not finished."""
    with FakeOpenAI(responder=order_free_responder()) as server:
        processed = tmp_path / "processed"
        options = RunOptions(
            paths=PathsOptions(input=str(SAMPLE_TASK1), processed=processed),
            llm=LLMOptions(base_url=[server.base_url], model="fake", concurrency=1, max_retries=0),
            split=SplitOptions(ood=False),
        )
        STAGES["filter"].run(options, QUIET)
        # Requests answered before every later one fails: every persona (one request each) and
        # three users' queries (two each); the 8 or more users left then fail in a row.
        budget = len(read_jsonl(processed / "filtered.jsonl")) + 3 * 2
        healthy = server.responder
        server.responder = lambda body, n: healthy(body, n) if n <= budget else server_error(500)
        with pytest.raises(Exception, match="failed 8 requests in a row"):
            persona_and_queries(options, QUIET)
        finished = len(read_jsonl(processed / "personas.jsonl")), len(read_jsonl(processed / "queries.jsonl"))
        assert finished[0] > 0 and finished[1] > 0
        server.responder = healthy
        persona_and_queries(options, QUIET)
        one_stage_at_a_time(tmp_path / "alone", server.base_url)
    for name in ("personas.jsonl", "queries.jsonl"):
        assert comparable(processed / name) == comparable(tmp_path / "alone" / name), name


def test_stage_rows_are_read_lazily_and_a_changed_input_stops_the_stage(tmp_path):
    path = tmp_path / "filtered.jsonl"
    filter_users(str(SAMPLE_TASK1), path, console=QUIET)
    rows, skipped = read_stage_rows(path, User)
    assert skipped == 0 and not hasattr(rows, "rows"), "ids and offsets only"
    assert [row["user_id"] for row in rows] == rows.ids == [row["user_id"] for row in read_jsonl(path)]
    first = rows.part(lambda uid: shard_of(uid, 2) == 1)
    second = rows.part(lambda uid: shard_of(uid, 2) == 2)
    assert sorted(first.ids + second.ids) == sorted(rows.ids) and first.ids and second.ids
    with path.open("a") as handle:
        handle.write("\n")
    with pytest.raises(InputError, match="changed while the stage was reading it"):
        list(rows)


def cli(*args: str, base_url: str) -> subprocess.Popen:
    env = {**os.environ, "OPENAI_API_KEY": "sk-test", "NO_COLOR": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "personaemp", *args, "--base-url", base_url, "--model", "fake"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def in_parallel(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr


def merge(folder: Path, stage: str, input_name: str, output_name: str):
    args = ["merge", stage, "-i", str(folder / input_name), "-o", str(folder / output_name)]
    return CliRunner().invoke(app, args)


def test_three_shards_in_parallel_processes_merge_into_what_one_run_writes(tmp_path):
    shards = tmp_path / "shards"
    filter_users(str(SAMPLE_TASK1), shards / "filtered.jsonl", console=QUIET)
    work = ["--work-dir", str(shards / "work")]  # one cache for all: SQLite takes several writers
    with FakeOpenAI(responder=order_free_responder(), latency=lambda: 0.005) as server:
        url = server.base_url
        persona = ["-i", str(shards / "filtered.jsonl"), "-o", str(shards / "personas.jsonl"), *work]
        in_parallel([cli("infer-persona", *persona, "--shard", f"{i}/3", base_url=url) for i in (1, 2, 3)])
        parts = [read_jsonl(shards / f"personas.shard-{i}-of-3.jsonl") for i in (1, 2, 3)]
        assert all(parts) and all(
            shard_of(row["user_id"], 3) == i for i, part in enumerate(parts, 1) for row in part
        )

        early = merge(shards, "gen-queries", "personas.jsonl", "queries.jsonl")
        assert early.exit_code == 2 and "no shards of" in early.stderr
        result = merge(shards, "infer-persona", "filtered.jsonl", "personas.jsonl")
        assert result.exit_code == 0, result.output
        assert "3 shards merged: 16 units, 16 done, 0 failed" in result.stderr

        queries = ["-i", str(shards / "personas.jsonl"), "-o", str(shards / "queries.jsonl"), *work]
        for i in (1, 2, 3):  # here one after the other, in this process
            done = CliRunner().invoke(
                app, ["gen-queries", *queries, "--shard", f"{i}/3", "--base-url", url, "--model", "fake"]
            )
            assert done.exit_code == 0, done.output
        (shards / "queries.shard-2-of-3.jsonl").rename(tmp_path / "aside.jsonl")
        missing = merge(shards, "gen-queries", "personas.jsonl", "queries.jsonl")
        assert missing.exit_code == 2 and "shard 2 of 3 not found" in missing.stderr
        assert not (shards / "queries.jsonl").exists(), "nothing written"
        (tmp_path / "aside.jsonl").rename(shards / "queries.shard-2-of-3.jsonl")
        result = merge(shards, "gen-queries", "personas.jsonl", "queries.jsonl")
        assert result.exit_code == 0, result.output

        one_stage_at_a_time(tmp_path / "alone", url)
    for name in ("personas.jsonl", "queries.jsonl"):
        assert comparable(shards / name) == comparable(tmp_path / "alone" / name), name
    report = json.loads((shards / "work" / "run_report.json").read_text())["stages"]
    assert report["infer-persona"]["shards"] == 3 and report["infer-persona"]["done"] == 16
    assert report["infer-persona"]["totals"]["requests"] == sum(
        report[f"infer-persona shard {i}/3"]["totals"]["requests"] for i in (1, 2, 3)
    )
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["gen-queries"]["output"] == "queries.jsonl" and manifest["gen-queries"]["full"]


def test_run_stops_at_once_when_another_process_writes_the_queries(tmp_path):
    from personaemp import locks

    processed = tmp_path / "processed"
    options = RunOptions(
        paths=PathsOptions(input=str(SAMPLE_TASK1), processed=processed),
        llm=LLMOptions(base_url=["http://127.0.0.1:9/v1"], model="fake"),
    )
    processed.mkdir()
    (processed / "queries.jsonl").write_bytes(b"")
    writing = locks.exclusive(processed / "queries.jsonl")  # as a gen-queries elsewhere would
    with writing, pytest.raises(InputError, match="queries.jsonl is being written by process"):
        run_pipeline(options, QUIET)
    assert not (processed / "personas.jsonl").exists(), "no stage started"


def test_per_user_schemas_leave_the_step_schema_as_it_was():
    """Schemas are edited along one path (no deep copy per request): the cached schema of
    the step must not pick up one user's ids."""
    from types import SimpleNamespace

    from personaemp.dataset.persona import PERSONA_STEP, persona_schema

    def user(*ids):
        return SimpleNamespace(memories=[SimpleNamespace(memory_id=i) for i in ids])

    before = json.dumps(PERSONA_STEP.schema)
    first, second = persona_schema(user("m1", "m2")), persona_schema(user("m9"))
    evidence = lambda schema: schema["$defs"]["TraitReply"]["properties"]["evidence"]["items"]  # noqa: E731
    assert evidence(first)["enum"] == ["m1", "m2"] and evidence(second)["enum"] == ["m9"]
    assert json.dumps(PERSONA_STEP.schema) == before


def test_a_shard_summarizes_its_own_personas(tmp_path):
    """Before: infer-persona --shard counted the personas of the unsharded output file."""
    filter_users(str(SAMPLE_TASK1), tmp_path / "filtered.jsonl", console=QUIET)
    with FakeOpenAI(responder=order_free_responder()) as server:
        settings = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=tmp_path / "work")
        summary = infer_personas(
            tmp_path / "filtered.jsonl", tmp_path / "personas.jsonl", settings, shard="2/3", console=QUIET
        ).summary
    rows = read_jsonl(tmp_path / "personas.shard-2-of-3.jsonl")
    assert rows and not (tmp_path / "personas.jsonl").exists()
    assert summary.users_in == len(rows) == summary.eligible + summary.ineligible
    assert summary.eligible == sum(row["eligible"] for row in rows)


# --- run: the filter streamed into infer-persona (streaming.py) --------------------------------


def copied_sample(target: Path, copies: int) -> Path:
    """`copies` times the sample (16 kept rows of about 3.9 KB each). Above 192 KB of kept
    rows (the pipe's 64 KB and asyncio's reader, which pauses past 128 KB) the filter cannot
    finish before infer-persona has taken some of them: 4 copies are 250 KB."""
    return copy_sample(SAMPLE_TASK1, target, copies)


def streamed_options(source: Path, processed: Path, base_url: str, **llm) -> RunOptions:
    return RunOptions(
        paths=PathsOptions(input=str(source), processed=processed),
        llm=LLMOptions(base_url=[base_url], model="fake", concurrency=2, **llm),  # a window of 4 units
        split=SplitOptions(ood=False),
    )


def test_run_sends_requests_while_the_filter_still_reads_and_writes_what_the_stages_write(tmp_path):
    source = copied_sample(tmp_path / "input", 6)  # 375 KB of kept rows: the filter must wait
    processed = tmp_path / "processed"
    seen_filtered = []  # at each request: had the filter written its output yet?
    responder = order_free_responder()

    def noting(body, n):
        seen_filtered.append((processed / "filtered.jsonl").exists())
        return responder(body, n)

    with FakeOpenAI(responder=noting) as server:
        console = Console(file=open(tmp_path / "console.txt", "w"))  # noqa: SIM115
        result = run_pipeline(streamed_options(source, processed, server.base_url), console)
        console.file.close()
        # Held back by the pipe, the filter cannot end before the first request (whether the
        # last one comes before or after its end is a race, so it is not asserted).
        assert seen_filtered[0] is False, "the first request went out before the filter ended"
        sent = server.count
        again = run_pipeline(streamed_options(source, processed, server.base_url), QUIET)
        assert server.count == sent, "a re-run sends nothing"
        # ... and reads nothing of the LLM stages: skipped whole, their counts the last run's
        assert again.reports["infer-persona"] is None
        assert again.results["infer-persona"].counts == result.results["infer-persona"].counts

        alone = tmp_path / "alone"
        report = filter_users(str(source), alone / "filtered.jsonl", console=QUIET).report
        # The run's own cache: the stages alone get the same replies without asking again.
        settings = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=processed / ".personaemp")
        infer_personas(alone / "filtered.jsonl", alone / "personas.jsonl", settings, console=QUIET)
        generate_queries(alone / "personas.jsonl", alone / "queries.jsonl", settings, console=QUIET)
    text = (tmp_path / "console.txt").read_text()
    assert "filter → infer-persona → gen-queries" in text and "filter funnel" in text
    assert result.reports["filter"].kept == report.kept == 96
    assert (processed / "filtered.jsonl").read_bytes() == (alone / "filtered.jsonl").read_bytes()
    for name in ("personas.jsonl", "queries.jsonl", "rejected.jsonl"):
        assert comparable(processed / name) == comparable(alone / name), name
    manifest = json.loads((processed / "manifest.json").read_text())
    assert {"filter", "infer-persona", "gen-queries", "split"} <= set(manifest)
    assert json.loads((processed / "filter_report.json").read_text())["kept"] == 96


def leftovers(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.rglob("*.tmp"))


def filter_children() -> list[int]:
    """This process's children still running the streamed filter (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"filter_child" in command:
            found.append(int(stat.parent.name))
    return found


def test_a_bad_row_the_streamed_filter_meets_late_stops_run_and_loses_nothing(tmp_path):
    """infer-persona has admitted the users before the bad row: it must not rewrite its file
    from those alone (the others' personas would be lost), and the filter keeps its output."""
    source = copied_sample(tmp_path / "input", 3)
    processed = tmp_path / "processed"
    with FakeOpenAI(responder=order_free_responder()) as server:
        run_pipeline(streamed_options(source, processed, server.base_url), QUIET)
        before = {name: (processed / name).read_bytes() for name in ("filtered.jsonl", "personas.jsonl")}
        lines = (source / "model_input.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
        lines[-3] = "{not json\n"
        (source / "model_input.jsonl").write_text("".join(lines), encoding="utf-8")
        with pytest.raises(InputError, match=rf"model_input.jsonl:{len(lines) - 2}"):
            run_pipeline(streamed_options(source, processed, server.base_url), QUIET)
    for name, data in before.items():
        assert (processed / name).read_bytes() == data, name
    assert leftovers(processed) == [] and filter_children() == []


def test_run_stopped_by_the_endpoint_stops_the_streamed_filter_and_leaves_no_partial_file(tmp_path):
    source = copied_sample(tmp_path / "input", 6)  # more than the pipe holds: it cannot end first
    processed = tmp_path / "processed"
    with FakeOpenAI(responder=order_free_responder(), require_key="sk-right") as server:
        options = streamed_options(source, processed, server.base_url, max_retries=0)
        with pytest.raises(PersonaempError, match="(?i)api key"):
            run_pipeline(options, QUIET, env={"OPENAI_API_KEY": "sk-wrong"})
    assert not (processed / "filtered.jsonl").exists(), "the filter stopped with the run"
    assert leftovers(processed) == [] and filter_children() == []


def test_errors_cross_a_process_whole():
    """The streamed filter's error reaches `run` as if raised there (hint, location, code)."""
    import pickle

    from personaemp.errors import RowError

    error = pickle.loads(pickle.dumps(RowError("in.jsonl:7", "not JSON")))
    assert (type(error), error.location, error.exit_code) == (RowError, "in.jsonl:7", 2)
    assert str(error) == "in.jsonl:7: not JSON — fix the row or pass --on-error skip"
    hinted = pickle.loads(pickle.dumps(InputError("bad", "do this")))
    assert str(hinted) == "bad — do this"


def test_the_streamed_filter_stops_cleanly_when_run_was_started_with_sigint_ignored(tmp_path):
    """`personaemp run &` from a script starts with SIGINT ignored; the child inherited that,
    so stopping it waited 10 s, killed it and left its partial output behind."""
    import signal
    import time

    from personaemp.dataset.filter import filter_args
    from personaemp.dataset.streaming import FilterFeed

    source = copied_sample(tmp_path / "input", 3)
    options = streamed_options(source, tmp_path / "processed", "http://127.0.0.1:9/v1")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with FilterFeed(filter_args(options.filter)):
            time.sleep(1.5)  # the child is writing its output, blocked on the full pipe
            started = time.monotonic()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 5, "stopped by SIGINT, not killed after the 10 s wait"
    assert leftovers(tmp_path / "processed") == [] and filter_children() == []


STOP_REPORTER = """\
import os, select, signal, struct, sys
def stop(signum, frame):  # is the pipe to the parent still open when the stop comes?
    poller = select.poll()
    poller.register(1, select.POLLOUT)
    events = dict(poller.poll(0)).get(1, 0)
    with open(os.environ["STOP_REPORT"], "w") as report:
        report.write("broken" if events & (select.POLLERR | select.POLLHUP) else "open")
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
sys.stdin.buffer.read()
row = b'{"user_id": "u1"}'
while True:
    sys.stdout.buffer.write(struct.pack(">cQ", b"r", len(row)) + row)
    sys.stdout.buffer.flush()
"""


def test_a_stopped_stream_stops_the_filter_before_closing_its_pipe(tmp_path, monkeypatch):
    """The pipe closed first broke the child's write, and the SIGTERM that followed could land
    while it removed its partial output: a `.filtered.jsonl.*.tmp` was left (a loaded CI run)."""
    import asyncio

    from personaemp.dataset import streaming

    monkeypatch.setattr(streaming, "_CHILD", STOP_REPORTER)
    monkeypatch.setenv("STOP_REPORT", str(tmp_path / "stop.txt"))

    async def take_one(feed):
        async with feed:
            assert (await feed.__anext__())["user_id"] == "u1"  # then the run stops

    with streaming.FilterFeed({"source": SAMPLE_TASK1}) as feed:  # the stand-in child reads none of it
        asyncio.run(take_one(feed))
    assert (tmp_path / "stop.txt").read_text() == "open"
