"""Nothing stale between stages (issue 39): query ids are `<user_id>-qN`, so a rebuild gives
new texts under old ids. Criteria, responses and evaluate reports carry the hash of the
query they were made for; evaluate, table, push and export refuse a mismatch in one line
naming the queries and the command that remakes them; criteria and respond remake them.

The workspace and the scripted models are test_evaluation's (real files, the fake server)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import read_jsonl, write_jsonl
from fake_openai import FakeOpenAI
from test_evaluation import judge, user_row
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.split import split_users


def build(tmp_path: Path) -> Path:
    rows = [user_row("u1", ["u1-q1", "u1-q2"]), user_row("u2", ["u2-q1"]), user_row("u3", ["u3-q1"])]
    write_jsonl(tmp_path / "queries.jsonl", rows)
    write_jsonl(tmp_path / "splits" / "random" / "test.jsonl", rows)
    write_jsonl(tmp_path / "splits" / "random" / "train.jsonl", rows[:1])
    return tmp_path


def rewrite(path: Path, query_id: str, text: str) -> None:
    """A rebuild's new text under an old id."""
    rows = read_jsonl(path)
    for row in rows:
        for query in row["queries"]:
            if query["query_id"] == query_id:
                query["query"] = f"[{query_id}] {text}"
    write_jsonl(path, rows)


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_a_query_rewritten_after_criteria_is_refused_by_evaluate_then_remade(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.chdir(build(tmp_path))
    with FakeOpenAI(responder=judge) as server:
        common = ["--base-url", server.base_url, "--model", "fake", "--work-dir", "work"]
        assert (
            invoke("criteria", "--input", "queries.jsonl", "--output", "criteria.jsonl", *common).exit_code
            == 0
        )
        assert invoke("respond", "--splits", "splits", "--output", "memory.jsonl", *common).exit_code == 0
        rows = read_jsonl(tmp_path / "criteria.jsonl")
        assert all(len(row["query_hash"]) == 16 for row in rows)
        assert all(len(row["query_hash"]) == 16 for row in read_jsonl(tmp_path / "memory.jsonl"))
        rewrite(tmp_path / "splits" / "random" / "test.jsonl", "u2-q1", "My brother ignores my calls.")
        rewrite(tmp_path / "queries.jsonl", "u2-q1", "My brother ignores my calls.")
        before = server.count
        evaluate = ["evaluate", "--splits", "splits", "--responses", "memory.jsonl",
                    "--criteria", "criteria.jsonl", "--output", "eval.json", *common]  # fmt: skip
        result = invoke(*evaluate)
        assert result.exit_code == 2 and server.count == before, result.output
        error = result.output.strip().splitlines()
        assert len(error) == 1 and "memory.jsonl" in error[0] and "responses of 1 query" in error[0]
        assert "(u2-q1)" in error[0] and "run `personaemp respond --splits splits" in error[0]
        assert not (tmp_path / "eval.json").exists()
        # respond remakes the stale response alone; then the criteria are the stale ones
        assert invoke("respond", "--splits", "splits", "--output", "memory.jsonl", *common).exit_code == 0
        assert server.count == before + 1
        result = invoke(*evaluate)
        assert result.exit_code == 2, result.output
        assert "criteria.jsonl: the criteria of 1 query were made for another version of it (u2-q1)" in (
            result.output
        )
        assert "run `personaemp criteria --input QUERIES" in result.output
        # criteria remakes that query's criteria alone (3 dimensions), then evaluate scores
        assert (
            invoke("criteria", "--input", "queries.jsonl", "--output", "criteria.jsonl", *common).exit_code
            == 0
        )
        assert server.count == before + 1 + 3
        result = invoke(*evaluate)
        assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "eval.json").read_text())
    assert set(report["query_hashes"]) == {"u1-q1", "u1-q2", "u2-q1", "u3-q1"}


def test_table_refuses_a_report_whose_split_changed_since(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.chdir(build(tmp_path))
    with FakeOpenAI(responder=judge) as server:
        common = ["--base-url", server.base_url, "--model", "fake", "--work-dir", "work"]
        invoke("criteria", "--input", "queries.jsonl", "--output", "criteria.jsonl", *common)
        invoke("respond", "--splits", "splits", "--output", "memory.jsonl", *common)
        result = invoke("evaluate", "--splits", "splits", "--responses", "memory.jsonl",
                        "--criteria", "criteria.jsonl", "--output", "eval.json", *common)  # fmt: skip
        assert result.exit_code == 0, result.output
    assert invoke("table", "--report", "eval.json").exit_code == 0
    rewrite(tmp_path / "splits" / "random" / "test.jsonl", "u1-q2", "Nobody came to my party.")
    result = invoke("table", "--report", "eval.json")
    assert result.exit_code == 2
    assert "eval.json: 1 of its queries changed in splits/random/test.jsonl since it was scored (u1-q2)" in (
        result.output
    )
    assert "run `personaemp evaluate` again" in result.output


def test_push_and_export_refuse_criteria_made_for_other_queries(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.chdir(build(tmp_path))
    split_users(tmp_path / "queries.jsonl", tmp_path / "built", ood=False, seed=1, test_size=0.34)
    with FakeOpenAI(responder=judge) as server:
        common = ["--base-url", server.base_url, "--model", "fake", "--work-dir", "work"]
        invoke("criteria", "--input", "queries.jsonl", "--output", "criteria.jsonl", *common)
    push = ["push", "--splits", "built", "--dry-run", "--out-dir", "repo", "--criteria", "criteria.jsonl"]
    assert invoke(*push).exit_code == 0
    test_file = tmp_path / "built" / "random" / "test.jsonl"
    stale = read_jsonl(test_file)[0]["queries"][0]["query_id"]
    rewrite(test_file, stale, "Everyone forgot my birthday.")
    result = invoke(*push[:-4], "--out-dir", "repo2", "--criteria", "criteria.jsonl")
    assert result.exit_code == 2, result.output
    assert f"made for another version of it ({stale})" in result.output
    assert f"personaemp criteria --input {tmp_path / 'queries.jsonl'}" in result.output.replace("\n", "")
    assert not (tmp_path / "repo2").exists()
    result = invoke("export", "--splits", "built", "--part", "test", "--output", "train.jsonl",
                    "--criteria", "criteria.jsonl")  # fmt: skip
    assert result.exit_code == 2 and f"({stale})" in result.output, result.output
