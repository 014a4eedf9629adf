"""`personaemp review --fidelity fidelity.jsonl`: people take the discriminator's test, blinded
(the conversation so far and two candidate next messages: which one did this person write?),
and `personaemp agreement --fidelity` reports their accuracy and how far the LLM
discriminator agrees with them.

An item is one pair of one cut: the real next message and one source's (a variant's simulated
message, or the `self` control: the same person's other real message), its id
`<cut_id>/<source>`. Which candidate comes first is drawn per pair from the seed; the page is
sent neither the answer nor the source's name shown beside the text. The one label field:
`pick` (A | B), its event holding whether it was right (`correct`) and the order shown.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from personaemp.errors import InputError
from personaemp.instruments.realism import wilson
from personaemp.review.fields import shown

LABELS_FILE = "fidelity_labels.jsonl"  # beside the fidelity file, by default
REPORT_FILE = "fidelity_agreement.json"
PICKS = ("A", "B")
PRIVATE = "_"  # item keys the page is not sent (the answer)


def read_fidelity_items(path: Path, seed: int = 0) -> list[dict[str, Any]]:
    """Every pair of a fidelity.jsonl: per cut, one per variant and one for `self`."""
    from personaemp.io import ErrorPolicy, iter_jsonl

    items = []
    for lineno, _, row in iter_jsonl(Path(path), ErrorPolicy("fail")):
        if not isinstance(row, dict) or not {"cut_id", "real", "simulated"} <= row.keys():
            raise InputError(f"{path}:{lineno}: not a fidelity row (cut_id, real, simulated)",
                             "pass the output of `personaemp fidelity`")  # fmt: skip
        if "dialogue" not in row:
            raise InputError(f"{path}:{lineno}: a fidelity row without its conversation",
                             "run `personaemp fidelity` again: it remakes them from its cache")  # fmt: skip
        # a variant that wrote no message of its own (`failed`) has no pair
        candidates = {s: made["text"] for s, made in row["simulated"].items() if made["text"] is not None}
        if row.get("self"):
            candidates["self"] = row["self"]
        for source, text in candidates.items():
            real_first = random.Random(f"{seed}:{row['cut_id']}:{source}").random() < 0.5
            first, second = (row["real"], text) if real_first else (text, row["real"])
            items.append({
                "kind": "fidelity", "item": f"{row['cut_id']}/{source}", "query_id": row["cut_id"],
                "user_id": row["user_id"], "language": row.get("language"),
                "dialogue": row["dialogue"], "reply": row["reply"], "first": first, "second": second,
                "_source": source, "_answer": "A" if real_first else "B",
            })  # fmt: skip
    return items


def sample_pairs(items: Sequence[dict[str, Any]], size: int, seed: int) -> list[dict[str, Any]]:
    """`size` pairs, shuffled with `seed` (the same file, size and seed: the same sample)."""
    chosen = sorted(items, key=lambda item: item["item"])
    random.Random(seed).shuffle(chosen)
    return chosen[:size]


def public(item: dict[str, Any]) -> dict[str, Any]:
    """The item as the page gets it: without the answer."""
    return {key: value for key, value in item.items() if not key.startswith(PRIVATE)}


def fidelity_event(body: dict[str, Any], item: dict[str, Any], reviewer: str) -> dict[str, Any]:
    """A label on a pair (page.make_event's checks of the reviewer and the item done)."""
    name, value = body.get("field"), body.get("value")
    if name != "pick":
        raise InputError(f"unknown field {shown(name)}")
    if value is not None and value not in PICKS:
        raise InputError(f"pick takes A or B, not {shown(value)}")
    event = {
        "reviewer": reviewer, "item": item["item"], "query_id": item["query_id"], "user_id": item["user_id"],
        "source": item["_source"], "field": name, "value": value, "real_first": item["_answer"] == "A",
    }  # fmt: skip
    if value is not None:
        event["correct"] = value == item["_answer"]
    return event


# --- agreement --------------------------------------------------------------------------------------


def kappa(pairs: Sequence[tuple[bool, bool]]) -> float | None:
    """Cohen's kappa of two raters' yes/no labels."""
    n = len(pairs)
    if not n:
        return None
    observed = sum(a == b for a, b in pairs) / n
    p_a, p_b = sum(a for a, _ in pairs) / n, sum(b for _, b in pairs) / n
    expected = p_a * p_b + (1 - p_a) * (1 - p_b)
    return None if expected == 1 else (observed - expected) / (1 - expected)


def fidelity_figures(rows: dict[str, dict[str, Any]], state: dict[str, dict[str, dict[str, Any]]],
                     labels: Path) -> dict[str, Any]:  # fmt: skip
    """People's accuracy per source (Wilson 95% CI) and Cohen's kappa between the LLM
    discriminator and people on whether the real message was picked, each pair in the order
    the person saw it (the discriminator answered both). `rows`: the fidelity rows by cut id;
    `state`: the current labels (page.current_labels)."""
    people: dict[str, list[bool]] = {}
    matched: list[tuple[bool, bool]] = []
    for fields_of in state.values():
        for fields in fields_of.values():
            event = fields.get("pick")
            if event is None or "correct" not in event:
                continue
            people.setdefault(event["source"], []).append(event["correct"])
            people.setdefault("all", []).append(event["correct"])
            machine = (rows.get(event["query_id"], {}).get("discriminator") or {}).get(event["source"])
            if machine:
                matched.append((machine[0 if event["real_first"] else 1], event["correct"]))
    accuracy = {source: wilson(sum(found), len(found)) for source, found in people.items()}
    return {
        "labels": str(labels), "reviewers": len(state),
        "people_accuracy": accuracy,
        "kappa_llm_people": {"kappa": kappa(matched), "n": len(matched),
                             "rule": "Cohen's kappa on 'picked the real message', the discriminator's answer "
                                     "in the order the person saw"},
    }  # fmt: skip


def agreement_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for source, figure in report["people_accuracy"].items():
        if figure["share"] is not None:
            lines.append(f"people picked the real message ({source}): {figure['share']:.2f} "
                         f"[{figure['low']:.2f}, {figure['high']:.2f}] n={figure['n']}")  # fmt: skip
    k = report["kappa_llm_people"]
    value = "—" if k["kappa"] is None else f"{k['kappa']:.2f}"
    lines.append(f"kappa, LLM discriminator vs people: {value} (n={k['n']} pairs)")
    return lines
