"""`--limit N` means N units in all, with or without shards (issue 39): a quick look picks the
first N users of the whole input, each shard works on those the hash gives it, and merge
joins them into what one `--limit N` run writes."""

from __future__ import annotations

import json

from conftest import SAMPLE_TASK1, order_free_responder, read_jsonl
from fake_openai import FakeOpenAI
from rich.console import Console
from test_scale import comparable
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.filter import filter_users
from personaemp.shards import shard_of

QUIET = Console(quiet=True)


def test_limit_4_over_two_shards_builds_4_units_and_merges_into_one_runs_output(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    for folder in ("shards", "alone"):
        filter_users(str(SAMPLE_TASK1), tmp_path / folder / "filtered.jsonl", console=QUIET)
    users = [row["user_id"] for row in read_jsonl(tmp_path / "shards" / "filtered.jsonl")]
    first4 = users[:4]
    assert {shard_of(uid, 2) for uid in first4} == {1, 2}, "the sample's first 4 users fall in both shards"
    runner = CliRunner()
    with FakeOpenAI(responder=order_free_responder()) as server:

        def persona(folder: str, *extra: str):
            here = tmp_path / folder
            result = runner.invoke(app, [
                "infer-persona", "-i", str(here / "filtered.jsonl"), "-o", str(here / "personas.jsonl"),
                "--work-dir", str(here / "work"), "--base-url", server.base_url, "--model", "fake",
                "--limit", "4", *extra,
            ])  # fmt: skip
            assert result.exit_code == 0, result.output

        persona("shards", "--shard", "1/2")
        persona("shards", "--shard", "2/2")
        persona("alone")
    parts = [read_jsonl(tmp_path / "shards" / f"personas.shard-{i}-of-2.jsonl") for i in (1, 2)]
    assert sorted(row["user_id"] for part in parts for row in part) == sorted(first4)
    assert all(shard_of(row["user_id"], 2) == i for i, part in enumerate(parts, 1) for row in part)
    result = runner.invoke(app, ["merge", "infer-persona", "-i", str(tmp_path / "shards" / "filtered.jsonl"),
                                 "-o", str(tmp_path / "shards" / "personas.jsonl")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert comparable(tmp_path / "shards" / "personas.jsonl") == comparable(
        tmp_path / "alone" / "personas.jsonl"
    )
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert manifest["infer-persona"]["full"] is False, "a quick look's merge is a quick look"
