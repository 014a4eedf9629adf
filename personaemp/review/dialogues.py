"""`personaemp review --dialogues`: people label gen-dialogues' conversations on the review page,
and `personaemp agreement --dialogues` sets their labels beside the simulator's.

An item is one dialogue of one supporter (its id: `<system>/<dialogue_id>`, the system named by
its file as `evaluate --dialogues` names it); the other supporters' dialogues of the same query
are shown beside it. Label fields:

- `realism:<n>` (realistic | unrealistic): is the n-th turn how this person would write?
- `character:<n>` (in | out): is the n-th turn in character? The event keeps the simulator's
  `in_character` check of that turn as `check` (absent when the check did not run);
- `perm:<dimension>` (1-5): how well the supporter did, on the paper's PERM dimensions;
- `note` (text).

Only the turns the simulator wrote (user turns after the opening query) take turn labels.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from personaemp.errors import InputError
from personaemp.records import DIMENSIONS

TURN_VALUES = {"realism": ("realistic", "unrealistic"), "character": ("in", "out")}
PERM_SCORES = (1, 2, 3, 4, 5)
CHECK = "in_character"  # the simulator's check people's "in character?" is set against
LABELS_FILE = "dialogue_labels.jsonl"  # beside the first dialogues file, by default
REPORT_FILE = "dialogue_agreement.json"


# --- the items -------------------------------------------------------------------------------


def item_id(system: str, dialogue_id: str) -> str:
    return f"{system}/{dialogue_id}"


def _turn(turn) -> dict[str, Any]:
    """A turn as the page shows it; a rejected reply's failed rules apart from its text and
    thought (rows written before those were kept have the rules only)."""
    rejected = []
    for entry in turn.rejected:
        failed = {rule: why for rule, why in entry.items() if rule not in ("text", "thought")}
        rejected.append({"text": entry.get("text"), "thought": entry.get("thought"), "failed": failed})
    return {
        "role": turn.role, "text": turn.text, "emotion": turn.emotion, "change": turn.change,
        "reason": turn.reason, "need_met": turn.need_met, "thought": turn.thought,
        "checks": turn.checks, "rejected": rejected,
    }  # fmt: skip


def read_dialogue_items(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Every dialogue of every file, each with the ids of the other systems' dialogues of its
    query (`beside`), in file order."""
    from personaemp.build.dialogues import read_dialogues
    from personaemp.evaluation.sessions import system_names

    items: list[dict[str, Any]] = []
    for system, path in zip(system_names(paths), paths, strict=True):
        dialogues = read_dialogues(Path(path))
        for dialogue in dialogues:
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
    by_query: dict[str, list[str]] = defaultdict(list)
    for item in items:
        by_query[item["query_id"]].append(item["item"])
    for item in items:
        item["beside"] = [other for other in by_query[item["query_id"]] if other != item["item"]]
    return items


def sample_dialogues(items: Sequence[dict[str, Any]], size: int, seed: int) -> list[dict[str, Any]]:
    """`size` queries, taken in turn from each category / language / ending stratum (as the
    query sample is), each with all its systems' dialogues one after the other: the same
    person labels both supporters of a query."""
    from personaemp.review.page import sample_items

    per_query: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in items:
        per_query[item["query_id"]].append(item)
    stand_ins = [
        {"query_id": query, "category": group[0]["category"], "language": group[0]["language"],
         "accepted": True, "checks": {f"ended_by_{d['ended_by']}": False for d in group}}
        for query, group in per_query.items()
    ]  # fmt: skip
    return [item for picked in sample_items(stand_ins, size, seed) for item in per_query[picked["query_id"]]]


# --- the labels ------------------------------------------------------------------------------


def dialogue_event(body: dict[str, Any], item: dict[str, Any], reviewer: str) -> dict[str, Any]:
    """A label event on a dialogue (page.make_event's checks of the reviewer and the item done);
    InputError, or page.UnknownTarget for a turn the simulator did not write."""
    from personaemp.review.page import NOTE_CHARS, UnknownTarget, shown

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
        if not target.isdigit() or int(target) not in item["labelled_turns"]:
            raise UnknownTarget(f"turn {shown(target)} is not one the simulated user wrote")
        if kind == "character":
            checks = item["turns"][int(target)]["checks"] or {}
            if isinstance(checks.get(CHECK), bool):
                event["check"] = checks[CHECK]
    elif kind == "perm" and target:
        if target not in DIMENSIONS:
            raise InputError(f"unknown PERM dimension {shown(target)} (one of {', '.join(DIMENSIONS)})")
        if value is not None and (isinstance(value, bool) or value not in PERM_SCORES):
            raise InputError(f"{name} takes 1 to 5, not {shown(value)}")
    else:
        raise InputError(f"unknown field {shown(name)}")
    event["value"] = value
    return event


# --- agreement -------------------------------------------------------------------------------


def ranks(values: Sequence[float]) -> list[float]:
    """Ranks from 1, ties given their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start : end + 1]:
            out[i] = (start + end) / 2 + 1
        start = end + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rho: Pearson's r of the ranks; None with fewer than 3 pairs or a constant side."""
    if len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if not sxx or not syy else sxy / math.sqrt(sxx * syy)


def people_ratings(state: dict[str, dict[str, dict[str, Any]]]) -> dict[str, float]:
    """item -> people's rating: per reviewer the mean of the three PERM scores (only a
    reviewer who scored all three counts), then the mean over reviewers."""
    per_item: dict[str, list[float]] = defaultdict(list)
    for fields_of in state.values():
        for item, fields in fields_of.items():
            scores = [fields.get(f"perm:{d}", {}).get("value") for d in DIMENSIONS]
            if all(isinstance(s, int) for s in scores):
                per_item[item].append(sum(scores) / len(scores))
    return {item: sum(s) / len(s) for item, s in per_item.items()}


def scored_dialogue_labels(state, items: dict[str, dict[str, Any]]):
    """The current labels the figures count, and how many were left out by reason (checked as
    the page checks a click, against these dialogues)."""
    from personaemp.review.page import UnknownTarget
    from personaemp.summaries import NOT_SCORED

    kept: dict[str, dict[str, dict[str, Any]]] = {}
    left_out = dict.fromkeys(NOT_SCORED, 0)
    for reviewer, fields_of in state.items():
        for key, fields in fields_of.items():
            item = items.get(key)
            for name, event in fields.items():
                if item is None:
                    left_out["unknown_query"] += 1
                    continue
                try:
                    checked = dialogue_event({"field": name, "value": event.get("value")}, item, reviewer)
                except UnknownTarget:
                    left_out["unknown_target"] += 1
                    continue
                except InputError:
                    left_out["invalid"] += 1
                    continue
                kept.setdefault(reviewer, {}).setdefault(key, {})[name] = checked
    return kept, left_out


def compute_dialogue_agreement(
    paths: Sequence[Path], labels: Path | None, *, resamples: int = 2000, seed: int = 0
) -> dict[str, Any]:
    """The three figures, each with n and a 95% interval:

    - `in_character`: people's "in character?" vs the simulator's check, Cohen's kappa over
      (reviewer, turn) pairs where the check ran, bootstrap interval over dialogues;
    - `emotion_vs_people`: Spearman's rho of the final emotion with people's rating (the mean
      PERM score), over the dialogues rated, bootstrap interval over dialogues;
    - `ranking`: over the queries whose dialogues of two systems were both rated, the share of
      system pairs that the final emotion orders as people's rating does (ties left out and
      counted), Wilson interval; and the systems' rankings by mean final emotion and by mean
      rating over the queries rated for every system.
    """
    from personaemp.review.agreement import Bootstrap, _round, agreement_figures, confusion, wilson
    from personaemp.review.page import LABEL_STUDIO_REVIEWER, current_labels, read_label_events

    items = {item["item"]: item for item in read_dialogue_items(paths)}
    events = read_label_events(labels) if labels is not None and Path(labels).exists() else []
    state, not_scored = scored_dialogue_labels(current_labels(events), items)
    boot = Bootstrap(resamples, seed)
    report: dict[str, Any] = {
        "dialogues": len(items),
        "systems": sorted({item["system"] for item in items.values()}),
        "labels": {
            "events": len(events),
            "reviewers": sorted(state),
            "dialogues_labelled": len({key for fields_of in state.values() for key in fields_of}),
            "label_studio_reviewers": sum(name.startswith(LABEL_STUDIO_REVIEWER) for name in state),
            "not_scored": not_scored,
        },
        "resamples": resamples,
        "seed": seed,
    }

    # (a) people vs the in_character check
    clusters: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    not_checked = 0
    for fields_of in state.values():
        for key, fields in fields_of.items():
            for name, event in fields.items():
                if not name.startswith("character:"):
                    continue
                if "check" not in event:
                    not_checked += 1
                    continue
                cell = confusion([(event["check"], event["value"] == "in")])
                clusters[key] = [x + y for x, y in zip(clusters[key], cell, strict=True)]
    figures = agreement_figures(dict(clusters), boot)
    figures["dialogues"] = figures.pop("queries")
    figures["labelled_not_checked"] = not_checked  # turns people labelled where the check did not run
    report["in_character"] = figures

    # (b) final emotion vs people's rating
    rated = people_ratings(state)
    keys = sorted(rated)
    emotion = [items[k]["final_emotion"] for k in keys]
    rating = [rated[k] for k in keys]
    rho = spearman(emotion, rating)
    ci = None
    if rho is not None:
        np = boot.np
        picks = boot.rng.integers(0, len(keys), size=(boot.resamples, len(keys)))
        values = [spearman([emotion[i] for i in row], [rating[i] for i in row]) for row in picks.tolist()]
        ci = boot.interval([np.nan if v is None else v for v in values])
    report["emotion_vs_people"] = {"n": len(keys), "rho": _round(rho), "rho_ci": ci}

    # (c) the supporters' ranking
    by_query: dict[str, dict[str, str]] = defaultdict(dict)
    for key in keys:
        by_query[items[key]["query_id"]][items[key]["system"]] = key
    agree = pairs = ties = 0
    for systems in by_query.values():
        for first, second in itertools.combinations(sorted(systems), 2):
            a, b = systems[first], systems[second]
            by_emotion = _sign(items[a]["final_emotion"] - items[b]["final_emotion"])
            by_people = _sign(rated[a] - rated[b])
            if not by_emotion or not by_people:
                ties += 1
                continue
            pairs += 1
            agree += by_emotion == by_people
    every = sorted({item["system"] for item in items.values()})
    common = [q for q, systems in by_query.items() if len(every) > 1 and set(systems) == set(every)]
    mean_emotion = {s: _mean([items[by_query[q][s]]["final_emotion"] for q in common]) for s in every}
    mean_rating = {s: _mean([rated[by_query[q][s]] for q in common]) for s in every}
    ranked = lambda means: sorted(every, key=lambda s: (-(means[s] or 0), s))  # noqa: E731
    report["ranking"] = {
        "pairs": pairs, "ties": ties, "agree": agree,
        "share": _round(agree / pairs) if pairs else None, "share_ci": wilson(agree, pairs),
        "queries": len(common), "mean_final_emotion": mean_emotion, "mean_rating": mean_rating,
        "by_final_emotion": ranked(mean_emotion) if common else [],
        "by_people": ranked(mean_rating) if common else [],
    }  # fmt: skip
    ranking = report["ranking"]
    ranking["same"] = bool(common) and ranking["by_final_emotion"] == ranking["by_people"]
    return report


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def dialogue_agreement_lines(report: dict[str, Any]) -> list[str]:
    """The three figures as the terminal (and the docs) show them, each with n and its rule."""
    from personaemp.summaries import interval_text, not_scored_text

    a, b, c = report["in_character"], report["emotion_vs_people"], report["ranking"]
    unchecked = a["labelled_not_checked"]
    ties = c["ties"]
    lines = [
        f"people vs the in_character check: κ {interval_text(a, 'kappa')}, agreement "
        + ("—" if a["agreement"] is None else f"{a['agreement']:.1%} (constant {a['constant']:.1%})")
        + f", n={a['pairs']} turns of {a['dialogues']} dialogues"
        + (f" ({unchecked} labelled turns not checked, left out)" if unchecked else ""),
        f"final emotion vs people's rating (mean PERM 1-5): Spearman ρ {interval_text(b, 'rho')}, "
        f"n={b['n']} dialogues",
        f"supporter pairs ordered alike by final emotion and by people: {interval_text(c, 'share', True)}, "
        f"n={c['pairs']} pairs" + (f" ({ties} tie{'s' if ties != 1 else ''} left out)" if ties else ""),
    ]  # fmt: skip
    if c["queries"]:
        lines.append(
            f"ranking over the {c['queries']} queries rated for every supporter: by final emotion "
            f"{' > '.join(c['by_final_emotion'])}; by people {' > '.join(c['by_people'])} "
            f"({'the same' if c['same'] else 'different'})"
        )
    left_out = not_scored_text(report)
    if left_out:
        lines.append(f"not scored: {left_out}")
    return lines


def run_dialogue_agreement(options, console) -> dict[str, Any]:
    """`personaemp agreement --dialogues A [--dialogues B]`: the figures, written to --out-dir
    (default: agreement/ beside the first file) and printed."""
    from rich.markup import escape

    from personaemp.io import write_json_atomic

    paths = [Path(p) for p in options.dialogues]
    labels = options.labels or paths[0].with_name(LABELS_FILE)
    if not labels.exists():
        raise InputError(f"{labels}: no labels", "label dialogues with `personaemp review --dialogues`")
    report = compute_dialogue_agreement(
        paths, labels, resamples=options.resamples, seed=options.bootstrap_seed
    )
    out = options.out or paths[0].with_name("agreement")
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / REPORT_FILE, report)
    for line in dialogue_agreement_lines(report):
        console.print(escape(line))
    console.print(f"wrote {escape(str(out / REPORT_FILE))}")
    return report
