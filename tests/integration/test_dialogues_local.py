"""gen-dialogues on the embedded local model (llama.cpp): one dialogue of two turns, the model
playing both the simulated user and the supporter. A 0.5B model's role-play is weak; what is
checked is that each turn went through the schema and the rules and the books balance."""

from __future__ import annotations

import json

import pytest
from test_dialogues import rows_of, user_row, write_queries

from personaemp.dataset.dialogues import DialogueOptions, generate_dialogues, read_dialogues
from personaemp.llm.local import MODEL_NAME
from personaemp.llm.settings import LLMSettings

# the embedded model's recorded replies (tests/cassettes.py; `make record-embedded` records them)
pytestmark = [pytest.mark.recorded, pytest.mark.usefixtures("embedded_replies")]


def test_one_dialogue_of_two_turns_on_the_embedded_model(tmp_path):
    queries = write_queries(tmp_path / "queries.jsonl", [user_row("u1")])
    output = tmp_path / "dialogues.jsonl"
    # short supporter replies: respond's room (4096 tokens) is for thinking policies
    settings = LLMSettings(llm="local", work_dir=tmp_path / "work", steps={"respond": {"max_tokens": 160}})
    options = DialogueOptions(max_turns=2, turn_attempts=1)
    report = generate_dialogues(queries, output, settings, options=options).report
    assert report.outcome.balanced and report.outcome.units == 1
    assert report.model == MODEL_NAME and report.endpoint_kind == "local"
    failures = rows_of(tmp_path / "gen-dialogues.failures.jsonl")
    assert len(rows_of(output)) + len(failures) == 1
    for failure in failures:  # the model may not keep the rules: then the reason is named
        assert failure["kind"] in ("simulator_rules", "invalid", "truncated", "empty"), failure
    for dialogue in read_dialogues(output):
        assert dialogue.simulator_model == dialogue.supporter_model == MODEL_NAME
        assert [t.role for t in dialogue.turns] == ["user", "assistant", "user", "assistant", "user"] or (
            dialogue.ended_by != "max_turns"
        )
        for turn in dialogue.turns[2::2]:
            assert 0 <= turn.emotion <= 100 and abs(turn.change) <= 10 and turn.text
            assert all(turn.checks.values()), json.dumps(turn.checks)
        assert dialogue.hidden_need and dialogue.hidden_need not in json.dumps(
            [t.text for t in dialogue.turns if t.role == "assistant"]
        )
