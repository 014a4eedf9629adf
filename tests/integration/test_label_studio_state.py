"""A Label Studio import makes labels.jsonl hold Label Studio's state: an edit replaces, a
deletion removes, either export form (JSON with `completed_by` an id or an object, and
JSON-MIN as label_studio_sdk's converter writes it) gives the same reviewers. The exports
are recorded in tests/data/label_studio (make_exports.py regenerates them with
label-studio-sdk's own converter); Q0..Q5 become the sample's query ids."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from test_label_studio import export, queries  # noqa: F401 - the fixture
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.review.agreement import compute_agreement
from personaemp.review.label_studio import CONFIG_FILE
from personaemp.review.page import current_labels, read_items, read_label_events

DATA = Path(__file__).parents[1] / "data" / "label_studio"


def recorded(name: str, ids: list[str]) -> list[dict]:
    text = (DATA / f"{name}.json").read_text()
    for n, query_id in enumerate(ids):
        text = text.replace(f'"Q{n}"', json.dumps(query_id))
    return json.loads(text)


def run_import(queries: Path, tmp_path: Path, content, *flags: str):  # noqa: F811
    path = tmp_path / "export.json"
    path.write_text(json.dumps(content))
    result = CliRunner().invoke(
        app, ["review", "--input", str(queries), "--import-label-studio", str(path), *flags]
    )
    assert result.exit_code == 0, result.output
    return result


def state(queries: Path) -> dict:  # noqa: F811
    return current_labels(read_label_events(queries.with_name("labels.jsonl")))


def values(found: dict) -> dict:
    return {r: {q: {f: e["value"] for f, e in fs.items()} for q, fs in qs.items()} for r, qs in found.items()}


@pytest.fixture
def ids(queries, tmp_path):  # noqa: F811
    return [task["data"]["query_id"] for task in export(queries, tmp_path / "ls")]


def test_an_edit_replaces_and_a_deletion_removes(queries, tmp_path, ids):  # noqa: F811
    first = recorded("json", ids)
    run_import(queries, tmp_path, first)
    before = values(state(queries))
    assert before["label-studio:7"][ids[0]]["check:role_awareness"] == "disagree"
    edited = copy.deepcopy(first)
    ana = edited[0]["annotations"][0]  # user 7 takes back a choice and changes another
    ana["result"] = [r for r in ana["result"] if r["from_name"] != "check_role_awareness"]
    ana["result"][0]["value"]["choices"] = ["reject"]
    ana["updated_at"] = "2026-11-24T09:00:00.000000Z"
    del edited[1]["annotations"][1]  # user 9's annotation of the second task is deleted
    result = run_import(queries, tmp_path, edited)
    assert "1 labels set and 3 removed" in result.stderr
    after = values(state(queries))
    assert after["label-studio:7"][ids[0]] == {
        **{k: v for k, v in before["label-studio:7"][ids[0]].items() if k != "check:role_awareness"},
        "query": "reject",
    }
    assert ids[1] not in after["label-studio:9"]
    lines = [json.loads(line) for line in queries.with_name("labels.jsonl").read_text().splitlines()]
    removal = [line for line in lines if line["value"] is None]
    assert {(line["reviewer"], line["field"]) for line in removal} == {
        ("label-studio:7", "check:role_awareness"),
        ("label-studio:9", "query"),
        ("label-studio:9", "check:emotional_support"),
    }
    assert lines[-1]["label_studio"]["task"] == 22
    assert all("annotation" in line["label_studio"] for line in lines if line["value"] is not None)
    # agreement reads a removal as no label
    report = compute_agreement(queries, queries.with_name("labels.jsonl"), resamples=50)
    assert report["people_vs_people"]["fields"]["query"]["pairs"] == 5
    assert report["judge_vs_people"]["role_awareness"]["pairs"] == 5


def test_a_partial_export_leaves_the_other_tasks_alone(queries, tmp_path, ids):  # noqa: F811
    full = recorded("json", ids)
    run_import(queries, tmp_path, full)
    before = values(state(queries))
    result = run_import(queries, tmp_path, full[:2])
    assert "0 labels set and 0 removed" in result.stderr
    assert values(state(queries)) == before


@pytest.mark.parametrize("form", ["json_users", "json_min", "json_min_users"])
def test_every_export_form_gives_the_same_reviewers_and_labels(queries, tmp_path, ids, form):  # noqa: F811
    run_import(queries, tmp_path, recorded("json", ids))
    before = values(state(queries))
    n_before = compute_agreement(queries, queries.with_name("labels.jsonl"), resamples=50)
    result = run_import(queries, tmp_path, recorded(form, ids))
    assert "0 labels set and 0 removed" in result.stderr, result.stderr
    assert sorted(before) == ["label-studio:7", "label-studio:9"]
    assert values(state(queries)) == before
    n_after = compute_agreement(queries, queries.with_name("labels.jsonl"), resamples=50)
    assert n_after["people_vs_people"]["fields"]["query"]["pairs"] == 6
    assert n_after["people_vs_people"] == n_before["people_vs_people"]


def test_json_min_alone_reads(queries, tmp_path, ids):  # noqa: F811
    run_import(queries, tmp_path, recorded("json_min", ids))
    found = values(state(queries))
    assert sorted(found) == ["label-studio:7", "label-studio:9"]
    assert found["label-studio:7"][ids[1]]["note"] == "too generic"
    assert found["label-studio:7"][ids[1]]["query"] == "reject"


def test_json_prints_the_result(queries, tmp_path, ids):  # noqa: F811
    result = run_import(queries, tmp_path, recorded("json", ids), "--json")
    printed = json.loads(result.stdout)
    assert printed["imported"]["added"] == 37 and printed["imported"]["reviewers"] == 2
    assert printed["imported"]["tasks"] == 6 and printed["imported"]["removed"] == 0


def test_a_click_on_a_missing_trait_is_skipped_and_the_rest_imported(queries, tmp_path, ids):  # noqa: F811
    content = recorded("json", ids)
    content[0]["annotations"][0]["result"].append(
        {"from_name": "trait_40", "type": "choices", "value": {"choices": ["supported"]}}
    )
    result = run_import(queries, tmp_path, content)
    assert "1 label skipped" in result.stderr and "37 labels set" in result.stderr


def test_an_error_names_label_studios_task_id(queries, tmp_path, ids):  # noqa: F811
    content = recorded("json", ids)
    content[4]["annotations"][0]["result"][0]["value"]["choices"] = ["maybe"]
    path = tmp_path / "export.json"
    path.write_text(json.dumps(content))
    result = CliRunner().invoke(app, ["review", "--input", str(queries), "--import-label-studio", str(path)])
    assert result.exit_code == 2
    assert "task 25 (entry 5 of the export): query takes accept or reject" in result.stderr


def test_the_config_shows_only_the_traits_and_checks_a_task_has_with_the_pages_keys(queries, tmp_path):  # noqa: F811
    tasks = export(queries, tmp_path / "ls")
    config = ElementTree.fromstring((tmp_path / "ls" / CONFIG_FILE).read_text())
    traits = {item["query_id"]: len(item["traits"]) for item in read_items(queries)}
    slots = [c.get("name") for c in config.iter("Choices") if c.get("name").startswith("trait_")]
    assert slots and all(
        c.get("value") == f"${c.get('name')}_choices"
        for c in config.iter("Choices")
        if c.get("name") != "query"
    )
    for task in tasks:
        data = task["data"]
        shown = [s for s in slots if data[f"{s}_choices"]]
        assert len(shown) == traits[data["query_id"]]
        assert "query" not in data and not any(name in data for name in slots)  # JSON-MIN: no clash
    keys = {c.get("value"): c.get("hotkey") for c in config.iter("Choice")}
    assert keys == {"accept": "a", "reject": "r"}
    first = tasks[0]["data"]
    checks = [k for k in first if k.startswith("check_") and first[k]]
    assert [first[k][0]["hotkey"] for k in checks] == [str(n) for n in range(1, len(checks) + 1)]
    assert [first[k][1]["hotkey"] for k in checks] == [f"shift+{n}" for n in range(1, len(checks) + 1)]


def test_the_recorded_json_min_is_what_label_studios_converter_writes(tmp_path):
    converter = pytest.importorskip("label_studio_sdk.converter", reason="label-studio-sdk is not installed")
    for name in ("json", "json_users"):
        converter.Converter(
            config=(DATA / "label_config.xml").read_text(), project_dir=None
        ).convert_to_json_min(str(DATA / f"{name}.json"), str(tmp_path / name), is_dir=False)
        made = json.loads((tmp_path / name / "result.json").read_text())
        assert made == json.loads((DATA / f"{name.replace('json', 'json_min')}.json").read_text())
