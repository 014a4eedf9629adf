"""Issue 63 item 16: rows that cannot be true are refused by every reader of dialogues, in one
file:line error with exit 2 and nothing written: the invariants are declared once, on
records.Dialogue, beside the others. Duplicated dialogue ids are refused by the review page
and `agreement` (a label would land on the wrong dialogue); push refuses a named empty file."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from conftest import write_jsonl
from dialogue_fixture import dialogue, write_dialogues, write_labels
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.errors import InputError
from personaemp.evaluation.dialogues import read_dialogue_file
from personaemp.records import Dialogue
from personaemp.review.dialogues import read_dialogue_items


def good() -> dict:
    return dialogue("policy-a", 1)  # 40 -> 50 -> 60 -> 70, need met at supporter turn 3


def jump(row):  # a turn with no change whose emotion jumps by 55
    row["turns"][2].pop("change")
    row["turns"][2]["emotion"] = 95
    row["turns"][4]["change"], row["turns"][6]["change"] = -10, -10
    row["turns"][4]["emotion"], row["turns"][6]["emotion"] = 85, 75
    row["final_emotion"] = 75


def supporter_last(row):
    row["turns"].pop()
    row["final_emotion"] = row["turns"][-2]["emotion"]
    row["need_met_at_turn"] = None


def after_100(row):  # reached 100 on turn 3, went on
    row["turns"][2].update(emotion=100, change=10)
    row["turns"][4].update(emotion=100, change=0)
    row["turns"][6].update(emotion=100, change=0)
    row.update(final_emotion=100, ended_by="satisfied")
    row["initial_emotion"] = row["turns"][0]["emotion"] = 90


def ended_by_contradicts(row):
    row["ended_by"] = "satisfied"  # at 70


def unsupported_need(row):
    row["turns"][6]["need_met"] = False  # no turn says met, yet need_met_at_turn is 3


def early_need(row):
    row["turns"][2]["need_met"] = True  # first met after supporter turn 1, yet need_met_at_turn is 3


def boolean_number(row):
    row["initial_emotion"] = True


def boolean_emotion(row):
    row["turns"][2]["change"] = True


def number_boolean(row):
    row["turns"][2]["need_met"] = 0


def other_user(row):
    row["user_id"] = "u2"  # the query is u1-q1


BROKEN = {
    jump: "moves +55 from 40 with no change, beyond ±10",
    supporter_last: "it ends on the supporter's turn",
    after_100: "the dialogue goes on after turn 3's emotion 100",
    ended_by_contradicts: "ended_by 'satisfied' contradicts final_emotion 70",
    unsupported_need: "need_met_at_turn 3 disagrees with its turns (no turn has need_met true)",
    early_need: "need_met_at_turn 3 disagrees with its turns (turn 3 is the first with need_met)",
    boolean_number: "a boolean where a number belongs",
    boolean_emotion: "a boolean where a number belongs",
    number_boolean: "need_met is true or false, not 0",
    other_user: "user_id 'u2' is not the user of query 'u1-q1'",
}


def test_the_fixture_is_true():
    Dialogue.model_validate(good())


@pytest.mark.parametrize("breaking", list(BROKEN), ids=lambda f: f.__name__)
def test_a_row_that_cannot_be_true_is_refused(breaking):
    row = good()
    breaking(row)
    with pytest.raises(ValueError, match=re.escape(BROKEN[breaking])):
        Dialogue.model_validate(row)


@pytest.mark.parametrize("breaking", [jump, supporter_last, other_user], ids=lambda f: f.__name__)
def test_every_reader_refuses_it_at_its_line(tmp_path, breaking):
    row = good()
    breaking(row)
    path = write_jsonl(tmp_path / "policy-a.jsonl", [dialogue("policy-a", 2), row])
    with pytest.raises(InputError, match=r"policy-a.jsonl:2: not a dialogue"):
        read_dialogue_items([path])  # the review page and agreement
    with pytest.raises(InputError, match=r"policy-a.jsonl:2: not a dialogue"):
        read_dialogue_file(path)  # evaluate --dialogues


def test_a_missing_seeker_or_an_older_row_stays_readable():
    row = good()
    row.pop("seeker", None)
    assert Dialogue.model_validate(row).dialogue_id == "u1-q1-d1"


def test_duplicated_dialogue_ids_are_refused_by_the_review_page_and_agreement(tmp_path):
    paths = write_dialogues(tmp_path / "runs")
    labels = write_labels(paths, paths[0].with_name("dialogue_labels.jsonl"))
    rows = [json.loads(line) for line in paths[0].read_text(encoding="utf-8").splitlines()]
    twin = copy.deepcopy(rows[0])  # the same id, another conversation
    twin["turns"][2]["text"] = "A different reply."
    write_jsonl(paths[0], [*rows, twin])
    with pytest.raises(InputError, match=r"policy-a.jsonl:7: dialogue u1-q1-d1 again \(first on line 1\)"):
        read_dialogue_items(paths)
    before = labels.read_bytes()
    args = ["agreement", "--dialogues", str(paths[0]), "--dialogues", str(paths[1]), "--resamples", "100"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "policy-a.jsonl:7: dialogue u1-q1-d1 again" in result.output and "Traceback" not in result.output
    assert labels.read_bytes() == before
    result = CliRunner().invoke(app, ["review", "--dialogues", str(paths[0]), "--port", "0"])
    assert result.exit_code == 2 and "dialogue u1-q1-d1 again" in result.output


def test_push_refuses_a_named_empty_dialogues_file(sample_build, tmp_path):
    empty = tmp_path / "dialogues.jsonl"
    empty.write_text("\n", encoding="utf-8")
    out = tmp_path / "dataset"
    args = ["push", "--splits", str(Path(sample_build) / "splits"), "--dry-run", "--out-dir", str(out),
            "--dialogues", str(empty)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "dialogues.jsonl: no dialogues in it" in " ".join(result.output.split())
    assert not out.exists()
