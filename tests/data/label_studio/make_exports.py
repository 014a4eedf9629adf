"""Regenerate the recorded exports (run with label-studio-sdk installed; its converter is
Label Studio's own JSON-MIN export code):

    python tests/data/label_studio/make_exports.py

json.json         a project's JSON export as Label Studio 1.23 writes it (`completed_by` an
                  id), query ids Q0..Q5 (the tests put the sample's in their place);
json_users.json   the same annotations with `completed_by` as an object (id, email...);
json_min.json, json_min_users.json   label_studio_sdk's convert_to_json_min of each.
"""

import json
import shutil
import tempfile
from pathlib import Path

from label_studio_sdk.converter import Converter

HERE = Path(__file__).parent
USERS = {7: "ana@example.org", 9: "bo@example.org"}


def result(name, value, kind="choices"):
    key = "choices" if kind == "choices" else "text"
    return {
        "id": f"{name[:5]}{value[:3]}",
        "type": kind,
        "value": {key: [value]},
        "origin": "manual",
        "to_name": "query_text",
        "from_name": name,
    }


def annotation(ident, user, task, results, when):
    return {
        "id": ident,
        "completed_by": user,
        "result": results,
        "was_cancelled": False,
        "ground_truth": False,
        "created_at": when,
        "updated_at": when,
        "draft_created_at": None,
        "lead_time": 21.5,
        "prediction": {},
        "result_count": len(results),
        "unique_id": f"u-{ident}",
        "import_id": None,
        "last_action": None,
        "bulk_created": False,
        "task": task,
        "project": 3,
        "updated_by": user,
        "parent_prediction": None,
        "parent_annotation": None,
        "last_created_by": None,
    }


def tasks():
    out = []
    for n in range(6):
        ident = 21 + n
        first = [
            result("query", "accept" if n % 2 == 0 else "reject"),
            result("check_emotional_support", "agree"),
            result("check_role_awareness", "disagree" if n == 0 else "agree"),
            result("trait_0", "supported"),
        ]
        if n == 1:
            first.append(result("note", "too generic", "textarea"))
        second = [
            result("query", "accept"),
            result("check_emotional_support", "disagree" if n < 2 else "agree"),
        ]
        annotations = [
            annotation(100 + 2 * n, 7, ident, first, f"2026-11-23T10:0{n}:00.000000Z"),
            annotation(101 + 2 * n, 9, ident, second, f"2026-11-23T11:0{n}:00.000000Z"),
        ]
        if n == 5:
            annotations.append(
                {
                    **annotation(200, 11, ident, [result("query", "reject")], "2026-11-23T12:00:00.000000Z"),
                    "was_cancelled": True,
                }
            )
        out.append(
            {
                "id": ident,
                "annotations": annotations,
                "file_upload": "tasks.json",
                "drafts": [],
                "predictions": [],
                "data": {
                    "query_id": f"Q{n}",
                    "query_text": f"query {n}",
                    "trait_0_text": "Worries before exams (memories m1)",
                    "trait_0_choices": [{"value": "supported"}, {"value": "unsupported"}],
                },
                "meta": {},
                "created_at": "2026-11-23T09:00:00.000000Z",
                "updated_at": "2026-11-23T11:00:00.000000Z",
                "inner_id": n + 1,
                "total_annotations": len(annotations),
                "cancelled_annotations": int(n == 5),
                "total_predictions": 0,
                "comment_count": 0,
                "unresolved_comment_count": 0,
                "last_comment_updated_at": None,
                "project": 3,
                "updated_by": 7,
                "comment_authors": [],
            }
        )
    return out


def with_users(export):
    out = json.loads(json.dumps(export))
    for task in out:
        for a in task["annotations"]:
            user = a["completed_by"]
            a["completed_by"] = {
                "id": user,
                "first_name": "",
                "last_name": "",
                "avatar": None,
                "email": USERS.get(user, f"u{user}@example.org"),
                "initials": "xx",
            }
    return out


def main():
    config = (HERE / "label_config.xml").read_text()
    for name, export in (("json", tasks()), ("json_users", with_users(tasks()))):
        (HERE / f"{name}.json").write_text(json.dumps(export, indent=2) + "\n")
        with tempfile.TemporaryDirectory() as out:
            Converter(config=config, project_dir=None).convert_to_json_min(
                str(HERE / f"{name}.json"), out, is_dir=False
            )
            shutil.copy(Path(out) / "result.json", HERE / f"{name.replace('json', 'json_min')}.json")


if __name__ == "__main__":
    main()
