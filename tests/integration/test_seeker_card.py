"""The dialogues card with hard-to-help seekers (issue 60): the styles published and the auto
table, and the supporters' behaviour counts quoted from a real `evaluate --dialogues` report."""

from __future__ import annotations

import pytest
from conftest import write_jsonl
from dialogue_fixture import build_queries, dialogue
from fake_openai import FakeOpenAI
from test_dialogues import settings_for
from test_sessions import Judged

from personaemp.dataset.card import behaviour_lines
from personaemp.dataset.publish import publish
from personaemp.errors import InputError
from personaemp.evaluation.dialogues import SafetyRule, evaluate_dialogues
from personaemp.instruments.seekers import auto_table_text


def test_the_card_shows_the_styles_the_auto_table_and_the_behaviour_counts(tmp_path, sample_build):
    splits, queries = build_queries(sample_build, tmp_path)
    queries = queries[:3]
    rows = [dialogue("policy-a", n, query, user) for n, (query, user) in enumerate(queries, 1)]
    rows[1]["seeker"] = rows[2]["seeker"] = "resistant"
    dialogues = write_jsonl(tmp_path / "run" / "policy-a.jsonl", rows)
    report = tmp_path / "eval" / "dialogues.json"
    with FakeOpenAI(responder=Judged(score=4.0)) as server:
        _, evaluation = evaluate_dialogues(splits, [dialogues], report, settings_for(server, tmp_path / "w"))
    assert server.errors == []
    assert set(evaluation["systems"]["policy-a"]["by_seeker"]) == {"cooperative", "resistant"}

    publish(splits, out=tmp_path / "ds", dialogues=dialogues, dialogues_report=report)
    card = (tmp_path / "ds" / "README.md").read_text(encoding="utf-8")
    section = card[card.index("## Dialogues (config `dialogues`)") :]
    assert "Seeker styles (how hard the simulated user is to help" in section
    assert "cooperative 1, resistant 2." in section
    assert all(line in section for line in auto_table_text())
    assert "### Behaviours of the supporters" in section and "From `dialogues.json`." in section
    assert "agrees_with_false_belief" in section and "gentle_pushback" in section
    turns = [sum(t["role"] == "assistant" for t in r["turns"]) for r in rows]
    # the scripted judge names no behaviour: 0 per 1,000 words, n and turns per style
    assert f"| `policy-a` | cooperative | 1 | {turns[0]} | 0 | 0 |" in section
    assert f"| `policy-a` | resistant | 2 | {turns[1] + turns[2]} | 0 | 0 |" in section

    without = tmp_path / "eval" / "plain.json"
    with FakeOpenAI(responder=Judged(score=4.0)) as server:
        evaluate_dialogues(splits, [dialogues], without, settings_for(server, tmp_path / "w2"),
                           safety=SafetyRule(behaviours=False))  # fmt: skip
    with pytest.raises(InputError, match="without the behaviour judge"):
        publish(splits, out=tmp_path / "ds2", dialogues=dialogues, dialogues_report=without)
    assert "were not counted for this card: pass `--dialogues-report`" in "\n".join(behaviour_lines(None))
