"""Label Studio interchange: the review sample as a Label Studio project (tasks + labelling
config), and a Label Studio JSON export read back as label events of `personaemp review`,
so the agreement figures come out the same from either tool.

In the project a task is one query; its choices are named as the review page's fields:
`query` (accept/reject), `check_<name>` (agree/disagree with the judge), `trait_<n>`
(supported/unsupported), and a `note` text area. A reviewer's name is `label-studio:` and the
annotator's e-mail (or id).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from personaemp.errors import InputError
from personaemp.io import write_json_atomic
from personaemp.review.page import (
    LABEL_STUDIO_REVIEWER,
    LLM_CHECKS,
    LabelFile,
    UnknownTarget,
    current_labels,
    make_event,
    open_session,
    read_items,
    shown,
)

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


WHEN_CHARS = 40  # an ISO time with microseconds and an offset is 32


class _Task:
    """Where a part of an export is, for one-line errors: file, task number and Label Studio id."""

    def __init__(self, source: str, number: int, task: Any):
        self.source, self.number = source, number
        self.ident = task.get("id") if isinstance(task, dict) else None

    @property
    def name(self) -> str:  # built only for an error: an import reads millions of parts
        ident = self.ident
        known = isinstance(ident, int | str) and not isinstance(ident, bool)
        return f"{self.source}: task {self.number}" + (f" (id {shown(ident)})" if known else "")

    def expect(self, value: Any, kinds: type | tuple, what: str, of: str | None = None) -> Any:
        if not isinstance(value, kinds) or isinstance(value, bool) and bool not in _as_tuple(kinds):
            names = " or ".join(_KIND_NAMES[k] for k in _as_tuple(kinds))
            what += "" if of is None else f" of {shown(of)}"
            raise InputError(f"{self.name}: {what} is {_KIND_NAMES.get(type(value), type(value).__name__)}, "
                             f"not {names} (not a Label Studio JSON export)")  # fmt: skip
        return value

    def texts(self, value: Any, what: str, of: str | None = None) -> list[str]:
        for text in self.expect(value, list, what, of):
            if not isinstance(text, str):
                self.expect(text, str, f"an item of {what}", of)
        return value


_KIND_NAMES = {dict: "an object", list: "a list", str: "text", int: "a number", float: "a number",
               bool: "true/false", type(None): "null"}  # fmt: skip


def _as_tuple(kinds) -> tuple:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _annotator(annotation: dict[str, Any], task: _Task) -> str:
    who = task.expect(annotation.get("completed_by"), (dict, int, str, type(None)), "completed_by")
    if isinstance(who, dict):
        who = task.expect(
            who.get("email") or who.get("id"), (str, int, type(None)), "completed_by's email or id"
        )
    return f"{LABEL_STUDIO_REVIEWER}{who if who not in (None, '') else 'unknown'}"


def _when(annotation: dict[str, Any], task: _Task) -> str | None:
    """updated_at (else created_at) as the labels file writes times (UTC, seconds)."""
    value = annotation.get("updated_at") or annotation.get("created_at")
    if value is None:
        return None
    task.expect(value, str, "updated_at")
    try:
        if len(value) > WHEN_CHARS:
            raise ValueError
        when = datetime.fromisoformat(value)
    except ValueError:
        raise InputError(f"{task.name}: updated_at {shown(value)} is not an ISO date and time") from None
    if when.tzinfo is not None:
        when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def events_of_export(export: Any, queries: Path, source: str = "export") -> tuple[list[dict[str, Any]], int]:
    """The label events of a Label Studio JSON export (a list of tasks with annotations), and
    how many labels were refused for naming a trait or check their query does not have (an
    empty trait slot of the project). Anything else out of shape stops the import: one line
    naming the file and the task."""
    if not isinstance(export, list):
        raise InputError(f"{source}: not a Label Studio JSON export (a list of tasks)")
    items = {item["query_id"]: item for item in read_items(queries)}
    events, refused = [], 0
    for number, raw in enumerate(export, 1):
        task = _Task(source, number, raw)
        data = task.expect(raw, dict, "the task").get("data")
        query_id = data.get("query_id") if isinstance(data, dict) else None
        if query_id is None:
            raise InputError(f"{task.name} has no data.query_id (not exported by personaemp)")
        if not isinstance(query_id, str) or query_id not in items:
            raise InputError(f"{task.name}: query {shown(query_id)} is not in {queries}")
        for annotation in task.expect(raw.get("annotations") or [], list, "annotations"):
            task.expect(annotation, dict, "an annotation")
            if task.expect(annotation.get("was_cancelled", False), (bool, type(None)), "was_cancelled"):
                continue
            reviewer, when = _annotator(annotation, task), _when(annotation, task)
            for result in task.expect(annotation.get("result") or [], list, "an annotation's result"):
                task.expect(result, dict, "a result")
                name = task.expect(result.get("from_name", ""), str, "from_name")
                value = task.expect(result.get("value") or {}, dict, "the value", name)
                if name == "note":
                    texts = value.get("text") or []
                    field = "note"
                    chosen = (
                        texts if isinstance(texts, str) else "\n".join(task.texts(texts, "a note's text"))
                    )
                elif name == "query" or name.startswith(("check_", "trait_")):
                    picked = task.texts(value.get("choices") or [], "the choices", name)
                    if not picked:
                        continue
                    field = name if name == "query" else name.replace("_", ":", 1)
                    chosen = picked[0]
                else:
                    continue  # a control this project does not know
                body = {"reviewer": reviewer, "query_id": query_id, "field": field, "value": chosen}
                try:
                    events.append(make_event(body, items, when))
                except UnknownTarget:
                    refused += 1
                except InputError as error:
                    raise InputError(f"{task.name}: {error.message}") from None
    return events, refused


def import_export(path: Path, queries: Path, labels: Path) -> tuple[int, int]:
    """Append a Label Studio export's labels to the labels file (what it already says is
    left out, so importing the same export twice adds nothing), in batches of one write and
    one fsync. Nothing is written unless the whole export reads. Returns the events added
    and the labels refused for a trait or check their query does not have."""
    try:
        export = msgspec.json.decode(Path(path).read_bytes())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except RecursionError:
        raise InputError(f"{path}: nested deeper than a Label Studio export is") from None
    except msgspec.DecodeError as error:
        raise InputError(f"{path}: not valid JSON ({error})") from None
    events, refused = events_of_export(export, queries, str(path))
    file = LabelFile(labels)
    state = current_labels(file.events())
    new = []
    for event in events:
        now = state.get(event["reviewer"], {}).get(event["query_id"], {}).get(event["field"])
        if now is not None and now.get("value") == event["value"]:
            continue
        new.append(event)
        state.setdefault(event["reviewer"], {}).setdefault(event["query_id"], {})[event["field"]] = event
    file.extend(new)
    return len(new), refused


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
        added, refused = import_export(Path(export_file), Path(options.input), labels)
        console.print(f"{added} labels from {escape(str(export_file))} appended to {escape(str(labels))}")
        if refused:
            console.print(
                f"[yellow]{refused} label{'s' if refused != 1 else ''} refused: about a trait or check "
                "their query does not have (an empty slot of the project); not scored[/]"
            )
