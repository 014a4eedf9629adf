"""Dialogues from generation to the published dataset, on the shared sample against the test
server: gen-dialogues -> evaluate --dialogues -> table -> push --dry-run ->
`datasets.load_dataset(folder, "dialogues")`; and what the card says of them."""

from __future__ import annotations

import json
import shutil

from fake_openai import FakeOpenAI
from test_dialogues import NEED, Script, rows_of
from test_sessions import Judged
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.publish import publish

ENV = {"OPENAI_API_KEY": "sk-test", "NO_COLOR": "1"}


def invoke(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args], env=ENV)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_gen_dialogues_evaluate_table_push_and_load_dataset(tmp_path, sample_build):
    import datasets

    processed = tmp_path / "processed"
    shutil.copytree(sample_build, processed)
    splits, dialogues = processed / "splits", processed / "dialogues.jsonl"
    test = splits / "random" / "test.jsonl"
    with FakeOpenAI(responder=Judged(score=4.0)) as server:
        llm = ["--base-url", server.base_url, "--model", "sim", "--work-dir", tmp_path / "work"]
        gen = ["-i", test, "-o", dialogues, "--limit", 3, "--max-turns", 2]
        invoke("gen-dialogues", *gen, *llm)
        invoke("evaluate", "--splits", splits, "--split", "random", "--dialogues", dialogues,
               "-o", tmp_path / "eval" / "sessions.json", *llm)  # fmt: skip
    assert server.errors == []
    written = rows_of(dialogues)
    assert len(written) == 3
    table = invoke("table", "-r", tmp_path / "eval" / "sessions.json")
    # the scripted user: +5 a turn from 40 over two turns, need met at the second
    assert "| dialogues | 50.00 | 100.00 | 0.80 | 0.50 | 0.00 | 0.00 | 100.00 | 3 |" in table, table
    out = tmp_path / "dataset"
    invoke("push", "--splits", splits, "--dry-run", "--out-dir", out, "--dialogues", dialogues)
    loaded = datasets.load_dataset(str(out), "dialogues", cache_dir=str(tmp_path / "hf"))
    assert list(loaded) == ["test"] and loaded["test"].num_rows == 3
    row = loaded["test"][0]
    assert row["dialogue_id"] in {d["dialogue_id"] for d in written}
    assert row["hidden_need"] and row["final_emotion"] == 50 and row["ended_by"] == "max_turns"
    assert [t["role"] for t in row["turns"]] == ["user", "assistant", "user", "assistant", "user"]
    assert row["turns"][2]["emotion"] == 45 and set(row["turns"][2]) == {
        "role", "text", "emotion", "change", "reason", "need_met", "thought",
    }  # fmt: skip
    # the single-turn configs are still there, and the default
    assert datasets.load_dataset(str(out), "random", cache_dir=str(tmp_path / "hf"))["test"].num_rows > 0
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "- config_name: dialogues\n  data_files:\n  - split: test\n" in card
    assert "**A simulated user is not a person.**" in card
    assert "written by the simulator model `sim`; the supporter turns by the supporter model (`sim`)" in card
    assert "Supporter turns per dialogue: 2 on average (2-2)" in card
    assert "no_need_leak 100.0%" in card and "in_character 100.0%" in card


def test_the_card_counts_each_rules_pass_rate_over_every_reply_checked(tmp_path, sample_build):
    """A reply that leaks the hidden need is asked again: 1 of the 4 replies checked fails
    no_need_leak, the dialogue (3 turns, kept replies only) is published."""
    processed = tmp_path / "processed"
    shutil.copytree(sample_build, processed)
    splits = processed / "splits"

    def leak_once(step, body, seen):
        asked = json.dumps(body)  # the first ask, not the re-ask that carries the verdict
        if step == "simulate" and "could not be used" not in asked and "reply number 2." in asked:
            return {"thought": "t", "change": 1, "reason": "r", "need_met": False, "end": False,
                    "text": f"Honestly what I need is {NEED}"}  # fmt: skip
        return None

    dialogues = tmp_path / "dialogues.jsonl"
    from test_dialogues import settings_for

    from personaemp.dataset.dialogues import generate_dialogues

    with FakeOpenAI(responder=Script(bad=leak_once)) as server:
        generate_dialogues(
            splits / "random" / "test.jsonl", dialogues, settings_for(server, tmp_path / "w"), limit=1
        )
    assert len(rows_of(dialogues)) == 1
    result = publish(splits, out=tmp_path / "ds", dialogues=dialogues).report
    assert result.rows["dialogues"] == {"test": 1}
    card = (tmp_path / "ds" / "README.md").read_text(encoding="utf-8")
    assert (
        "Pass rates over the 4 replies judged, kept and asked again: " in card
        and "no_need_leak 75.0%" in card
    ), card
    # no dialogues file: no config, no section
    publish(splits, out=tmp_path / "plain", dialogues=tmp_path / "none.jsonl")
    assert "config_name: dialogues" not in (tmp_path / "plain" / "README.md").read_text(encoding="utf-8")
    assert not (tmp_path / "plain" / "dialogues").exists()
