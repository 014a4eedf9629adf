"""extract-memories: the checks on a reply, the stage on the engine, the pipeline after it,
and the comparison with AlpsBench's gold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SAMPLE_TASK1, order_free_responder, read_jsonl, write_jsonl
from fake_openai import PROFILES, FakeOpenAI
from log_shapes import SHAPES, TABLE_COLUMNS, expected_users, regroup, write_shape
from rich.console import Console
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.filter import filter_users
from personaemp.dataset.memories import (
    EXTRACT_STEP,
    TAXONOMY,
    Conversations,
    ExtractionReply,
    build_extraction_messages,
    extract_memories,
    extraction_schema,
    parse_extraction,
    user_messages,
)
from personaemp.dataset.memory_gold import compare_with_gold, value_overlap
from personaemp.dataset.persona import infer_personas
from personaemp.dataset.queries import generate_queries
from personaemp.llm.settings import LLMSettings
from personaemp.llm.step import RejectedReply
from personaemp.prompts import load_prompt
from personaemp.sources.logs import DEFAULT_COLUMNS

TABLE = dict(zip(("user", "session", "order", "role", "text", "time"), TABLE_COLUMNS[1::2], strict=True))
QUIET = Console(quiet=True)


def unit() -> Conversations:
    return Conversations.model_validate(
        {
            "user_id": "u1",
            "source": {"format": "messages", "path": "log.jsonl"},
            "sessions": [
                {"session_id": "c1", "timestamp": "2023-04-01", "turns": [
                    {"utterance_index": 1, "role": "user", "text": "My sister and I argued again."},
                    {"utterance_index": 2, "role": "assistant", "text": "That sounds hard."},
                    {"utterance_index": 3, "role": "user", "text": "I feel awful and cannot sleep."},
                ]},
                {"session_id": "c2", "turns": [
                    {"utterance_index": 0, "role": "user", "text": "Fix my SQL query"},
                ]},
            ],
        }
    )  # fmt: skip


def memory(turn: str, value: str = "Argues with their sister", quote: str = "argued again", **extra) -> dict:
    return {
        "type": "direct", "label": "Social_Relationships/Family", "label_suggestion": None, "value": value,
        "evidence": {"turn": turn, "quote": quote}, "confidence": 0.95, "emotion": None,
        "time_scope": "long_term", **extra,
    }  # fmt: skip


def extraction(*memories: dict, intents=()) -> ExtractionReply:
    return ExtractionReply.model_validate({"memory_items": list(memories), "intents_ranked": list(intents)})


# --- the step's functions --------------------------------------------------------------------------


def test_messages_number_the_users_own_turns_and_fence_the_dialogue():
    prompt = load_prompt(EXTRACT_STEP.prompt)
    messages = build_extraction_messages(unit(), prompt)
    text = messages[-1]["content"]
    assert "[t1] My sister and I argued again." in text and "[t3] Fix my SQL query" in text
    assert "That sounds hard." not in text  # the assistant's words are not the user's
    assert "Conversation c1, 2023-04-01:" in text and "Social_Relationships/Family" in text
    assert text.count("<dialogue-") == 1 and text.rstrip().endswith(">")
    ids = extraction_schema(unit())["$defs"]["EvidenceReply"]["properties"]["turn"]["enum"]
    assert ids == ["t1", "t2", "t3"]
    assert [(m.session_id, m.utterance_index) for m in user_messages(unit())] == [
        ("c1", 1),
        ("c1", 3),
        ("c2", 0),
    ]


def test_parse_keeps_memories_in_alpsbench_shape_citing_real_turns():
    items, intents, checks = parse_extraction(
        unit(),
        extraction(
            memory("t1"),
            memory("t2", "Has trouble sleeping", quote="not what they wrote", emotion="distress"),
            intents=[{"intent_category": "Emotional Support", "intent_subtype": " venting "}],
        ),
    )
    assert [m["memory_id"] for m in items] == ["m1", "m2"]
    assert items[0]["evidence"] == {"session_id": "c1", "utterance_index": 1, "text": "argued again"}
    # a quote not in the cited message: the message's own text is the evidence
    assert items[1]["evidence"]["text"] == "I feel awful and cannot sleep." and checks.quotes_replaced == 1
    assert items[1]["emotion"] == "distress" and items[0]["updated_at"] == "2023-04-01"
    assert intents == [{"intent_category": "Emotional Support", "intent_subtype": "venting"}]
    assert set(items[0]) >= {"type", "label", "label_suggestion", "value", "confidence", "time_scope"}


def test_parse_drops_unknown_turns_blank_values_and_duplicates_and_unmaps_foreign_labels():
    proposed = extraction(
        memory("t9"), memory("t1", "   "), memory("t1"), memory("t1"), memory("t2", "Sleeps badly")
    )
    # a label outside the taxonomy: an endpoint that does not enforce the schema's enum
    proposed.memory_items[-1] = proposed.memory_items[-1].model_copy(update={"label": "Health/Sleep"})
    items, _, checks = parse_extraction(unit(), proposed)
    assert (checks.dropped_unknown_turn, checks.dropped_empty, checks.dropped_duplicate) == (1, 1, 1)
    assert checks.labels_unmapped == 1
    assert items[-1]["label"] == "UNMAPPED" and items[-1]["label_suggestion"] == "Health/Sleep"
    assert checks.kept == len(items) == 2


def test_a_reply_whose_every_memory_is_ungrounded_is_refused_and_none_at_all_is_fine():
    with pytest.raises(RejectedReply) as refused:
        parse_extraction(unit(), extraction(memory("t7"), memory("t8")))
    assert refused.value.kind == "ungrounded"
    items, _, checks = parse_extraction(unit(), extraction())
    assert items == [] and checks.proposed == 0


# --- the stage -------------------------------------------------------------------------------------


def settings(server: FakeOpenAI, work: Path, **extra) -> LLMSettings:
    return LLMSettings(base_urls=[server.base_url], model="fake", work_dir=work, api_key="sk-test", **extra)


@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_goes_through_filter_persona_and_queries(tmp_path, shape):
    """Real dialogues regrouped (held-back rows, not the readers' tests'), extracted against the
    capable test model, then the pipeline as it runs on AlpsBench."""
    dealt = regroup(range(30, 39), users=3, prefix=shape)
    log = write_shape(shape, dealt, tmp_path / "log")
    columns = TABLE if shape == "table" else None
    out = tmp_path / "out"
    with FakeOpenAI(responder=order_free_responder()) as server:
        llm = settings(server, out / "work")
        made = extract_memories(log, out / "memories.jsonl", llm, columns=columns, console=QUIET)
        report, summary = made.report, made.summary
        assert report.outcome.failed == 0 and report.outcome.done == 3
        rows = read_jsonl(out / "memories.jsonl")
        assert {r["user_id"]: [s["session_id"] for s in r["sessions"]] for r in rows} == expected_users(dealt)
        for row in rows:  # every memory cites a user turn of its own user, quoting it
            turns = {(s["session_id"], t["utterance_index"]): t for s in row["sessions"] for t in s["turns"]}
            for item in row["memory_items"]:
                cited = turns[(item["evidence"]["session_id"], item["evidence"]["utterance_index"])]
                assert cited["role"] == "user" and item["evidence"]["text"] in cited["text"]
                assert item["label"] in TAXONOMY
        filtered = filter_users(str(out / "memories.jsonl"), out / "filtered.jsonl", console=QUIET).report
        assert filtered.kept == 3 and filtered.bad_rows_skipped == 0
        personas = infer_personas(out / "filtered.jsonl", out / "personas.jsonl", llm, console=QUIET).report
        made = generate_queries(out / "personas.jsonl", out / "queries.jsonl", llm, console=QUIET)
        queries, funnel = made.report, made.summary
    assert personas.outcome.done == 3 and queries.outcome.failed == 0
    assert sum(funnel.accepted.values()) > 0
    assert summary.memories == sum(len(r["memory_items"]) for r in rows) > 0


def test_rerun_resumes_and_a_failed_user_is_a_failure_row_retried_later(tmp_path):
    dealt = regroup(range(0, 6), users=3)
    log = write_shape("messages", dealt, tmp_path)
    output = tmp_path / "out" / "memories.jsonl"
    marker = next(s for s in dealt if s["user"] == "person-0")["turns"][0]["text"].split("\n")[0]
    ungrounded = {"memory_items": [memory("t999")], "intents_ranked": []}
    capable, broken = order_free_responder(), [True]

    def answer(body: dict, number: int):  # person-0's replies cite no real message, while broken
        if broken[0] and marker in body["messages"][-1]["content"]:
            return ungrounded
        return capable(body, number)

    with FakeOpenAI(responder=answer) as server:
        first = extract_memories(log, output, settings(server, tmp_path / "w"), console=QUIET).report
        assert (first.outcome.done, first.outcome.failed) == (2, 1)
        failure = read_jsonl(output.with_name("extract-memories.failures.jsonl"))
        assert failure[0]["user_id"] == "person-0" and failure[0]["kind"] == "ungrounded"
        assert "t999" in failure[0]["raw"]
        sent = server.count
        again = extract_memories(log, output, settings(server, tmp_path / "w"), console=QUIET).report
        assert server.count == sent and again.outcome.done_before == 2 and again.outcome.failed_before == 1
        broken[0] = False
        retried = extract_memories(
            log, output, settings(server, tmp_path / "w"), retry_failed=True, console=QUIET
        ).report
    assert retried.outcome.done == 1 and len(read_jsonl(output)) == 3


@pytest.mark.parametrize("profile", PROFILES)
def test_the_stage_completes_on_every_provider(tmp_path, profile):
    log = write_shape("sharegpt", regroup(range(10, 14), users=2), tmp_path)
    with FakeOpenAI(profile=profile) as server:  # its default replies: schema instances
        report = extract_memories(log, tmp_path / "memories.jsonl", settings(server, tmp_path / "w")).report
    assert server.errors == [] and report.outcome.failed == 0 and report.outcome.done == 2


def test_estimate_sends_and_writes_nothing(tmp_path):
    with FakeOpenAI() as server:
        report = extract_memories(
            SAMPLE_TASK1, tmp_path / "memories.jsonl", settings(server, tmp_path / "w", estimate=True)
        ).report
        assert server.count == 0
    assert report.estimate["steps"]["extract_memories"]["calls"] == 48 == report.estimate["units_pending"]
    assert not (tmp_path / "memories.jsonl").exists() and not (tmp_path / "conversations.jsonl").exists()


# --- the gold --------------------------------------------------------------------------------------


def gold_as_output(folder: Path, target: Path) -> Path:
    """The gold memories themselves as extract-memories' output rows (flagged ones too: the
    comparison must leave them out of the gold, and they then count against precision)."""
    inputs = {
        json.loads(line)["benchmark_id"]: json.loads(line) for line in (folder / "model_input.jsonl").open()
    }
    rows = []
    for line in (folder / "reference_output.jsonl").open():
        gold = json.loads(line)
        items = [m for m in gold["gold"]["memory_items"] if "[ERROR:" not in m["value"]]
        sessions = inputs[gold["benchmark_id"]]["input"]["sessions"]
        rows.append({"user_id": gold["benchmark_id"], "benchmark_id": gold["benchmark_id"],
                     "sessions": sessions, "memory_items": items})  # fmt: skip
    return write_jsonl(target, rows)


def test_the_gold_itself_scores_f1_one(tmp_path):
    output = gold_as_output(SAMPLE_TASK1, tmp_path / "memories.jsonl")
    figures = compare_with_gold(output, SAMPLE_TASK1 / "reference_output.jsonl")
    assert figures["users_compared"] == 48 and figures["flagged_gold_memories_excluded"] > 0
    assert figures["overall"]["f1"] == 1.0 and figures["overall"]["matched"] == figures["overall"]["gold"]
    assert all(family["f1"] == 1.0 for family in figures["by_family"].values())


def test_a_memory_matches_only_on_the_same_turn_family_and_overlapping_value(tmp_path):
    output = gold_as_output(SAMPLE_TASK1, tmp_path / "memories.jsonl")
    rows = read_jsonl(output)
    row = next(r for r in rows if len(r["memory_items"]) >= 2)
    first = row["memory_items"][0]
    moved = {**first, "evidence": {**first["evidence"], "utterance_index": 10_000}}
    relabelled = {
        **first,
        "label": "Possessions/Car" if not first["label"].startswith("Poss") else "Plans/Schedule",
    }
    reworded = {**first, "value": "zzz qqq"}
    for changed in (moved, relabelled, reworded):
        row["memory_items"] = [changed]
        write_jsonl(output, [row])
        figures = compare_with_gold(output, SAMPLE_TASK1 / "reference_output.jsonl")
        assert figures["overall"]["matched"] == 0, changed
    assert value_overlap("Loves horror films", "loves HORROR films!") == 1.0


def test_compare_gold_and_predictions_from_the_command(tmp_path):
    output = tmp_path / "out" / "memories.jsonl"
    predictions = tmp_path / "out" / "alpsbench_predictions.jsonl"  # beside the output
    with FakeOpenAI(responder=order_free_responder()) as server:
        result = CliRunner().invoke(
            app,
            ["extract-memories", "--input", str(SAMPLE_TASK1), "--output", str(output),
             "--compare-gold", str(SAMPLE_TASK1 / "reference_output.jsonl"),
             "--alpsbench-predictions", "--limit", "6",
             "--base-url", server.base_url, "--model", "fake", "--work-dir", str(tmp_path / "w")],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    figures = json.loads(output.with_name("gold_comparison.json").read_text())
    assert figures["users_compared"] == 6 and 0 <= figures["overall"]["f1"] <= 1
    assert "against the gold (6 users)" in result.output
    records = read_jsonl(predictions)
    assert len(records) == 6 and all("memory_items" in r and "ground_truth_memories" in r for r in records)


def test_a_bad_row_stops_with_file_line_and_overwrites_nothing(tmp_path):
    log = write_shape("messages", regroup(range(0, 4), users=2), tmp_path)
    output = tmp_path / "memories.jsonl"
    output.write_text("earlier\n")
    (tmp_path / "conversations.jsonl").write_text("earlier\n")
    lines = log.read_text(encoding="utf-8").splitlines()
    log.write_text("\n".join([lines[0], '{"user_id": "x", "messages": "hello"}', *lines[1:]]) + "\n")
    result = CliRunner().invoke(
        app, ["extract-memories", "-i", str(log), "-o", str(output), "--base-url", "http://127.0.0.1:9/v1",
              "--model", "m", "--work-dir", str(tmp_path / "w")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert f"{log}:2: 'messages' must be a list" in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert output.read_text() == "earlier\n" and (tmp_path / "conversations.jsonl").read_text() == "earlier\n"


def test_the_options_repeat_the_readers_defaults():
    from personaemp import vocabulary
    from personaemp.dataset import options as build_options
    from personaemp.sources import logs

    extract = build_options.ExtractOptions()
    assert {name: getattr(extract, f"{name}_column") for name in DEFAULT_COLUMNS} == DEFAULT_COLUMNS
    assert ("auto", *logs.LOG_FORMATS, "task1") == vocabulary.LOG_FORMATS
    bounds = logs.Bounds()
    assert (extract.max_sessions, extract.max_turns, extract.max_turn_chars, extract.max_user_chars) == (
        bounds.max_sessions, bounds.max_turns, bounds.max_turn_chars, bounds.max_user_chars,
    )  # fmt: skip


def test_run_starts_from_conversations_only_for_a_log(tmp_path):
    """`run` extracts first for a log in any of the four shapes, never for AlpsBench (a task1
    folder, a raw export with memory_items, an hf: dataset); the run itself:
    test_run_builds_a_dataset_from_a_conversation_log."""
    from personaemp.sources.logs import is_conversation_log

    dealt = regroup(range(0, 4), users=2)
    logs = [write_shape(shape, dealt, tmp_path / shape) for shape in SHAPES]
    assert all(is_conversation_log(str(log)) for log in logs)
    raw = write_jsonl(tmp_path / "raw.jsonl", [{"user_id": "u", "sessions": [], "memory_items": []}])
    assert not any(is_conversation_log(str(p)) for p in (SAMPLE_TASK1, raw, "hf:Cosineyx/Alpsbench"))


def test_run_builds_a_dataset_from_a_conversation_log(tmp_path):
    """`personaemp run` with [paths] input a log: extract-memories first, filter reads its
    records, then the whole pipeline; a second run sends nothing."""
    from personaemp.config import Resolver
    from personaemp.pipeline import run_pipeline

    dealt = regroup(range(0, 24), users=8)
    log = write_shape("messages", dealt, tmp_path / "log")
    processed = tmp_path / "processed"
    with FakeOpenAI(responder=order_free_responder()) as server:
        flags = {
            "paths": {"input": str(log), "processed": processed},
            "llm": {"base_url": [server.base_url], "model": "fake", "work_dir": processed / ".w"},
            "push": {"dry_run": True},
        }
        options = Resolver(None, flags=flags, style="python").all()
        result = run_pipeline(options, QUIET)
        sent = server.count
        again = run_pipeline(Resolver(None, flags=flags, style="python").all(), QUIET)
        assert server.count == sent
    assert list(result.results)[:2] == ["extract-memories", "filter"]
    assert result.results["extract-memories"].counts["done"] == 8
    assert read_jsonl(processed / "memories.jsonl") and (processed / "filtered.jsonl").is_file()
    assert result.results["filter"].counts["users_in"] == 8  # the extracted records, not the log
    assert result.results["split"].counts["users_in"] > 0
    assert (processed / "dataset" / "README.md").is_file()
    assert again.results["extract-memories"].counts["done_before"] == 8


def test_extract_memories_shards_merge_into_what_one_run_writes(tmp_path, monkeypatch):
    from test_scale import comparable

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    dealt = regroup(range(0, 12), users=6)
    log = write_shape("messages", dealt, tmp_path / "log")
    runner = CliRunner()
    with FakeOpenAI(responder=order_free_responder()) as server:

        def extract(folder: str, *extra: str):
            here = tmp_path / folder
            result = runner.invoke(app, [
                "extract-memories", "-i", str(log), "-o", str(here / "memories.jsonl"),
                "--work-dir", str(here / "work"), "--base-url", server.base_url, "--model", "fake", *extra,
            ])  # fmt: skip
            assert result.exit_code == 0, result.output

        extract("shards", "--shard", "1/2")
        extract("shards", "--shard", "2/2")
        extract("alone")
    merged = runner.invoke(app, ["merge", "extract-memories", "-i", str(log),
                                 "-o", str(tmp_path / "shards" / "memories.jsonl")])  # fmt: skip
    assert merged.exit_code == 0, merged.output
    assert comparable(tmp_path / "shards" / "memories.jsonl") == comparable(
        tmp_path / "alone" / "memories.jsonl"
    )
