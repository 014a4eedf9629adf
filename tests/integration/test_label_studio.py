"""Label Studio interchange: the sample as a project, its JSON export read back as labels."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from conftest import read_jsonl
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.review.agreement import compute_agreement
from personaemp.review.label_studio import CONFIG_FILE, TASKS_FILE
from personaemp.review.page import LLM_CHECKS, current_labels, read_label_events


@pytest.fixture
def queries(sample_build, tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "processed" / "queries.jsonl"
    target.parent.mkdir()
    target.write_bytes((sample_build / "queries.jsonl").read_bytes())
    return target


def export(queries: Path, folder: Path, size: int = 6) -> list[dict]:
    result = CliRunner().invoke(
        app, ["review", "--input", str(queries), "--size", str(size), "--export-label-studio", str(folder)]
    )
    assert result.exit_code == 0, result.output
    assert f"wrote {size} tasks (seed 0)" in result.stderr
    return json.loads((folder / TASKS_FILE).read_text())


def test_the_project_is_a_config_and_tasks_that_fill_it(queries, tmp_path):
    tasks = export(queries, tmp_path / "ls")
    config = ElementTree.fromstring((tmp_path / "ls" / CONFIG_FILE).read_text())
    variables = {t.get("value")[1:] for t in config.iter("Text")}
    for task in tasks:
        assert variables <= set(task["data"]), variables - set(task["data"])
    names = [c.get("name") for c in config.iter("Choices")]
    assert names[0] == "query" and [n for n in names if n.startswith("check_")] == [
        f"check_{c}" for c in LLM_CHECKS
    ]
    traits = max(len(r["traits"]) for r in read_jsonl(queries))
    assert [n for n in names if n.startswith("trait_")] == [f"trait_{n}" for n in range(traits)]
    assert {c.get("toName") for c in config.iter("Choices")} == {"query_text"}
    assert [t.get("name") for t in config.iter("TextArea")] == ["note"]
    # the same sample as the page's, in the same order
    from personaemp.review.page import open_session

    session = open_session(queries, tmp_path / "unused.jsonl", 6, 0)
    assert [t["data"]["query_id"] for t in tasks] == [i["query_id"] for i in session.items]
    first = session.items[0]
    verdict = "pass" if first["checks"]["emotional_support"] else "fail"
    assert tasks[0]["data"]["judge_emotional_support"] == f"emotional_support: the judge says {verdict}"


def annotated(tasks: list[dict]) -> list[dict]:
    """What Label Studio's JSON export holds after two annotators worked on the tasks: the
    task data, then per annotation its author and results (shape of Label Studio 1.x)."""
    out = []
    for n, task in enumerate(tasks):

        def choice(name, value, n=n):
            return {
                "from_name": name, "to_name": "query_text", "type": "choices", "value": {"choices": [value]},
                "id": f"r{n}{name}", "origin": "manual",
            }  # fmt: skip

        first = [
            choice("query", "accept" if n % 2 == 0 else "reject"), choice("check_emotional_support", "agree"),
            choice("check_role_awareness", "disagree" if n == 0 else "agree"), choice("trait_0", "supported"),
        ]  # fmt: skip
        if n == 1:
            first.append({"from_name": "note", "to_name": "query_text", "type": "textarea",
                          "value": {"text": ["too generic"]}})  # fmt: skip
        second = [
            choice("query", "accept"),
            choice("check_emotional_support", "disagree" if n < 2 else "agree"),
        ]
        out.append({
            "id": 100 + n, "data": task["data"], "meta": {}, "created_at": "2026-11-23T10:00:00Z",
            "annotations": [
                {"id": 1, "completed_by": 7, "result": first, "was_cancelled": False,
                 "created_at": "2026-11-23T10:01:00Z", "updated_at": "2026-11-23T10:02:00Z"},
                {"id": 2, "completed_by": {"id": 9, "email": "bo@example.org"}, "result": second,
                 "was_cancelled": False, "created_at": "2026-11-23T11:00:00Z"},
                {"id": 3, "completed_by": 11, "result": [choice("query", "reject")], "was_cancelled": True},
            ],
        })  # fmt: skip
    return out


def test_an_export_read_back_is_labels_the_agreement_figures_use(queries, tmp_path):
    tasks = export(queries, tmp_path / "ls")
    path = tmp_path / "export.json"
    path.write_text(json.dumps(annotated(tasks)))
    result = CliRunner().invoke(app, ["review", "--input", str(queries), "--import-label-studio", str(path)])
    assert result.exit_code == 0, result.output
    labels = queries.with_name("labels.jsonl")
    events = read_label_events(labels)
    # 6 tasks: 4 results each (+1 note) from the first, 2 from the second; the cancelled one left out
    assert len(events) == 6 * 4 + 1 + 6 * 2
    assert (
        f"{len(events)} labels set and 0 removed from {path} (6 tasks, 2 Label Studio users)" in result.stderr
    )
    state = current_labels(events)
    assert sorted(state) == ["label-studio:7", "label-studio:9"]  # user ids
    first = tasks[1]["data"]["query_id"]
    assert state["label-studio:7"][first]["note"]["value"] == "too generic"
    assert state["label-studio:7"][first]["query"]["value"] == "reject"
    assert state["label-studio:7"][first]["query"]["at"] == "2026-11-23T10:02:00Z"

    again = CliRunner().invoke(app, ["review", "--input", str(queries), "--import-label-studio", str(path)])
    assert again.exit_code == 0 and "0 labels set and 0 removed" in again.stderr  # nothing new
    assert len(read_label_events(labels)) == len(events)

    report = compute_agreement(queries, labels, resamples=200)
    assert report["judge_vs_people"]["emotional_support"]["pairs"] == 12
    assert report["judge_vs_people"]["role_awareness"]["pairs"] == 6
    assert report["people_vs_people"]["fields"]["query"]["pairs"] == 6
    assert report["people_vs_people"]["fields"]["emotional_support"]["confusion"][1:3] != [0, 0]
    assert report["traits"]["labelled"] >= 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"tasks": []}', "not a Label Studio JSON or JSON-MIN export"),
        (
            '[{"data": {"text": "x"}, "annotations": []}]',
            "entry 1 of the export (a task without an id) has no query_id",
        ),
        (
            '[{"data": {"query_id": "nobody-q1"}, "annotations": []}]',
            "entry 1 of the export (a task without an id): query 'nobody-q1' is not in",
        ),
    ],
)
def test_a_bad_export_exits_2_with_one_line(queries, tmp_path, content, message):
    path = tmp_path / "export.json"
    path.write_text(content)
    result = CliRunner().invoke(app, ["review", "--input", str(queries), "--import-label-studio", str(path)])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and re.search(re.escape(message), result.stderr)
    assert not queries.with_name("labels.jsonl").exists()


def test_a_choice_the_page_would_refuse_names_its_task(queries, tmp_path):
    tasks = export(queries, tmp_path / "ls", size=2)
    bad = [{"data": tasks[0]["data"], "annotations": [{"completed_by": 1, "result": [
        {"from_name": "query", "type": "choices", "value": {"choices": ["maybe"]}}]}]}]  # fmt: skip
    path = tmp_path / "export.json"
    path.write_text(json.dumps(bad))
    result = CliRunner().invoke(app, ["review", "--input", str(queries), "--import-label-studio", str(path)])
    assert result.exit_code == 2
    assert "entry 1 of the export (a task without an id): query takes accept or reject, not 'maybe'" in (
        result.stderr
    )


# --- hostile exports: one line naming the file and the task; nothing written --------------------

TASK = '[{"id": 17, "data": {"query_id": "Q"}, "annotations": %s}]'
ONE = TASK % '[{"result": [{"from_name": %s}]}]'
SHAPES = [
    ("[5]", "entry 1 of the export (a task without an id): the task is a number, not an object"),
    ('[{"id": 17, "data": {"query_id": 5}}]', "task 17 (entry 1 of the export): query 5 is not in"),
    (TASK % '{"a": 1}', "task 17 (entry 1 of the export): annotations is an object"),
    (TASK % '["x"]', "task 17 (entry 1 of the export): an annotation is text"),
    (TASK % '[{"result": "x"}]', "an annotation's result is text"),
    (TASK % '[{"result": [7]}]', "task 17 (entry 1 of the export): a result is a number"),
    (ONE % "5", "task 17 (entry 1 of the export): from_name is a number"),
    (ONE % '"query", "value": "accept"', "the value of 'query' is text"),
    (ONE % '"query", "value": {"choices": [{"x": 1}]}', "an item of the choices of 'query' is an object"),
    (ONE % '"note", "value": {"text": [1, 2]}', "an item of a note's text is a number"),
    (
        TASK % '[{"completed_by": [1], "result": []}]',
        "task 17 (entry 1 of the export): completed_by is a list",
    ),
    (
        TASK % '[{"was_cancelled": "yes", "result": []}]',
        "task 17 (entry 1 of the export): was_cancelled is text",
    ),
    (
        TASK % '[{"updated_at": {"$date": 1}, "result": []}]',
        "task 17 (entry 1 of the export): updated_at is an object",
    ),
    (
        TASK % '[{"updated_at": "yesterday", "result": []}]',
        "updated_at 'yesterday' is not an ISO date and time",
    ),
]


@pytest.mark.parametrize(("content", "message"), SHAPES)
def test_a_wrongly_shaped_export_is_one_line_naming_its_task(queries, tmp_path, content, message):
    tasks = export(queries, tmp_path / "ls", size=2)
    path = tmp_path / "export.json"
    path.write_text(content.replace('"Q"', json.dumps(tasks[0]["data"]["query_id"])))
    result = CliRunner().invoke(app, ["review", "--input", str(queries), "--import-label-studio", str(path)])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"{path}: " in result.stderr and message in result.stderr, result.stderr
    assert not queries.with_name("labels.jsonl").exists()


def test_an_export_nested_100000_deep_or_with_a_huge_time_is_one_line(queries, tmp_path):
    tasks = export(queries, tmp_path / "ls", size=2)
    path = tmp_path / "export.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    result = CliRunner().invoke(app, ["review", "--input", str(queries), "--import-label-studio", str(path)])
    assert result.exit_code == 2 and "nested deeper than a Label Studio export is" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    huge = [{"id": 3, "data": tasks[0]["data"], "annotations": [{"updated_at": "2" * 20_000_000, "result": [
        {"from_name": "query", "value": {"choices": ["accept"]}}]}]}]  # fmt: skip
    path.write_text(json.dumps(huge))
    result = CliRunner().invoke(app, ["review", "--input", str(queries), "--import-label-studio", str(path)])
    assert result.exit_code == 2 and "task 3 (entry 1 of the export): updated_at '2222" in result.stderr
    assert len(result.stderr) < 400  # the value is named, not printed
    assert not queries.with_name("labels.jsonl").exists()


def test_labels_for_an_empty_trait_slot_are_refused_and_counted(queries, tmp_path):
    tasks = export(queries, tmp_path / "ls", size=2)
    chosen = (("query", "accept"), ("trait_40", "supported"), ("trait_41", "unsupported"))
    results = [{"from_name": name, "value": {"choices": [value]}} for name, value in chosen]
    when = "2026-11-23T10:02:00.123456+02:00"
    annotation = {"completed_by": 1, "updated_at": when, "result": results}
    path = tmp_path / "export.json"
    path.write_text(json.dumps([{"id": 5, "data": tasks[0]["data"], "annotations": [annotation]}]))
    result = CliRunner().invoke(app, ["review", "--input", str(queries), "--import-label-studio", str(path)])
    assert result.exit_code == 0, result.output
    assert "1 labels set" in result.stderr and "2 labels skipped: about a trait or check" in result.stderr
    events = read_label_events(queries.with_name("labels.jsonl"))
    assert [(e["field"], e["at"]) for e in events] == [("query", "2026-11-23T08:02:00Z")]


def test_an_import_is_written_in_batches(queries, tmp_path, monkeypatch):
    """One fsync per batch of lines, not one per label (300 labels/s)."""
    import os

    tasks = export(queries, tmp_path / "ls")
    path = tmp_path / "export.json"
    path.write_text(json.dumps(annotated(tasks)))
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    result = CliRunner().invoke(app, ["review", "--input", str(queries), "--import-label-studio", str(path)])
    assert result.exit_code == 0 and "37 labels set" in result.stderr, result.output
    assert len(synced) <= 2  # the batch, and the folder of the new file
