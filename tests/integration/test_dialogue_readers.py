"""A dialogues file is checked when it is read (issue 50, part 6): each row that cannot be true
is one line with file:line, exit 2, nothing written, by every reader (gen-dialogues' read,
evaluate --dialogues, push --dialogues, personaemp.io.iter_records): the invariants live once,
on records.Dialogue."""

from __future__ import annotations

import copy
import json
import re

import pytest
from fake_openai import FakeOpenAI
from test_dialogues import rows_of, settings_for
from test_sessions import Judged, build
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.dialogues import read_dialogues
from personaemp.errors import InputError
from personaemp.io import iter_records
from personaemp.records import Dialogue


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A split and one real dialogue of it (the scripted user: 40 -> 55 over 3 replies)."""
    tmp = tmp_path_factory.mktemp("made")
    splits, dialogues = build(tmp, users=1)
    return splits, rows_of(dialogues)[0]


def user_turns(row):
    return [t for t in row["turns"] if t["role"] == "user"]


def broken(row, how):
    row = copy.deepcopy(row)
    how(row)
    return row


CASES = {
    "final_emotion 1000": (lambda r: r.update(final_emotion=1000), "final_emotion 1000 is outside 0-100"),
    "final_emotion -5": (lambda r: r.update(final_emotion=-5), "final_emotion -5 is outside 0-100"),
    "a turn's emotion 1000": (lambda r: user_turns(r)[1].update(emotion=1000), "1000 is outside 0-100"),
    "a change of 50": (lambda r: user_turns(r)[1].update(change=50), "change 50 is beyond ±10"),
    "final unequal to the last turn": (lambda r: r.update(final_emotion=50), "final_emotion 50 is not"),
    "turns reversed": (lambda r: r["turns"].reverse(), "the opening turn's emotion 55 is not 40"),
    "ending on the supporter": (lambda r: r["turns"].pop(0), "turn 1 is the assistant's"),
    "two user turns in a row": (lambda r: r["turns"].insert(1, {**user_turns(r)[0]}), "turn 2 is the user's"),
    "no turns": (lambda r: r.update(turns=[]), "turns is empty"),
    "need_met_at_turn 99": (lambda r: r.update(need_met_at_turn=99), "need_met_at_turn 99 is beyond its 3"),
    "an emotion that does not follow its change": (
        lambda r: user_turns(r)[1].update(emotion=60), "turn 3's emotion 60 is not 40 +5"
    ),
    "an empty turn": (lambda r: r["turns"][1].update(text=" "), "turn 2 has no text"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_every_reader_refuses_a_dialogue_that_cannot_be_true(tmp_path, made, sample_build, case):
    splits, row = made
    how, said = CASES[case]
    path = tmp_path / "policy.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(broken(row, how)) + "\n", encoding="utf-8")
    for read in (read_dialogues, lambda p: list(iter_records(p, Dialogue, "a dialogue"))):
        with pytest.raises(InputError, match=rf"policy\.jsonl:2: not a dialogue \(.*{re.escape(said)}"):
            read(path)
    report = tmp_path / "r.json"
    result = CliRunner().invoke(app, [
        "evaluate", "--splits", str(splits), "--dialogues", str(path), "-o", str(report),
        "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--work-dir", str(tmp_path / "w"),
    ], env={"OPENAI_API_KEY": "sk-test"})  # fmt: skip
    assert result.exit_code == 2 and f"{path}:2: not a dialogue" in result.output.replace("\n", "")
    assert not report.exists() and not report.with_name("r.scores.jsonl").exists()
    out = tmp_path / "ds"
    result = CliRunner().invoke(app, [
        "push", "--splits", str(sample_build / "splits"), "--dry-run", "--out-dir", str(out), "--dialogues",
        str(path),
    ])  # fmt: skip
    assert result.exit_code == 2 and f"{path}:2: not a dialogue" in result.output.replace("\n", "")
    assert not out.exists()


def test_the_real_dialogue_reads(made, tmp_path):
    _, row = made
    path = tmp_path / "ok.jsonl"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    assert read_dialogues(path)[0].final_emotion == 55


def test_an_old_row_without_thought_or_rejected_text_still_reads(made, tmp_path):
    _, row = made
    old = copy.deepcopy(row)
    for turn in old["turns"]:
        turn.pop("thought", None)
        turn["rejected"] = [{"no_need_leak": "repeats 6 words"}] if turn.get("checks") else []
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n", encoding="utf-8")
    assert read_dialogues(path)[0].turns[2].thought is None


def test_push_refuses_a_named_dialogues_file_that_is_not_there(sample_build, tmp_path):
    splits = sample_build / "splits"
    out = tmp_path / "ds"
    result = CliRunner().invoke(app, [
        "push", "--splits", str(splits), "--dry-run", "--out-dir", str(out), "--dialogues",
        str(tmp_path / "nope.jsonl"),
    ])  # fmt: skip
    assert result.exit_code == 2 and "nope.jsonl: no such dialogues file" in result.output.replace("\n", "")
    assert not out.exists()


def test_gen_dialogues_read_and_evaluate_say_a_dialogue_outside_the_split(made, tmp_path):
    splits, row = made
    path = tmp_path / "policy.jsonl"
    other = row | {"user_id": "zz", "query_id": "zz-q1", "dialogue_id": "zz-q1-d1"}
    path.write_text(json.dumps(row) + "\n" + json.dumps(other) + "\n", encoding="utf-8")
    from personaemp.evaluation.dialogues import evaluate_dialogues

    with FakeOpenAI(responder=Judged()) as server:
        _, evaluation = evaluate_dialogues(
            splits, [path], tmp_path / "r.json", settings_for(server, tmp_path / "w")
        )
    assert evaluation["systems"]["policy"]["left_out"] == [
        {
            "query_id": "zz-q1",
            "dialogue_id": "zz-q1-d1",
            "reason": "its query is not in the random test split",
        }
    ]
