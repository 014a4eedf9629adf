"""Label Studio interchange: the review sample as a Label Studio project (tasks + labelling
config), and a Label Studio JSON export read back as label events of `personaemp review`,
so the agreement figures come out the same from either tool.

In the project a task is one query; its choices are named as the review page's fields:
`query` (accept/reject), `check_<name>` (agree/disagree with the judge), `trait_<n>`
(supported/unsupported), and a `note` text area; a task shows only the checks and traits its
query has, with the page's keys. A reviewer's name is `label-studio:` and the Label Studio
user id. An import brings labels.jsonl to the export's state (`import_export`).

Dialogues (`review --dialogues`): a task is one supporter's dialogue (data `item`), its turns as
text, and the page's fields as controls: `realism_<n>` and `character_<n>` for the simulated
user's n-th turn (a turn the dialogue does not have shows no choices), `perm_<dimension>`
(1-5) and `note`.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from personaemp.errors import InputError
from personaemp.io import BOM, write_json_atomic
from personaemp.records import DIMENSIONS
from personaemp.review.fields import PERM_SCORES
from personaemp.review.fields import TURN_VALUES as DIALOGUE_TURN_VALUES
from personaemp.review.page import (
    LABEL_STUDIO_REVIEWER,
    LLM_CHECKS,
    VALUES,
    LabelFile,
    UnknownTarget,
    current_labels,
    make_event,
    open_dialogue_session,
    open_session,
    read_items,
    review_labels,
    shown,
)

TASKS_FILE, CONFIG_FILE = "tasks.json", "label_config.xml"
DOCS = "docs/commands/review.md, A deleted annotation"  # where a full export is explained
NAME_CHARS = 40  # a control's name as the import's summary shows it


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
        "query_text": item["query"],
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
    present = [check for check in LLM_CHECKS if check in item["checks"]]
    for check in LLM_CHECKS:
        ok = item["checks"].get(check)
        data[f"judge_{check}"] = f"{check}: the judge says {'—' if ok is None else 'pass' if ok else 'fail'}"
        # the page's keys: digit n agrees with the query's n-th check, Shift+n disagrees
        n = present.index(check) + 1 if check in present else 0
        data[f"check_{check}_choices"] = (
            [{"value": "agree", "hotkey": str(n)}, {"value": "disagree", "hotkey": f"shift+{n}"}]
            if n and n <= 9
            else [{"value": "agree"}, {"value": "disagree"}]
            if n
            else []
        )
    for n in range(traits):
        trait = item["traits"][n] if n < len(item["traits"]) else None
        data[f"trait_{n}_text"] = (
            f"{trait.get('statement', '')} (memories {', '.join(trait.get('evidence') or [])})"
            if trait
            else ""
        )
        # a user with fewer traits than the project's slots: no choices to click there
        data[f"trait_{n}_choices"] = [{"value": "supported"}, {"value": "unsupported"}] if trait else []
    return {"data": data}


def label_config(traits: int) -> str:
    """The labelling interface: the query's context as text, the reviewer's choices.

    The review page's keys: a / r accept or reject the query, 1-4 agree with the query's
    check 1-4 and Shift+1-4 disagree. A check or trait the task does not have shows no
    choices (they come from the task's data: Choices' dynamic `value`). The page's s / u act
    on a marked trait, which Label Studio has no notion of: trait choices declare no key, and
    Label Studio gives them the next free of 1-9, 0, q, w... (5/6, 7/8, 9/0 after four checks)."""

    def text(name: str, value: str | None = None) -> str:
        return f'  <Text name="{name}_text" value="${value or name}"/>'

    def choices(name: str, values: tuple[tuple[str, str], ...] = (), required: bool = False) -> str:
        options = "".join(f'<Choice value="{v}" hotkey="{key}"/>' for v, key in values)
        extra = ' required="true"' if required else ""
        dynamic = "" if values else f' value="${name}_choices"'
        return (
            f'  <Choices name="{name}" toName="query_text" choice="single" showInline="true"{extra}{dynamic}>'
            f"{options}</Choices>"
        )

    lines = [
        "<View>", '  <Header value="Query"/>', text("query", "query_text"), text("build"),
        '  <Header value="Situation"/>', text("situation"), '  <Header value="Your decision"/>',
        choices("query", (("accept", "a"), ("reject", "r")), True),
        '  <Header value="The LLM judge: agree (1-4) or disagree (Shift+1-4)"/>', text("checks"),
    ]  # fmt: skip
    for check in LLM_CHECKS:
        lines += [text(f"judge_{check}"), choices(f"check_{check}")]
    lines.append('  <Header value="Persona traits: supported by their memories?"/>')
    for n in range(traits):
        lines += [text(f"trait_{n}", f"trait_{n}_text"), choices(f"trait_{n}")]
    lines += [
        '  <Header value="Big Five"/>', text("big_five"), '  <Header value="Memories"/>', text("memories"),
        '  <Header value="Note"/>', '  <TextArea name="note" toName="query_text" maxSubmissions="1"/>',
        "</View>",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def _turn_text(turn: dict[str, Any], n: int) -> str:
    checks = turn["checks"] or {}
    from personaemp.instruments.simulator_rules import JUDGED, RULES

    names = [*RULES, *JUDGED, *sorted(set(checks) - {*RULES, *JUDGED})]
    verdicts = ", ".join(
        f"{name} {'pass' if checks[name] else 'FAIL'}" if name in checks else f"{name} not checked"
        for name in names
    )
    rejected = "".join(
        f"\n  asked again: {r['text'] or '(text not kept)'} — "
        + "; ".join(f"{rule}: {why}" for rule, why in r["failed"].items())
        for r in turn["rejected"]
    )
    return (
        f"turn {n}: {turn['text']}\n  emotion {turn['emotion']} (change {turn['change']}); thought: "
        f"{turn['thought'] or '—'}; reason: {turn['reason'] or '—'}\n  checks: {verdicts}{rejected}"
    )


def dialogue_task_of(item: dict[str, Any], turns: list[int]) -> dict[str, Any]:
    """A dialogue as a task: its turns as text and a slot per simulated turn of the project."""
    transcript = "\n".join(
        f"[{n}] {'supporter' if t['role'] == 'assistant' else 'user'}: {t['text']}"
        + (f"  (emotion {t['emotion']})" if t["emotion"] is not None else "")
        for n, t in enumerate(item["turns"])
    )
    data = {
        "item": item["item"],
        "query_id": item["query_id"],
        "user_id": item["user_id"],
        "dialogue": transcript,
        "facts": f"supporter {item['system']} ({item['supporter_model']}); "
        f"simulator {item['simulator_model']}; language {item['language']}; "
        f"emotion {item['initial_emotion']} -> {item['final_emotion']}; "
        f"ended by {item['ended_by']}; hidden need (model-written): {item['hidden_need']}",
    }
    for n in turns:
        has = n in item["labelled_turns"]
        data[f"turn_{n}_text"] = _turn_text(item["turns"][n], n) if has else ""
        for kind, values in DIALOGUE_TURN_VALUES.items():
            data[f"{kind}_{n}_choices"] = [{"value": v} for v in values] if has else []
    return {"data": data}


def dialogue_label_config(turns: list[int]) -> str:
    """The dialogue project's interface: the transcript, per simulated turn its realism and
    in-character choices, the supporter's PERM scores 1-5 and a note."""
    ask = "Each simulated user turn: how this person would write? in character?"
    lines = ["<View>", '  <Header value="Dialogue"/>', '  <Text name="dialogue" value="$dialogue"/>',
             '  <Text name="facts" value="$facts"/>', f'  <Header value="{ask}"/>']  # fmt: skip
    for n in turns:
        lines.append(f'  <Text name="turn_{n}" value="$turn_{n}_text"/>')
        for kind in DIALOGUE_TURN_VALUES:
            lines.append(
                f'  <Choices name="{kind}_{n}" toName="dialogue" choice="single" showInline="true" '
                f'value="${kind}_{n}_choices"></Choices>'
            )
    lines.append('  <Header value="The supporter, 1 (poor) to 5 (excellent)"/>')
    for dimension in DIMENSIONS:
        options = "".join(f'<Choice value="{score}"/>' for score in PERM_SCORES)
        lines += [
            f'  <Header value="{dimension}" size="6"/>',
            f'  <Choices name="perm_{dimension}" toName="dialogue" choice="single" showInline="true">'
            f"{options}</Choices>",
        ]
    lines += [
        '  <Header value="Note"/>',
        '  <TextArea name="note" toName="dialogue" maxSubmissions="1"/>',
        "</View>",
    ]
    return "\n".join(lines) + "\n"


def export_project(items: list[dict[str, Any]], folder: Path) -> list[Path]:
    """tasks.json (import it into a Label Studio project) and label_config.xml (its
    Settings > Labeling Interface > Code)."""
    folder.mkdir(parents=True, exist_ok=True)
    if items and items[0].get("kind") == "dialogue":
        turns = sorted({n for item in items for n in item["labelled_turns"]})
        tasks, config = [dialogue_task_of(item, turns) for item in items], dialogue_label_config(turns)
    else:
        traits = max((len(item["traits"]) for item in items), default=0)
        tasks, config = [task_of(item, traits) for item in items], label_config(traits)
    write_json_atomic(folder / TASKS_FILE, tasks)
    (folder / CONFIG_FILE).write_text(config, encoding="utf-8")
    return [folder / TASKS_FILE, folder / CONFIG_FILE]


WHEN_CHARS = 40  # an ISO time with microseconds and an offset is 32


class _Task:
    """Where a part of an export is, for one-line errors: file, task number and Label Studio id."""

    def __init__(self, source: str, number: int, task: Any):
        self.source, self.number = source, number
        self.ident = task.get("id") if isinstance(task, dict) else None

    @property
    def name(self) -> str:  # built only for an error: an import reads millions of parts
        """Label Studio's task id (what its Data Manager shows), and where the file has it."""
        ident = self.ident
        if isinstance(ident, int | str) and not isinstance(ident, bool):
            return f"{self.source}: task {shown(ident)} (entry {self.number} of the export)"
        return f"{self.source}: entry {self.number} of the export (a task without an id)"

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


CHOSEN = ("query", "check_", "trait_", "realism_", "character_", "perm_")  # the Choices controls (and `note`)
CONTROLS = re.compile(  # every control's name, of a queries and of a dialogues project
    rf"(query|note|check_({'|'.join(LLM_CHECKS)})|trait_\d+|realism_\d+|character_\d+|perm_({'|'.join(DIMENSIONS)}))"
)
CHOICES = {**VALUES, **DIALOGUE_TURN_VALUES, "perm": tuple(str(s) for s in PERM_SCORES)}


@dataclasses.dataclass
class _Annotation:
    """One annotation of an export: whose, on which task, when, and its labels."""

    task: _Task
    query_id: str
    annotation: int | str | None
    user: int | str | None  # Label Studio's user id, when the export gives it
    email: str | None
    when: str | None
    labels: dict[str, Any]  # control name -> chosen value (text for the note)
    unknown: tuple[str, ...] = ()  # the controls of its results this project does not have

    def meta(self) -> dict[str, Any]:
        meta = {
            "task": self.task.ident,
            "annotation": self.annotation,
            "user": self.user,
            "email": self.email,
        }
        return {key: value for key, value in meta.items() if value not in (None, "")}


def _who(annotation: dict[str, Any], task: _Task, key: str = "completed_by") -> tuple[Any, str | None]:
    """(user id, e-mail) from `completed_by` (JSON: an id, or an object with id and email) or
    JSON-MIN's `annotator` (the id, or the e-mail when Label Studio exported objects)."""
    who = task.expect(annotation.get(key), (dict, int, str, type(None)), key)
    if isinstance(who, dict):
        ident = task.expect(who.get("id"), (int, str, type(None)), f"{key}'s id")
        email = task.expect(who.get("email"), (str, type(None)), f"{key}'s email")
        return ident, email or None
    if isinstance(who, str):
        return (None, who) if "@" in who else (who or None, None)
    return who, None


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


def _query_of(query_id: Any, task: _Task, items: dict, queries) -> str:
    """The task's item: a query's id, or a dialogue's `item` (its data names it first)."""
    if query_id is None:
        raise InputError(f"{task.name} has no query_id (not a task exported by personaemp)")
    if not isinstance(query_id, str) or query_id not in items:
        what = "dialogue" if isinstance(queries, list) else "query"
        raise InputError(f"{task.name}: {what} {shown(query_id)} is not in {_named(queries)}")
    return query_id


def _named(source) -> str:
    return ", ".join(map(str, source)) if isinstance(source, list) else str(source)


def items_of(source) -> dict[str, dict[str, Any]]:
    """The items labels can name: a queries file's queries, or a list of dialogues files'
    dialogues (keyed by their item)."""
    if isinstance(source, list):
        from personaemp.review.dialogues import read_dialogue_items

        return {item["item"]: item for item in read_dialogue_items(source)}
    return {item["query_id"]: item for item in read_items(source)}


def _key(where: dict[str, Any]) -> Any:
    return where.get("item") or where.get("query_id")


def _json_annotations(raw: Any, task: _Task, items: dict, queries: Path) -> tuple[str, list[_Annotation]]:
    """A task of the JSON export: its query and its annotations (cancelled ones left out)."""
    data = task.expect(raw, dict, "the task").get("data")
    query_id = _query_of(_key(data) if isinstance(data, dict) else None, task, items, queries)
    found = []
    for annotation in task.expect(raw.get("annotations") or [], list, "annotations"):
        task.expect(annotation, dict, "an annotation")
        if task.expect(annotation.get("was_cancelled", False), (bool, type(None)), "was_cancelled"):
            continue
        user, email = _who(annotation, task)
        labels: dict[str, Any] = {}
        unknown = []
        for result in task.expect(annotation.get("result") or [], list, "an annotation's result"):
            task.expect(result, dict, "a result")
            name = task.expect(result.get("from_name", ""), str, "from_name")
            if not CONTROLS.fullmatch(name):  # another project's control (or a relation): not read
                unknown.append(name)
                continue
            value = task.expect(result.get("value") or {}, dict, "the value", name)
            if name == "note":
                texts = value.get("text") or []
                labels[name] = (
                    texts if isinstance(texts, str) else "\n".join(task.texts(texts, "a note's text"))
                )
            elif name.startswith(CHOSEN):
                picked = task.texts(value.get("choices") or [], "the choices", name)
                if picked:
                    labels[name] = picked[0]
        ident = task.expect(annotation.get("id"), (int, str, type(None)), "an annotation's id")
        when = _when(annotation, task)
        found.append(_Annotation(task, query_id, ident, user, email, when, labels, tuple(unknown)))
    return query_id, found


def _min_value(value: Any, task: _Task, name: str) -> str | None:
    """A control's value in JSON-MIN (label_studio_sdk's prettify_result): the one choice or
    text itself; a list of {"choices"|"text": [...]} when there were several."""
    if isinstance(value, str):
        return value
    for part in value if isinstance(value, list) else [value]:
        if isinstance(part, dict):
            texts = task.texts(part.get("choices") or part.get("text") or [], "the choices", name)
            if texts:
                return texts[0] if name != "note" else "\n".join(texts)
        elif isinstance(part, str):
            return part
    return None


def _min_annotation(raw: Any, task: _Task, items: dict, queries: Path) -> tuple[str, list[_Annotation]]:
    """A record of the JSON-MIN export: the task's data at the top level, then the controls'
    values under their names, and `annotator`, `annotation_id`... (a task without annotations:
    its data alone). The task data of a personaemp project names no control, so a control's
    name holds its value; a project exported before that (data `query` and `trait_<n>` beside
    the controls of the same names) is read by the value: a choice, or the data's text."""
    task.expect(raw, dict, "the record")
    query_id = _query_of(_key(raw), task, items, queries)
    ident = task.expect(raw.get("annotation_id"), (int, str, type(None)), "annotation_id")
    user, email = _who(raw, task, "annotator")
    if ident is None and user is None and email is None:
        return query_id, []
    labels: dict[str, Any] = {}
    for name, value in raw.items():
        # the task's data is beside the controls; the converter leaves other projects' controls out
        if not CONTROLS.fullmatch(name):
            continue
        chosen = _min_value(value, task, name)
        if chosen is None:
            continue
        kind = name.partition("_")[0]
        if name != "note" and chosen not in CHOICES[kind]:
            continue  # an old project's data (the query's or a trait's text), not a choice
        labels[name] = chosen
    return query_id, [_Annotation(task, query_id, ident, user, email, _when(raw, task), labels)]


def read_export(
    export: Any, queries: Path, source: str = "export"
) -> tuple[dict[str, Any], list[_Annotation]]:
    """A Label Studio export, JSON (a list of tasks, each with its annotations) or JSON-MIN
    (one record per task and annotation): the tasks it holds (query id -> Label Studio's task
    id) and their annotations. Anything out of shape stops the import: one line naming the
    file and Label Studio's task id (or the entry, for a task without one)."""
    if not isinstance(export, list):
        raise InputError(f"{source}: not a Label Studio JSON or JSON-MIN export (a list of tasks)")
    items = items_of(queries)
    tasks: dict[str, Any] = {}
    annotations: list[_Annotation] = []
    for number, raw in enumerate(export, 1):
        task = _Task(source, number, raw)
        minimal = isinstance(raw, dict) and "data" not in raw and "annotations" not in raw
        reader = _min_annotation if minimal else _json_annotations
        query_id, found = reader(raw, task, items, queries)
        tasks[query_id] = task.ident
        annotations += found
    return tasks, annotations


def _reviewer(annotation: _Annotation, known: dict[Any, Any]) -> str:
    """`label-studio:<user id>`: one reviewer per Label Studio user whichever export form.
    An export that gives only the e-mail (JSON-MIN of a project exported with user objects)
    takes the id an earlier import saw for that annotation or e-mail."""
    user = annotation.user
    if user is None:
        user = known.get(("annotation", annotation.annotation)) or known.get(("email", annotation.email))
    return f"{LABEL_STUDIO_REVIEWER}{user if user is not None else annotation.email or 'unknown'}"


def import_export(path: Path, queries: Path, labels: Path) -> dict[str, Any]:
    """Make the labels file hold Label Studio's current state for the tasks of an export.

    Per Label Studio user (reviewer `label-studio:<id>`) and task, the user's latest
    annotation (cancelled ones left out) is what they say: a label that differs from the
    file's is appended (with Label Studio's task, annotation and user ids), and a label the
    file holds for a Label Studio reviewer but the export does not (a choice removed by an
    edit, a deleted annotation, a name an older import used) is removed by a line with
    `"value": null`. Only the tasks in the export are touched: a partial export (some tasks)
    leaves the others as they are, and counts those holding Label Studio labels
    (`absent_tasks`); an export holds all of a task's annotations, so a task in it with none
    (a full export: `download_all_tasks=true`, or a snapshot) loses its labels. Reviewers of
    the review page are never touched. Labels about a trait or check the query does not
    have are skipped and counted (`refused`), results of controls the project does not have
    are left out and counted by name (`unknown_controls`). Nothing is written unless the
    whole export reads; lines go in batches of one write and one fsync."""
    try:
        export = msgspec.json.decode(Path(path).read_bytes().removeprefix(BOM))  # Windows tools write one
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except RecursionError:
        raise InputError(f"{path}: nested deeper than a Label Studio export is") from None
    except msgspec.DecodeError as error:
        raise InputError(f"{path}: not valid JSON ({error})") from None
    tasks, annotations = read_export(export, queries, str(path))
    items = items_of(queries)

    def target(key: str) -> dict[str, str]:
        return {"item": key} if items[key].get("kind") == "dialogue" else {"query_id": key}

    file = LabelFile(labels)
    before = file.events()
    known: dict[Any, Any] = {}
    for event in before:
        meta = event.get("label_studio")
        if isinstance(meta, dict) and meta.get("user") is not None:
            known[("annotation", meta.get("annotation"))] = meta["user"]
            if meta.get("email"):
                known[("email", meta["email"])] = meta["user"]
    latest: dict[tuple[str, str], _Annotation] = {}
    for annotation in annotations:
        key = (_reviewer(annotation, known), annotation.query_id)
        held = latest.get(key)
        order = (annotation.when or "", str(annotation.annotation or ""))
        if held is None or order >= (held.when or "", str(held.annotation or "")):
            latest[key] = annotation
    state = current_labels(before)
    unknown = Counter(name for annotation in latest.values() for name in annotation.unknown)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    new: list[dict[str, Any]] = []
    refused = removed = 0
    for (reviewer, query_id), annotation in latest.items():
        have = state.get(reviewer, {}).get(query_id, {})
        wanted = {}
        for name, value in annotation.labels.items():
            field = name if name in ("query", "note") else name.replace("_", ":", 1)
            if field.startswith("perm:") and isinstance(value, str) and value.isdigit():
                value = int(value)  # Label Studio's choice is text; the page's score a number
            body = {"reviewer": reviewer, **target(query_id), "field": field, "value": value}
            try:
                event = make_event(body, items, annotation.when)
            except UnknownTarget:
                refused += 1
                continue
            except InputError as error:
                raise InputError(f"{annotation.task.name}: {error.message}") from None
            wanted[field] = event
            if have.get(field, {}).get("value") != value:
                new.append({**event, "label_studio": annotation.meta()})
        for field in have.keys() - wanted.keys():
            body = {"reviewer": reviewer, **target(query_id), "field": field, "value": None}
            new.append({**make_event(body, items, now), "label_studio": annotation.meta()})
            removed += 1
    absent = set()  # tasks holding Label Studio's labels that the export does not have
    for reviewer, queries_labelled in state.items():
        if not reviewer.startswith(LABEL_STUDIO_REVIEWER):
            continue
        for query_id, fields in queries_labelled.items():
            if query_id not in tasks:
                absent.add(query_id)
            elif (reviewer, query_id) not in latest:
                for field in fields:  # the annotation is gone from Label Studio
                    body = {"reviewer": reviewer, **target(query_id), "field": field, "value": None}
                    meta = {"task": tasks[query_id]} if tasks[query_id] is not None else {}
                    new.append({**make_event(body, items, now), "label_studio": meta})
                    removed += 1
    file.extend(new)
    return {
        "export": str(path),
        "labels": str(labels),
        "tasks": len(tasks),
        "annotations": len(latest),
        "reviewers": len({reviewer for reviewer, _ in latest}),
        "added": len(new) - removed,
        "removed": removed,
        "refused": refused,
        "unknown_controls": dict(sorted(unknown.items())),
        "absent_tasks": len(absent),
    }


def exchange_label_studio(options, export: Path | None, export_file: Path | None, console) -> dict | None:
    """`personaemp review --export-label-studio DIR` / `--import-label-studio FILE`; the
    result (printed by --json)."""
    from rich.markup import escape

    labels = review_labels(options)
    dialogues = [Path(p) for p in getattr(options, "dialogues", None) or ()]
    source = dialogues or Path(options.input)
    result: dict[str, Any] = {}
    if export is not None:
        session = (
            open_dialogue_session(dialogues, labels, options.size, options.seed)
            if dialogues
            else open_session(options.input, labels, options.size, options.seed)
        )
        paths = export_project(session.items, Path(export))
        console.print(
            f"wrote {len(session.items)} tasks (seed {options.seed}): "
            + escape(", ".join(str(path) for path in paths))
        )
        result["exported"] = {
            "tasks": len(session.items),
            "seed": options.seed,
            "files": [str(p) for p in paths],
        }
    if export_file is not None:
        found = import_export(Path(export_file), source, labels)
        result["imported"] = found
        console.print(
            f"{found['added']} labels set and {found['removed']} removed from {escape(str(export_file))} "
            f"({found['tasks']} tasks, {found['reviewers']} Label Studio users) in {escape(str(labels))}"
        )
        refused = found["refused"]
        if refused:
            console.print(
                f"[yellow]{refused} label{'s' if refused != 1 else ''} skipped: about a trait or check "
                "their query does not have; the rest imported, not scored[/]"
            )
        unknown = found["unknown_controls"]
        if unknown:
            named = ", ".join(_control(name) + (f" ({n})" if n > 1 else "") for name, n in unknown.items())
            total = sum(unknown.values())
            console.print(
                f"[yellow]{total} result{'s' if total != 1 else ''} from controls this project does "
                f"not have: {escape(named)} — left out[/]"
            )
        absent = found["absent_tasks"]
        if absent:
            one = absent == 1
            console.print(
                f"[yellow]{absent} task{'' if one else 's'} holding labels {'is' if one else 'are'} not in "
                f"this export: {'its' if one else 'their'} labels are kept; if {'its' if one else 'their'} "
                f"annotations were deleted, export with download_all_tasks=true ({DOCS})[/]"
            )
    return result or None


def _control(name: str) -> str:
    """A control's name from an export, for one terminal line."""
    if not name:
        return "(no from_name)"
    return name if name.isprintable() and len(name) <= NAME_CHARS else shown(name, NAME_CHARS)
