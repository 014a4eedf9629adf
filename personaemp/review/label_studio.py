"""Label Studio interchange: the review sample as a Label Studio project (tasks + labelling
config), and a Label Studio JSON export read back as label events of `personaemp review`,
so the agreement figures come out the same from either tool.

In the project a task is one query; its choices are named as the review page's fields:
`query` (accept/reject), `check_<name>` (agree/disagree with the judge), `trait_<n>`
(supported/unsupported), and a `note` text area. A reviewer's name is `label-studio:` and the
annotator's e-mail (or id).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from personaemp.errors import InputError
from personaemp.io import write_json_atomic
from personaemp.review.page import LLM_CHECKS, LabelFile, current_labels, make_event, open_session, read_items

TASKS_FILE, CONFIG_FILE = "tasks.json", "label_config.xml"


def _memories(item: dict[str, Any]) -> str:
    cited = set(item["memory_ids"])
    return "\n".join(
        f"{'* ' if m['memory_id'] in cited else ''}[{m['memory_id']}] {m.get('label') or ''}: "
        f"{m.get('value') or ''}"
        for m in item["memories"]
    )


def task_of(item: dict[str, Any], traits: int) -> dict[str, Any]:
    situation = item["situation"]
    data = {
        "query_id": item["query_id"],
        "user_id": item["user_id"],
        "query": item["query"],
        "situation": f"[{item['category']}] {situation.get('topic', '')}: {situation.get('text', '')}",
        "build": f"{'accepted' if item['accepted'] else 'rejected'} by the build; "
        f"language {item['language']}",
        "memories": _memories(item) + "\n(* cited by the query)",
        "big_five": "\n".join(
            f"{trait}: {level.get('level')} (memories {', '.join(level.get('evidence') or [])})"
            for trait, level in item["big_five"].items()
            if isinstance(level, dict)
        ),
        "checks": "\n".join(
            f"{name}: {'pass' if ok else 'FAIL'}"
            + (f" ({item['reasons'][name]})" if name in item["reasons"] else "")
            for name, ok in item["checks"].items()
        ),
    }
    for check in LLM_CHECKS:
        ok = item["checks"].get(check)
        data[f"judge_{check}"] = f"{check}: the judge says {'—' if ok is None else 'pass' if ok else 'fail'}"
    for n in range(traits):
        trait = item["traits"][n] if n < len(item["traits"]) else None
        data[f"trait_{n}"] = (
            f"{trait.get('statement', '')} (memories {', '.join(trait.get('evidence') or [])})"
            if trait
            else ""
        )
    return {"data": data}


def label_config(traits: int) -> str:
    """The labelling interface: the query's context as text, the reviewer's choices."""

    def text(name: str) -> str:
        return f'  <Text name="{name}_text" value="${name}"/>'

    def choices(name: str, values: tuple[str, str], required: bool = False) -> str:
        options = "".join(f'<Choice value="{v}"/>' for v in values)
        extra = ' required="true"' if required else ""
        return (
            f'  <Choices name="{name}" toName="query_text" choice="single" showInline="true"{extra}>'
            f"{options}</Choices>"
        )

    lines = [
        "<View>", '  <Header value="Query"/>', text("query"), text("build"), '  <Header value="Situation"/>',
        text("situation"), '  <Header value="Your decision"/>', choices("query", ("accept", "reject"), True),
        '  <Header value="The LLM judge: agree or disagree"/>', text("checks"),
    ]  # fmt: skip
    for check in LLM_CHECKS:
        lines += [text(f"judge_{check}"), choices(f"check_{check}", ("agree", "disagree"))]
    lines.append('  <Header value="Persona traits: supported by their memories?"/>')
    for n in range(traits):
        lines += [text(f"trait_{n}"), choices(f"trait_{n}", ("supported", "unsupported"))]
    lines += [
        '  <Header value="Big Five"/>', text("big_five"), '  <Header value="Memories"/>', text("memories"),
        '  <Header value="Note"/>', '  <TextArea name="note" toName="query_text" maxSubmissions="1"/>',
        "</View>",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def export_project(items: list[dict[str, Any]], folder: Path) -> list[Path]:
    """tasks.json (import it into a Label Studio project) and label_config.xml (its
    Settings > Labeling Interface > Code)."""
    traits = max((len(item["traits"]) for item in items), default=0)
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / TASKS_FILE, [task_of(item, traits) for item in items])
    (folder / CONFIG_FILE).write_text(label_config(traits), encoding="utf-8")
    return [folder / TASKS_FILE, folder / CONFIG_FILE]


def _annotator(annotation: dict[str, Any]) -> str:
    who = annotation.get("completed_by")
    if isinstance(who, dict):
        who = who.get("email") or who.get("id")
    return f"label-studio:{who if who not in (None, '') else 'unknown'}"


def events_of_export(export: Any, queries: Path, source: str = "export") -> list[dict[str, Any]]:
    """The label events of a Label Studio JSON export (a list of tasks with annotations)."""
    if not isinstance(export, list):
        raise InputError(f"{source}: not a Label Studio JSON export (a list of tasks)")
    items = {item["query_id"]: item for item in read_items(queries)}
    events = []
    for number, task in enumerate(export, 1):
        query_id = ((task or {}).get("data") or {}).get("query_id") if isinstance(task, dict) else None
        if query_id is None:
            raise InputError(f"{source}: task {number} has no data.query_id (not exported by personaemp)")
        if query_id not in items:
            raise InputError(f"{source}: task {number}: query {query_id!r} is not in {queries}")
        for annotation in task.get("annotations") or []:
            if annotation.get("was_cancelled"):
                continue
            reviewer = _annotator(annotation)
            when = annotation.get("updated_at") or annotation.get("created_at")
            for result in annotation.get("result") or []:
                name, value = result.get("from_name", ""), result.get("value") or {}
                if name == "note":
                    texts = value.get("text") or []
                    field, chosen = "note", "\n".join(texts) if isinstance(texts, list) else str(texts)
                elif name == "query" or name.startswith(("check_", "trait_")):
                    picked = value.get("choices") or []
                    if not picked:
                        continue
                    field = name if name == "query" else name.replace("_", ":", 1)
                    chosen = picked[0]
                else:
                    continue  # a control this project does not know
                body = {"reviewer": reviewer, "query_id": query_id, "field": field, "value": chosen}
                try:
                    events.append(make_event(body, items, when))
                except InputError as error:
                    raise InputError(f"{source}: task {number}: {error.message}") from None
    return events


def import_export(path: Path, queries: Path, labels: Path) -> int:
    """Append a Label Studio export's labels to the labels file (what it already says is
    left out, so importing the same export twice adds nothing). Returns the events added."""
    try:
        export = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not valid JSON ({error})") from None
    events = events_of_export(export, queries, str(path))
    file = LabelFile(labels)
    state = current_labels(file.events())
    added = 0
    for event in events:
        now = state.get(event["reviewer"], {}).get(event["query_id"], {}).get(event["field"])
        if now is not None and now.get("value") == event["value"]:
            continue
        file.append(event)
        state.setdefault(event["reviewer"], {}).setdefault(event["query_id"], {})[event["field"]] = event
        added += 1
    return added


def exchange_label_studio(options, export: Path | None, export_file: Path | None, console) -> None:
    """`personaemp review --export-label-studio DIR` / `--import-label-studio FILE`."""
    from rich.markup import escape

    labels = options.labels or Path(options.input).with_name("labels.jsonl")
    if export is not None:
        session = open_session(options.input, labels, options.size, options.seed)
        paths = export_project(session.items, Path(export))
        console.print(
            f"wrote {len(session.items)} tasks (seed {options.seed}): "
            + escape(", ".join(str(path) for path in paths))
        )
    if export_file is not None:
        added = import_export(Path(export_file), Path(options.input), labels)
        console.print(f"{added} labels from {escape(str(export_file))} appended to {escape(str(labels))}")
