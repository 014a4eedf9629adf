"""What a Label Studio export does not say: results of controls this project does not have,
tasks it leaves out (the Export button's export holds only tasks with annotations, so a task
whose last annotation was deleted is missing, not empty), and the keys Label Studio gives
choices that declare none. The exports are the recorded Label Studio 1.23 JSON export
(tests/data/label_studio/json.json) changed as Label Studio would change them."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from test_label_studio import export, queries  # noqa: F401 - the fixture
from test_label_studio_state import ids, recorded, run_import, state, values  # noqa: F401 - the fixture

from personaemp.review.agreement import compute_agreement
from personaemp.review.label_studio import label_config, task_of
from personaemp.review.page import LLM_CHECKS, read_items, read_label_events

DOCS = Path(__file__).parents[2] / "docs" / "commands" / "review.md"


def foreign(name: str, kind: str, value: dict, to_name: str = "image") -> dict:
    """A result as Label Studio 1.23 writes it, of a control another project's config has."""
    return {"id": f"x{name[:4]}", "type": kind, "value": value, "origin": "manual",
            "to_name": to_name, "from_name": name}  # fmt: skip


def test_results_of_controls_the_project_does_not_have_are_counted_and_named(queries, tmp_path, ids):  # noqa: F811
    content = recorded("json", ids)
    results = content[0]["annotations"][0]["result"]
    results.append(foreign("sentiment", "choices", {"choices": ["Positive"]}, "query_text"))
    box = {"x": 1, "y": 2, "width": 3, "height": 4, "rotation": 0, "rectanglelabels": ["Car"]}
    results.append(foreign("other_box", "rectanglelabels", box))
    content[1]["annotations"][1]["result"].append(foreign("sentiment", "choices", {"choices": ["Negative"]}))
    content[2]["annotations"][0]["result"].append(
        foreign("check_tone", "choices", {"choices": ["agree"]}, "query_text")  # a check we never declared
    )
    result = run_import(queries, tmp_path, content, "--json")
    line = "4 results from controls this project does not have: check_tone, other_box, sentiment (2) — "
    line += "left out"
    assert line in result.stderr.splitlines(), result.stderr
    printed = json.loads(result.stdout)["imported"]
    assert printed["unknown_controls"] == {"check_tone": 1, "other_box": 1, "sentiment": 2}
    assert printed["added"] == 37 and printed["refused"] == 0  # ours imported, theirs not a refusal
    events = read_label_events(queries.with_name("labels.jsonl"))
    assert {e["field"] for e in events} <= {"query", "note", "trait:0"} | {f"check:{c}" for c in LLM_CHECKS}


def test_an_export_with_only_our_controls_says_nothing_of_others(queries, tmp_path, ids):  # noqa: F811
    result = run_import(queries, tmp_path, recorded("json", ids), "--json")
    assert "controls this project does not have" not in result.stderr
    assert json.loads(result.stdout)["imported"]["unknown_controls"] == {}


def deleted(content: list[dict], number: int) -> list[dict]:
    """The export after every annotation of task `number` was deleted in Label Studio, as a
    full export (`download_all_tasks=true`, or a snapshot) holds it: the task, no annotations."""
    content = copy.deepcopy(content)
    task = content[number]
    task.update(annotations=[], total_annotations=0, cancelled_annotations=0, updated_by=None)
    return content


def test_a_full_export_removes_the_labels_of_a_task_whose_annotations_were_all_deleted(
    queries,  # noqa: F811
    tmp_path,
    ids,  # noqa: F811
):
    run_import(queries, tmp_path, recorded("json", ids))
    assert sorted(values(state(queries))["label-studio:7"]) == sorted(ids)
    result = run_import(queries, tmp_path, deleted(recorded("json", ids), 2), "--json")
    after = values(state(queries))
    assert ids[2] not in after["label-studio:7"] and ids[2] not in after["label-studio:9"]
    assert json.loads(result.stdout)["imported"]["removed"] == 6  # user 7's 4 labels, user 9's 2
    assert "not in this export" not in result.stderr
    report = compute_agreement(queries, queries.with_name("labels.jsonl"), resamples=50)
    assert report["people_vs_people"]["fields"]["query"]["pairs"] == 5


def test_a_full_json_min_export_removes_them_too(queries, tmp_path, ids):  # noqa: F811
    run_import(queries, tmp_path, recorded("json", ids))
    records = [r for r in recorded("json_min", ids) if r["query_id"] != ids[2]]
    # label_studio_sdk's converter writes a task without annotations as its data alone
    data = recorded("json", ids)[2]["data"]
    records.append({**data, "id": 23, "annotator": None, "annotation_id": None, "created_at": None,
                    "updated_at": None, "lead_time": None})  # fmt: skip
    run_import(queries, tmp_path, records)
    after = values(state(queries))
    assert ids[2] not in after["label-studio:7"] and ids[2] not in after["label-studio:9"]


def test_an_export_without_tasks_holding_labels_warns_once_and_keeps_them(queries, tmp_path, ids):  # noqa: F811
    full = recorded("json", ids)
    run_import(queries, tmp_path, full)
    before = values(state(queries))
    # the Export button's export after task 3's only annotations were deleted: task 3 is not in it
    partial = [task for n, task in enumerate(full) if n != 3]
    result = run_import(queries, tmp_path, partial, "--json")
    lines = [line for line in result.stderr.splitlines() if "not in this export" in line]
    assert lines == [
        "1 task holding labels is not in this export: its labels are kept; if its annotations "
        "were deleted, export with download_all_tasks=true (docs/commands/review.md, A deleted annotation)"
    ], result.stderr
    assert json.loads(result.stdout)["imported"]["absent_tasks"] == 1
    assert values(state(queries)) == before  # kept: the export says nothing of task 3
    result = run_import(queries, tmp_path, full[:2])
    assert "4 tasks holding labels are not in this export: their labels are kept" in result.stderr


def test_tasks_labelled_only_on_the_page_are_not_missed(queries, tmp_path, ids):  # noqa: F811
    """The page's reviewers' labels are not Label Studio's: an export does not hold them."""
    labels = queries.with_name("labels.jsonl")
    item = {i["query_id"]: i for i in read_items(queries)}[ids[4]]
    label = {"reviewer": "ana", "query_id": ids[4], "user_id": item["user_id"], "field": "query",
             "value": "accept", "at": "2026-11-23T10:00:00Z"}  # fmt: skip
    labels.write_text(json.dumps(label) + "\n")
    result = run_import(queries, tmp_path, recorded("json", ids)[:2], "--json")
    assert "not in this export" not in result.stderr
    assert json.loads(result.stdout)["imported"]["absent_tasks"] == 0


# --- the keys Label Studio shows: ours, then its own for choices that declare none --------------

AUTO_KEYS = "1234567890qwetasdfgzxcvbyiopjklnm"  # Label Studio's order (its editor's Hotkey.makeComb)


def label_studio_keys(config: str, data: dict) -> dict[str, list[str]]:
    """The key of each choice as Label Studio 1.23's editor binds them: declared keys first
    (the config's `hotkey`, a dynamic choice's `hotkey`), then, in the order of the page, each
    choice without one gets the next key of AUTO_KEYS not yet bound."""
    controls = []
    for choices in ElementTree.fromstring(config).iter("Choices"):
        dynamic = choices.get("value")
        options = data[dynamic[1:]] if dynamic else [c.attrib for c in choices.iter("Choice")]
        controls.append((choices.get("name"), [dict(option) for option in options]))
    taken = {o["hotkey"] for _, options in controls for o in options if o.get("hotkey")}
    for _, options in controls:
        for option in options:
            if not option.get("hotkey"):
                option["hotkey"] = next(key for key in AUTO_KEYS if key not in taken)
                taken.add(option["hotkey"])
    return {name: [o["hotkey"] for o in options] for name, options in controls if options}


def test_the_docs_name_the_keys_label_studio_gives_trait_choices(queries):  # noqa: F811
    items = read_items(queries)
    item = next(i for i in items if set(LLM_CHECKS) <= set(i["checks"]) and len(i["traits"]) >= 3)
    keys = label_studio_keys(label_config(3), task_of(item, 3)["data"])
    assert keys["query"] == ["a", "r"]
    assert [keys[f"check_{c}"] for c in LLM_CHECKS] == [[str(n), f"shift+{n}"] for n in range(1, 5)]
    assert [keys[f"trait_{n}"] for n in range(3)] == [["5", "6"], ["7", "8"], ["9", "0"]]
    text = " ".join(DOCS.read_text().split())
    assert "trait choices have no key" not in text
    assert (
        "the first trait's supported / unsupported are <kbd>5</kbd> / <kbd>6</kbd>, "
        "the second's <kbd>7</kbd> / <kbd>8</kbd>, the third's <kbd>9</kbd> / <kbd>0</kbd>"
    ) in text
