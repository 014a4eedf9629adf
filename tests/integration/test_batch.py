"""--batch DIR: a stage built over rounds of batch files, with no endpoint reachable.

The executor below does what the OpenAI Batch API or `vllm run-batch` does with an input
file: it sends each line's body to a server (the fake one, in its own context, never the
stage's) and writes one output line per request, in the OpenAI batch output format. It
fails 5% of the lines of each round (a different 5% each time), as real batches do.
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path

from conftest import SAMPLE_TASK1, read_jsonl
from fake_openai import FakeOpenAI
from rich.console import Console

from personaemp.dataset.filter import filter_users
from personaemp.dataset.persona import infer_personas
from personaemp.dataset.queries import generate_queries
from personaemp.llm.settings import LLMSettings

QUIET = Console(quiet=True)
DEAD = "http://127.0.0.1:9/v1"  # nothing listens: a request sent there would fail the run


def execute(input_file: Path, server: FakeOpenAI, round_number: int) -> Path:
    """An OpenAI-batch-compatible executor: one output line per input line, 5% failed."""
    output = input_file.with_name(input_file.stem + ".output.jsonl")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    lines = []
    for n, line in enumerate(input_file.read_text(encoding="utf-8").splitlines()):
        request = json.loads(line)
        assert request["method"] == "POST" and request["url"] == "/v1/chat/completions"
        draw = hashlib.sha256(f"{request['custom_id']}/{round_number}".encode()).digest()[0]
        if draw < 256 * 0.05:
            error = {"code": "server_error", "message": "the batch worker crashed"}
            lines.append({"id": f"b{n}", "custom_id": request["custom_id"], "response": None, "error": error})
            continue
        sent = urllib.request.Request(
            f"{server.base_url}/chat/completions", json.dumps(request["body"]).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        body = json.loads(opener.open(sent, timeout=30).read())
        lines.append({"id": f"b{n}", "custom_id": request["custom_id"], "error": None,
                      "response": {"status_code": 200, "request_id": f"r{n}", "body": body}})  # fmt: skip
    output.write_text("".join(json.dumps(item) + "\n" for item in lines), encoding="utf-8")
    return output


def rounds(run, folder: Path, server: FakeOpenAI) -> tuple[object, int, int]:
    """Run the stage, execute what it asks for, again, until it asks for nothing."""
    failed = 0
    for number in range(1, 30):
        report = run().report
        if not report.batch["files"]:
            return report, number, failed
        before = server.count
        for file in report.batch["files"]:
            output = execute(Path(file), server, number)
            failed += sum(1 for line in read_jsonl(output) if line["error"])
        assert server.count > before
    raise AssertionError("the stage never finished")


def without_timestamps(rows: list[dict]) -> list[dict]:
    """Rows without their creation times (and the input hash, which covers the persona row's)."""
    for row in rows:
        row.pop("provenance", None)
        row.pop("input_hash", None)
        for query in row.get("queries", []) + row.get("rejected_queries", []):
            query.pop("provenance", None)
    return rows


def test_both_llm_stages_finish_over_batch_rounds_as_an_online_run_would(tmp_path):
    filtered = tmp_path / "filtered.jsonl"
    filter_users(SAMPLE_TASK1, filtered, console=QUIET)
    online, offline = tmp_path / "online", tmp_path / "offline"
    with FakeOpenAI() as server:
        live = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=online / "w")
        infer_personas(filtered, online / "personas.jsonl", live, console=QUIET)
        generate_queries(online / "personas.jsonl", online / "queries.jsonl", live, console=QUIET)

    with FakeOpenAI() as executor:  # a fresh server: the same replies for the same requests
        batch = LLMSettings(base_urls=[DEAD], model="fake", work_dir=offline / "w", batch=offline / "batches")
        report, persona_rounds, persona_failed = rounds(
            lambda: infer_personas(filtered, offline / "personas.jsonl", batch, console=QUIET),
            offline / "batches", executor,
        )  # fmt: skip
        assert report.outcome.done + report.outcome.done_before == 16 and report.outcome.pending == 0
        personas, queries = offline / "personas.jsonl", offline / "queries.jsonl"
        report, query_rounds, query_failed = rounds(
            lambda: generate_queries(personas, queries, batch, console=QUIET), offline / "batches", executor
        )
    print("rounds", persona_rounds, query_rounds, "failed lines", persona_failed, query_failed)
    assert persona_rounds >= 3 and query_rounds >= 3, "chained steps take a round each, failed lines one more"
    assert persona_failed + query_failed > 0, "the executor failed some lines, and they were asked again"
    for name in ("personas.jsonl", "queries.jsonl"):
        assert without_timestamps(read_jsonl(offline / name)) == without_timestamps(read_jsonl(online / name))
    # Every request was asked for once, and again only after its line failed.
    inputs = [line for f in sorted((offline / "batches").glob("*-round-*-part-*.jsonl"))
              if not f.name.endswith(".output.jsonl") for line in read_jsonl(f)]  # fmt: skip
    ids = [line["custom_id"] for line in inputs]
    assert len(ids) - len(set(ids)) == persona_failed + query_failed


def test_request_files_are_split_at_the_line_limit_with_unique_ids(tmp_path, monkeypatch):
    from personaemp.llm import batch

    monkeypatch.setattr(batch, "MAX_LINES", 3)
    queue = batch.BatchQueue()
    for n in range(7):
        body = {"model": "m", "messages": [{"role": "user", "content": f"q{n}"}], "max_tokens": 5}
        queue.add("persona", body, f"k{n}")
    queue.add("persona", {"model": "m", "messages": [], "max_tokens": 5}, "k0")  # asked twice: written once
    files = batch.write_requests(tmp_path, "infer-persona", queue, {})
    assert [f.name for f in files] == [f"infer-persona-round-1-part-{k}.jsonl" for k in (1, 2, 3)]
    ids = [line["custom_id"] for f in files for line in read_jsonl(f)]
    assert [len(read_jsonl(f)) for f in files] == [3, 3, 1] and ids == [f"persona-k{n}" for n in range(7)]
    assert batch.write_requests(tmp_path, "infer-persona", queue, {})[0].name.startswith(
        "infer-persona-round-2-"
    )


def test_run_with_batch_stops_after_the_stage_that_waits(tmp_path):
    from personaemp.config import load_config
    from personaemp.pipeline import run_pipeline

    config = tmp_path / "p.toml"
    config.write_text(
        f'[paths]\ninput = "{SAMPLE_TASK1}"\nprocessed = "{tmp_path / "out"}"\n'
        f'[llm]\nbase_url = ["{DEAD}"]\nmodel = "fake"\nbatch = "{tmp_path / "batches"}"\n',
        encoding="utf-8",
    )
    result = run_pipeline(load_config(config), QUIET)
    assert list(result.reports) == ["filter", "infer-persona"]
    assert result.reports["infer-persona"].batch["requests"] == 16
    assert [p.name for p in (tmp_path / "batches").iterdir()] == ["infer-persona-round-1-part-1.jsonl"]
    assert not (tmp_path / "out" / "queries.jsonl").exists()


def test_a_refused_line_fails_its_unit_and_a_round_is_never_written_twice(tmp_path):
    """Before: a 400 answer was asked again every round, and running the command again
    before the answers came wrote the same requests into a second round."""
    import pytest

    from personaemp.errors import InputError

    filtered = tmp_path / "filtered.jsonl"
    filter_users(SAMPLE_TASK1, filtered, console=QUIET)
    folder = tmp_path / "batches"
    batch = LLMSettings(base_urls=[DEAD], model="fake", work_dir=tmp_path / "w", batch=folder)
    run = lambda: infer_personas(filtered, tmp_path / "p.jsonl", batch, console=QUIET).report  # noqa: E731
    first = run()
    again = run()  # nothing answered yet: the same file is still the one to submit
    assert again.batch["new_files"] == [] and again.batch["files"] == first.batch["files"]
    assert [p.name for p in folder.iterdir()] == ["infer-persona-round-1-part-1.jsonl"]

    lines = read_jsonl(Path(first.batch["files"][0]))
    refused = lines[0]["custom_id"]
    with FakeOpenAI() as executor:
        output = execute(Path(first.batch["files"][0]), executor, 99)  # 99: a round where no line fails
    rows = read_jsonl(output)
    rows[0]["response"] = {"status_code": 400, "body": {"error": {"message": "max_tokens is too large"}}}
    output.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    report = run()
    assert report.batch["refused"] == 1 and report.outcome.failed == 1
    assert refused not in {
        line["custom_id"] for f in report.batch["new_files"] for line in read_jsonl(Path(f))
    }
    failure = read_jsonl(tmp_path / "infer-persona.failures.jsonl")[0]
    assert failure["kind"] == "http_error" and "max_tokens is too large" in failure["error"]
    with pytest.raises(InputError, match="needs --model"):
        LLMSettings(base_urls=[DEAD], batch=folder)
