"""gen-dialogues as runs: kill -9 mid-run and resume (no finished turn asked again, no dialogue
written twice), every provider profile of the test server, the shared sample end to end, and
the command line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO
from fake_openai import PROFILES, FakeOpenAI
from test_dialogues import SUPPORTER, Script, rows_of, settings_for, step_of, user_row, write_queries
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.dialogues import DialogueOptions, generate_dialogues, read_dialogues

MAX_TURNS = 3  # the scripted user leaves after the third reply: 1 + 3 x 3 = 10 requests a dialogue


def reference_count(tmp_path: Path, queries: Path) -> tuple[int, list[dict]]:
    """Requests of an uninterrupted run, and its rows."""
    with FakeOpenAI(responder=Script()) as server:
        generate_dialogues(
            queries, tmp_path / "ref" / "dialogues.jsonl", settings_for(server, tmp_path / "ref" / "work"),
            options=DialogueOptions(max_turns=MAX_TURNS),
        )  # fmt: skip
    return server.count, rows_of(tmp_path / "ref" / "dialogues.jsonl")


def test_kill_9_mid_run_resumes_at_the_turn_where_each_dialogue_stopped(tmp_path):
    queries = write_queries(tmp_path / "queries.jsonl", [user_row(f"u{n}", 2) for n in range(3)])
    total, reference = reference_count(tmp_path, queries)
    assert total == 6 * 10 and len(reference) == 6
    answered = 37  # killed when the 38th request arrives: 37 answered, each cached before the next is sent
    process: list[subprocess.Popen] = []
    script = Script()

    def killing(body: dict, number: int):
        if number > answered:
            os.kill(process[0].pid, signal.SIGKILL)
            return "too late"
        return script(body, number)

    output, work = tmp_path / "out" / "dialogues.jsonl", tmp_path / "out" / "work"
    with FakeOpenAI(responder=killing) as server:
        env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
        process.append(subprocess.Popen(
            [sys.executable, "-m", "personaemp", "gen-dialogues", "-i", str(queries), "-o", str(output),
             "--base-url", server.base_url, "--model", "fake", "--work-dir", str(work), "--concurrency", "1",
             "--max-turns", str(MAX_TURNS), "--max-retries", "0"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))  # fmt: skip
        assert process[0].wait(timeout=120) == -signal.SIGKILL
    written_before = len(rows_of(output))
    assert 0 < written_before < 6, "killed mid-run, after some dialogues finished"

    with FakeOpenAI(responder=Script()) as server:
        report = generate_dialogues(
            queries, output, settings_for(server, work), options=DialogueOptions(max_turns=MAX_TURNS)
        ).report
    assert server.errors == []
    # no answered request is sent again: the finished dialogues are skipped, the cut ones replay
    # their answered turns from the cache and ask only the rest
    assert server.count == total - answered, (total, answered, server.count)
    assert report.outcome.done_before == written_before and report.outcome.done == 6 - written_before
    rows = rows_of(output)
    ids = [row["dialogue_id"] for row in rows]
    assert len(ids) == 6 and len(set(ids)) == 6, "no dialogue written twice"
    texts = lambda found: {r["dialogue_id"]: [t["text"] for t in r["turns"]] for r in found}  # noqa: E731
    assert texts(rows) == texts(reference), "the resumed dialogues are those of an uninterrupted run"


def test_a_second_run_asks_nothing(tmp_path):
    queries = write_queries(tmp_path / "queries.jsonl", [user_row("u1")])
    output = tmp_path / "dialogues.jsonl"
    with FakeOpenAI(responder=Script()) as server:
        generate_dialogues(queries, output, settings_for(server, tmp_path / "work"))
        first = server.count
        report = generate_dialogues(queries, output, settings_for(server, tmp_path / "work")).report
    assert first == 10 and server.count == first and report.outcome.done_before == 1
    assert len(rows_of(output)) == 1


@pytest.mark.parametrize("profile", PROFILES)
def test_every_provider_profile_completes_a_dialogue(tmp_path, profile):
    queries = write_queries(tmp_path / "queries.jsonl", [user_row("u1")])
    output = tmp_path / "dialogues.jsonl"
    with FakeOpenAI(responder=Script(), profile=profile) as server:
        report = generate_dialogues(
            queries, output, settings_for(server, tmp_path / "work"), options=DialogueOptions(max_turns=2)
        ).report
    assert server.errors == []
    assert report.outcome.done == 1 and report.outcome.failed == 0, report.outcome.failures_by_kind
    dialogue = read_dialogues(output)[0]
    assert dialogue.ended_by == "max_turns" and len(dialogue.turns) == 5
    # thinking removed: the supporter's turns are its answers alone
    supporter = [t.text for t in dialogue.turns if t.role == "assistant"]
    assert all("<think>" not in text and "</think>" not in text for text in supporter)
    assert all(SUPPORTER in text for text in supporter)


def test_the_supporter_can_be_another_endpoint_and_model(tmp_path):
    queries = write_queries(tmp_path / "queries.jsonl", [user_row("u1")])
    output = tmp_path / "dialogues.jsonl"
    with FakeOpenAI(responder=Script()) as simulator, FakeOpenAI(responder=Script()) as supporter:
        report = generate_dialogues(
            queries, output, settings_for(simulator, tmp_path / "work"),
            supporter_model="policy-7b", supporter_base_url=[supporter.base_url],
        ).report  # fmt: skip
    assert Counter(step_of(r.body) for r in simulator.chat_requests) == {
        "hidden_need": 1, "simulate": 3, "in_character": 3,
    }  # fmt: skip
    assert [step_of(r.body) for r in supporter.chat_requests] == ["supporter"] * 3
    assert {r.body["model"] for r in supporter.chat_requests} == {"policy-7b"}
    dialogue = read_dialogues(output)[0]
    assert (dialogue.supporter_model, dialogue.simulator_model) == ("policy-7b", "fake")
    assert report.notes["supporter"]["requests"] == 3


def test_the_shared_sample_end_to_end(tmp_path, sample_build):
    queries = tmp_path / "queries.jsonl"
    shutil.copy(sample_build / "queries.jsonl", queries)
    output = tmp_path / "dialogues.jsonl"
    with FakeOpenAI(responder=Script()) as server:
        report = generate_dialogues(
            queries, output, settings_for(server, tmp_path / "work"), per_user=1, limit=4,
            options=DialogueOptions(max_turns=2),
        ).report  # fmt: skip
    assert server.errors == []
    assert report.outcome.units == 4 and report.outcome.done == 4, report.outcome.failures_by_kind
    users = {json.loads(line)["user_id"]: json.loads(line) for line in queries.read_text().splitlines()}
    for dialogue in read_dialogues(output):
        row = users[dialogue.user_id]
        query = next(q for q in row["queries"] if q["query_id"] == dialogue.query_id)
        assert dialogue.turns[0].text == query["query"] and dialogue.memory_ids == query["memory_ids"]
        assert dialogue.language == row["language"]
    assert len({d.user_id for d in read_dialogues(output)}) == 4, "--per-user 1"


def test_the_command_writes_dialogues_and_a_summary(tmp_path):
    queries = write_queries(tmp_path / "queries.jsonl", [user_row("u1")])
    output = tmp_path / "dialogues.jsonl"
    with FakeOpenAI(responder=Script()) as server:
        result = CliRunner().invoke(app, [
            "gen-dialogues", "-i", str(queries), "-o", str(output), "--base-url", server.base_url,
            "--model", "fake", "--work-dir", str(tmp_path / "work"), "--max-turns", "2", "--json",
        ], env={"OPENAI_API_KEY": "sk-test"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(rows_of(output)) == 1
    assert json.loads(result.stdout)["counts"]["done"] == 1
