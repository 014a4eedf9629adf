"""Issue 63 item 17: a labels file whose event has a list or an object where text belongs is
one file:line error in `agreement` and at the review page's start (it was a traceback); a PERM
score posted as 5.0 is saved as 5 and counted."""

from __future__ import annotations

import json

import pytest
from conftest import read_jsonl
from dialogue_fixture import agreement_args, write_dialogues, write_labels
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.errors import InputError
from personaemp.records import DIMENSIONS
from personaemp.review.dialogue_agreement import people_ratings, scored_dialogue_labels
from personaemp.review.dialogues import read_dialogue_items
from personaemp.review.page import (
    LabelFile,
    current_labels,
    make_event,
    open_dialogue_session,
    read_label_events,
)

BAD = [
    ("reviewer", ["ana", "bo"]),
    ("reviewer", {"name": "ana"}),
    ("field", ["perm:reception"]),
    ("item", {"id": "policy-a/u1-q1-d1"}),
    ("query_id", 7),
]


@pytest.mark.parametrize(("key", "value"), BAD, ids=[f"{k}-{type(v).__name__}" for k, v in BAD])
def test_a_label_event_with_the_wrong_type_is_one_file_line_error(tmp_path, key, value):
    dialogues = write_dialogues(tmp_path / "runs")
    labels = write_labels(dialogues, dialogues[0].with_name("dialogue_labels.jsonl"))
    events = read_jsonl(labels)
    events[3][key] = value
    labels.write_text("".join(json.dumps(event) + "\n" for event in events), encoding="utf-8")
    before = labels.read_bytes()

    with pytest.raises(InputError, match=rf"dialogue_labels.jsonl:4: a label event's {key} is text"):
        read_label_events(labels)
    with pytest.raises(InputError, match=rf"dialogue_labels.jsonl:4: a label event's {key} is text"):
        open_dialogue_session(dialogues, labels, size=4, seed=0).labels.events()

    result = CliRunner().invoke(app, agreement_args(dialogues, 100))
    assert result.exit_code == 2, result.output
    assert (
        "Traceback" not in result.output
        and f"dialogue_labels.jsonl:4: a label event's {key}" in result.output
    )
    assert labels.read_bytes() == before


def test_the_review_page_refuses_to_start_on_such_a_file_in_one_line(tmp_path):
    dialogues = write_dialogues(tmp_path / "runs")
    labels = tmp_path / "labels.jsonl"
    labels.write_text(
        json.dumps({"reviewer": ["a"], "query_id": "q", "field": "note"}) + "\n", encoding="utf-8"
    )
    args = ["review", "--dialogues", str(dialogues[0]), "--labels", str(labels), "--port", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert (
        "labels.jsonl:1: a label event's reviewer is text" in result.output
        and "Traceback" not in result.output
    )


def test_a_perm_score_posted_as_5_0_is_saved_as_5_and_counted(tmp_path):
    dialogues = write_dialogues(tmp_path / "runs")
    items = {item["item"]: item for item in read_dialogue_items(dialogues)}
    key = "policy-a/u1-q1-d1"
    file = LabelFile(tmp_path / "labels.jsonl")
    for dimension, score in zip(DIMENSIONS, (5.0, 4.0, 3), strict=True):
        body = {"reviewer": "ana", "item": key, "field": f"perm:{dimension}", "value": score}
        file.append(make_event(body, items, "t"))
    saved = [event["value"] for event in read_jsonl(tmp_path / "labels.jsonl")]
    assert saved == [5, 4, 3] and all(type(value) is int for value in saved)
    kept, left_out = scored_dialogue_labels(current_labels(file.events()), items)
    assert people_ratings(kept) == {key: 4.0}  # before: 5.0 was saved and the rating never counted
    with pytest.raises(InputError, match="takes 1 to 5, not 4.5"):
        make_event({"reviewer": "ana", "item": key, "field": "perm:reception", "value": 4.5}, items, "t")


def test_a_5_0_saved_by_an_earlier_version_is_counted_too(tmp_path):
    dialogues = write_dialogues(tmp_path / "runs")
    items = {item["item"]: item for item in read_dialogue_items(dialogues)}
    key = "policy-a/u1-q1-d1"
    events = [{"reviewer": "ana", "item": key, "query_id": "u1-q1", "field": f"perm:{d}", "value": 5.0}
              for d in DIMENSIONS]  # fmt: skip
    kept, _ = scored_dialogue_labels(current_labels(events), items)
    assert people_ratings(kept) == {key: 5.0}
