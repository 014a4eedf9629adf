"""`personaemp export`: split files as TRL JSON lines and verl parquet, with respond's prompts.

The files are loaded the way the trainers load them (`datasets` for TRL, parquet through
pyarrow and `datasets` for verl); the prompts are compared with what `respond` really sends
(the fake server records it), and a parquet row's extra_info is scored by the reward.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_jsonl
from fake_openai import FakeOpenAI
from test_evaluation import user_row
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.evaluation.respond import write_responses
from personaemp.llm.settings import LLMSettings

RUNNER = CliRunner()


@pytest.fixture
def splits(tmp_path) -> Path:
    rows = [user_row("u1", ["u1-q1", "u1-q2"]), user_row("u2", ["u2-q1"]), user_row("u3", ["u3-q1"])]
    write_jsonl(tmp_path / "splits" / "random" / "train.jsonl", rows)
    write_jsonl(tmp_path / "splits" / "random" / "test.jsonl", rows[2:])
    return tmp_path / "splits"


def export(*args: str):
    result = RUNNER.invoke(app, ["export", *args])
    assert result.exit_code == 0, result.output
    return result


def test_trl_export_loads_in_datasets_with_the_prompts_respond_sends(splits, tmp_path):
    import datasets

    out = tmp_path / "train.jsonl"
    export("--splits", str(splits), "--part", "train", "--context", "rag", "--rag-k", "2", "-o", str(out))
    loaded = datasets.load_dataset("json", data_files=str(out), split="train")
    assert loaded.num_rows == 4
    first = loaded[0]
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    assert {"query_id", "user_id", "query", "situation", "persona", "memories", "big_five"} <= set(first)
    with FakeOpenAI(responder=lambda body, n: "a reply") as server:
        settings = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=tmp_path / "work")
        write_responses(splits, tmp_path / "r.jsonl", settings, part="train", context="rag", rag_k=2)
        sent = {json.dumps(r.body["messages"], sort_keys=True) for r in server.requests}
    exported = {json.dumps(row["prompt"], sort_keys=True) for row in loaded}
    assert exported == sent


def test_verl_parquet_has_verls_columns_and_the_rewards_extra_info(splits, tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "train.parquet"
    export("--splits", str(splits), "--format", "verl", "--context", "mismatch", "-o", str(out))
    table = pq.read_table(out)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    rows = table.to_pylist()
    assert {r["data_source"] for r in rows} == {"personaemp"} and rows[0]["ability"] == "empathy"
    assert rows[0]["reward_model"] == {"style": "rule", "ground_truth": ""}
    info = rows[0]["extra_info"]
    assert (info["index"], info["split"], info["context"]) == (0, "train", "mismatch")
    assert {"query_id", "persona", "memories", "situation", "query"} <= set(info)
    # mismatch: the policy reads another user's memories, the judge the user's own
    own = f"{info['user_id']} failed a driving test"
    assert own in json.dumps(info["memories"]) and own not in json.dumps(rows[0]["prompt"])
    import datasets

    assert datasets.load_dataset("parquet", data_files=str(out), split="train").num_rows == 4


def test_verl_rows_feed_the_reward(splits, tmp_path):
    """A parquet row as pandas hands it over (numpy arrays inside extra_info) scores as a dict does."""
    import pandas as pd

    from personaemp.training.reward import PereGRM

    out = tmp_path / "test.parquet"
    criteria = tmp_path / "criteria.jsonl"
    sheet = {
        d: [{"name": "n", "weight": 100.0, "description": "d"}]
        for d in ("resonation", "expression", "reception")
    }
    write_jsonl(criteria, [{"query_id": "u3-q1", "criteria": sheet}])
    export("--splits", str(splits), "--format", "verl", "--part", "test", "--criteria", str(criteria),
           "-o", str(out))  # fmt: skip
    info = pd.read_parquet(out)["extra_info"][0]
    assert info["criteria"]["resonation"][0]["description"] == "d"
    with FakeOpenAI() as server:  # schema instances: any valid judgment
        # the authors' reward (the safety term off: tests/integration/test_reward_safety.py has it)
        reward = PereGRM(
            LLMSettings(base_urls=[server.base_url], model="fake", work_dir=tmp_path / "w"), safety=0
        )
        from_pandas = reward.compute_score("personaemp", "I hear you.", "", info)
        from_dict = reward.compute_score(
            "personaemp", "I hear you.", "", pd.read_parquet(out).to_dict("records")[0]["extra_info"]
        )
        assert server.count == 4  # the second call was answered by the cache: the same requests
    assert from_pandas == from_dict


def test_memory_summary_needs_the_summaries_and_bad_input_is_one_line(splits, tmp_path):
    result = RUNNER.invoke(app, ["export", "--splits", str(splits), "--context", "memory-summary"])
    assert result.exit_code == 2 and "--summaries" in result.output
    write_jsonl(
        tmp_path / "s.jsonl",
        [{"query_id": q, "summary": f"SUMMARY {q}"} for q in ("u1-q1", "u1-q2", "u2-q1", "u3-q1")],
    )
    out = tmp_path / "x.jsonl"
    export(
        "--splits",
        str(splits),
        "--context",
        "memory-summary",
        "--summaries",
        str(tmp_path / "s.jsonl"),
        "-o",
        str(out),
    )
    assert "SUMMARY u2-q1" in out.read_text()
    result = RUNNER.invoke(app, ["export", "--splits", str(tmp_path / "nowhere")])
    assert (
        result.exit_code == 2 and "no such split file" in result.output and "Traceback" not in result.output
    )


def test_export_never_writes_over_its_input(splits):
    target = splits / "random" / "train.jsonl"
    result = RUNNER.invoke(app, ["export", "--splits", str(splits), "-o", str(target)])
    assert result.exit_code == 2 and "would write" in result.output


def test_a_training_score_is_the_evaluation_score_and_costs_nothing_after_it(splits, tmp_path):
    """`evaluate` (dynamic @2, bystander) on a responses file, then the reward on the exported
    rows with the same replies: every judgment comes from the cache, and H and the reward
    are the report's per-query numbers."""
    import datasets
    from rich.console import Console
    from test_evaluation import judge

    from personaemp.evaluation.evaluate import evaluate
    from personaemp.instruments.judges import JudgeOptions, harmonic
    from personaemp.training.reward import PereGRM

    responses = tmp_path / "full.jsonl"
    replies = {q: f"<think>plan</think>I am sorry ({q})." for q in ("u3-q1",)}
    write_jsonl(responses, [{"query_id": q, "response": r} for q, r in replies.items()])
    out = tmp_path / "test.jsonl"
    export("--splits", str(splits), "--part", "test", "-o", str(out))
    rows = datasets.load_dataset("json", data_files=str(out), split="train")
    steps = {"judge_dynamic": {"temperature": 0.7}}
    with FakeOpenAI(responder=judge) as server:
        settings = LLMSettings(
            base_urls=[server.base_url], model="fake", work_dir=tmp_path / "w", steps=steps
        )
        options = JudgeOptions(dynamic=True, samples=2, bystander=True)
        evaluate(splits, [responses], tmp_path / "report.json", settings, part="test", options=options,
                 console=Console(quiet=True))  # fmt: skip
        sent = server.count
        reward = PereGRM(settings, samples=2, safety=0)  # what evaluate scores: no safety judge
        columns = {key: rows[key] for key in rows.column_names if key != "prompt"}
        rewards = reward(prompts=rows["prompt"], completions=[[{"role": "assistant", "content": replies[q]}]
                         for q in rows["query_id"]], **columns)  # fmt: skip
        assert server.count == sent and reward.steps[0]["cache_hits"] == reward.steps[0]["calls"] == 7
    scored = [json.loads(line) for line in (tmp_path / "report.scores.jsonl").read_text().splitlines()]
    assert rewards == pytest.approx([harmonic(scored[0]["scores"]) + 0.5 * (scored[0]["bystander"] - 1)])
