"""`personaemp review --dialogues`: people label gen-dialogues' conversations on the review page
(`personaemp agreement --dialogues` sets their labels beside the simulator's: agreement.py).

An item is one dialogue of one supporter (its id: `<system>/<dialogue_id>`, the system named by
its file as `evaluate --dialogues` names it); the other supporters' dialogues of the same query
are shown beside it. Label fields:

- `realism:<n>` (realistic | unrealistic): is the n-th turn how this person would write?
- `character:<n>` (in | out): is the n-th turn in character? The event keeps the simulator's
  `in_character` check of that turn as `check` (absent when the check did not run);
- `character:<n>.<k>` (in | out): the same of the k-th reply rejected at turn n (asked again).
  Every kept turn passed the check (a failing reply is asked again), so against kept turns
  alone the check is constant and kappa measures nothing: the page offers the rejected replies
  with text (one a turn) mixed blind among the kept ones (`probes`, in an order fixed by the
  item). A rejected reply's `check`: the LLM check's verdict when it ran on it (it failed
  in_character or grounded), absent when the reply failed a rule first (the check never ran);
- `perm:<dimension>` (1-5): how well the supporter did, on the paper's PERM dimensions;
- `note` (text).

Only the turns the simulator wrote (user turns after the opening query) take turn labels.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from personaemp.errors import InputError
from personaemp.instruments.simulator_rules import JUDGED
from personaemp.records import DIMENSIONS, REJECTED_KEYS
from personaemp.review.fields import NOTE_CHARS, PERM_SCORES, TURN_VALUES, UnknownTarget, shown

CHECK = "in_character"  # the simulator's check people's "in character?" is set against
LABELS_FILE = "dialogue_labels.jsonl"  # beside the first dialogues file, by default


# --- the items -------------------------------------------------------------------------------


def item_id(system: str, dialogue_id: str) -> str:
    return f"{system}/{dialogue_id}"


def _turn(turn) -> dict[str, Any]:
    """A turn as the page shows it; a rejected reply's failed rules apart from its text and
    thought (rows written before those were kept have the rules only)."""
    rejected = []
    for entry in turn.rejected:
        failed = {rule: why for rule, why in entry.items() if rule not in REJECTED_KEYS}
        rejected.append({"text": entry.get("text"), "thought": entry.get("thought"), "failed": failed})
    return {
        "role": turn.role, "text": turn.text, "emotion": turn.emotion, "change": turn.change,
        "reason": turn.reason, "need_met": turn.need_met, "thought": turn.thought,
        "checks": turn.checks, "rejected": rejected,
    }  # fmt: skip


def _probes(key: str, turns: list[dict[str, Any]], labelled: list[int]) -> list[dict[str, Any]]:
    """The replies the blind check offers: every kept simulated turn, and per turn the first
    rejected reply whose text was kept, shuffled by the item's id (the same order for every
    reviewer), nothing saying which was kept."""
    found = [
        {"target": str(n), "text": turns[n]["text"], "answering": turns[n - 1]["text"]} for n in labelled
    ]
    for n in labelled:
        k = next((k for k, entry in enumerate(turns[n]["rejected"]) if entry["text"]), None)
        if k is not None:
            found.append({"target": f"{n}.{k}", "text": turns[n]["rejected"][k]["text"],
                          "answering": turns[n - 1]["text"]})  # fmt: skip
    random.Random(key).shuffle(found)
    return found


def rejected_verdict(entry: dict[str, Any]) -> bool | None:
    """The in_character check's verdict on a rejected reply: it ran when the reply kept the rules
    (then it failed in_character, grounded or both), never when a rule failed first."""
    failed = entry["failed"]
    if not any(name in failed for name in JUDGED):
        return None
    return CHECK not in failed


HINT = "pass gen-dialogues' output"


def read_dialogue_items(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Every dialogue of every file, each with the ids of the other systems' dialogues of its
    query (`beside`), in file order."""
    from personaemp.io import iter_records
    from personaemp.records import Dialogue

    # each system named by its file, as `evaluate --dialogues` names it (a product of its own)
    names = [Path(path).stem for path in paths]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InputError(f"two dialogues files are both named {repeated[0]!r}", "rename one of them")
    items: list[dict[str, Any]] = []
    for system, path in zip(names, paths, strict=True):
        lines: dict[str, int] = {}  # dialogue id -> its line: a label names one dialogue, never two
        for lineno, dialogue in iter_records(
            Path(path), Dialogue, "a dialogue", "pass gen-dialogues' output"
        ):
            if dialogue.dialogue_id in lines:
                raise InputError(
                    f"{path}:{lineno}: dialogue {dialogue.dialogue_id} again (first on line "
                    f"{lines[dialogue.dialogue_id]})",
                    "keep one row per dialogue: labels are keyed by its id",
                )
            lines[dialogue.dialogue_id] = lineno
            turns = [_turn(turn) for turn in dialogue.turns]
            items.append(
                {
                    "kind": "dialogue", "item": item_id(system, dialogue.dialogue_id), "system": system,
                    "query_id": dialogue.query_id, "dialogue_id": dialogue.dialogue_id,
                    "user_id": dialogue.user_id, "category": dialogue.category, "language": dialogue.language,
                    "supporter_model": dialogue.supporter_model, "simulator_model": dialogue.simulator_model,
                    "hidden_need": dialogue.hidden_need, "initial_emotion": dialogue.initial_emotion,
                    "final_emotion": dialogue.final_emotion, "need_met_at_turn": dialogue.need_met_at_turn,
                    "ended_by": dialogue.ended_by, "context": dialogue.context,
                    "memory_ids": dialogue.memory_ids, "turns": turns,
                    # the simulator's turns: every user turn after the opening query
                    "labelled_turns": [n for n, t in enumerate(turns) if t["role"] == "user" and n > 0],
                    "source": str(path),
                }
            )  # fmt: skip
            items[-1]["probes"] = _probes(items[-1]["item"], turns, items[-1]["labelled_turns"])
    by_query: dict[str, list[str]] = defaultdict(list)
    for item in items:
        by_query[item["query_id"]].append(item["item"])
    for item in items:
        item["beside"] = [other for other in by_query[item["query_id"]] if other != item["item"]]
    return items


# --- the labels ------------------------------------------------------------------------------


def dialogue_event(body: dict[str, Any], item: dict[str, Any], reviewer: str) -> dict[str, Any]:
    """A label event on a dialogue (page.make_event's checks of the reviewer and the item done);
    InputError, or page.UnknownTarget for a turn the simulator did not write."""
    name, value = body.get("field"), body.get("value")
    if not isinstance(name, str):
        raise InputError("a label's field is text")
    kind, _, target = name.partition(":")
    event = {
        "reviewer": reviewer, "item": item["item"], "query_id": item["query_id"],
        "dialogue_id": item["dialogue_id"], "system": item["system"], "user_id": item["user_id"],
        "field": name,
    }  # fmt: skip
    if kind == "note" and not target:
        if value is not None and (not isinstance(value, str) or len(value) > NOTE_CHARS):
            raise InputError(f"a note is text of at most {NOTE_CHARS} characters")
    elif kind in TURN_VALUES and target:
        if value is not None and value not in TURN_VALUES[kind]:
            raise InputError(f"{name} takes {' or '.join(TURN_VALUES[kind])}, not {shown(value)}")
        turn, dot, rejected = target.partition(".")
        if not turn.isdigit() or int(turn) not in item["labelled_turns"]:
            raise UnknownTarget(f"turn {shown(target)} is not one the simulated user wrote")
        if dot and not (kind == "character" and target in {p["target"] for p in item.get("probes", ())}):
            raise UnknownTarget(f"turn {shown(target)}: no rejected reply the page offers")
        if kind == "character" and dot:
            verdict = rejected_verdict(item["turns"][int(turn)]["rejected"][int(rejected)])
            if verdict is not None:
                event["check"] = verdict
            event["kept"] = False
        elif kind == "character":
            checks = item["turns"][int(target)]["checks"] or {}
            if isinstance(checks.get(CHECK), bool):
                event["check"] = checks[CHECK]
    elif kind == "perm" and target:
        if target not in DIMENSIONS:
            raise InputError(f"unknown PERM dimension {shown(target)} (one of {', '.join(DIMENSIONS)})")
        if isinstance(value, float) and value.is_integer():
            # 5.0 (a client's JSON number) is the score 5: saved as 5, so every reader counts it;
            # a fraction (4.5) is no PERM score and is refused below.
            value = int(value)
        if value is not None and (isinstance(value, bool) or value not in PERM_SCORES):
            raise InputError(f"{name} takes 1 to 5, not {shown(value)}")
    else:
        raise InputError(f"unknown field {shown(name)}")
    event["value"] = value
    return event
