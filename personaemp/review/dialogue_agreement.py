"""`personaemp agreement --dialogues`: people beside the simulator of gen-dialogues. People's
"in character?" against the simulator's check (kappa), the final emotion against people's
rating (Spearman), and whether both order the supporters alike."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from personaemp.errors import InputError
from personaemp.instruments.judges import spearman as judges_spearman
from personaemp.instruments.judges import wilson
from personaemp.records import DIMENSIONS
from personaemp.review.dialogues import LABELS_FILE, dialogue_event, read_dialogue_items
from personaemp.review.figures import (
    Bootstrap,
    _round,
    agreement_figures,
    confusion,
    labels_held,
    write_and_show,
)
from personaemp.review.page import UnknownTarget, current_labels, read_label_events
from personaemp.summaries import NOT_SCORED, interval_text, not_scored_text

DIALOGUE_REPORT_FILE = "dialogue_agreement.json"


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rho (instruments.judges.spearman); None with fewer than 3 pairs as well."""
    return None if len(xs) < 3 else judges_spearman(xs, ys)


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
    items = {item["item"]: item for item in read_dialogue_items(paths)}
    events = read_label_events(labels) if labels is not None and Path(labels).exists() else []
    state, not_scored = scored_dialogue_labels(current_labels(events), items)
    boot = Bootstrap(resamples, seed)
    report: dict[str, Any] = {
        "dialogues": len(items),
        "systems": sorted({item["system"] for item in items.values()}),
        "labels": labels_held(events, state, not_scored, "dialogues"),
        "resamples": resamples,
        "seed": seed,
    }

    # (a) people vs the in_character check, over kept turns and the rejected replies labelled
    clusters: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    not_checked = 0
    turns: set[tuple[str, str]] = set()
    reviewers: set[str] = set()
    for reviewer, fields_of in state.items():
        for key, fields in fields_of.items():
            for name, event in fields.items():
                if not name.startswith("character:"):
                    continue
                if "check" not in event:
                    not_checked += 1
                    continue
                turns.add((key, name))
                reviewers.add(str(reviewer))
                cell = confusion([(event["check"], event["value"] == "in")])
                clusters[key] = [x + y for x, y in zip(clusters[key], cell, strict=True)]
    figures = agreement_figures(dict(clusters), boot)
    figures["dialogues"] = figures.pop("queries")
    figures["labelled_not_checked"] = not_checked  # turns people labelled where the check did not run
    # n: the replies (turns) labelled, the reviewers apart; `pairs` is (reviewer, reply) pairs
    rejected = sum("." in name for _, name in turns)  # `character:<turn>.<k>`: a rejected reply
    figures.update(turns=len(turns), reviewers=len(reviewers), rejected_replies=rejected)
    why = cannot_measure(figures["confusion"])
    if why:  # kappa of a constant rater is 0 whatever the other says: it measures nothing
        figures.update(kappa=None, kappa_ci=None, not_measurable=why)
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


def cannot_measure(cells: Sequence[int]) -> str | None:
    """Why kappa of the check against people cannot be measured on this confusion (check,
    people), None when both vary. A kept reply always passed the check (a failing one is asked
    again), so over kept turns alone the check says "in" every time."""
    a, b, c, d = cells
    n = a + b + c + d
    if not n:
        return "no labelled reply the check ran on"
    if not (a + b) or not (c + d):
        said = "in" if a + b else "out"
        hint = "; label rejected replies too (the page's blind check)" if said == "in" else ""
        return f"the check said {said} character on all {n} labels (one value: kappa measures nothing){hint}"
    if not (a + c) or not (b + d):
        said = "in" if a + c else "out"
        return f"people said {said} on all {n} labels (one value: kappa measures nothing)"
    return None


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def dialogue_agreement_lines(report: dict[str, Any]) -> list[str]:
    """The three figures as the terminal (and the docs) show them, each with n and its rule."""
    a, b, c = report["in_character"], report["emotion_vs_people"], report["ranking"]
    unchecked = a["labelled_not_checked"]
    ties = c["ties"]
    reviewers = a.get("reviewers", 0)
    kappa = (
        f"κ not measurable: {a['not_measurable']}" if a.get("not_measurable")
        else f"κ {interval_text(a, 'kappa')}"
    )  # fmt: skip
    lines = [
        f"people vs the in_character check: {kappa}, agreement "
        + ("—" if a["agreement"] is None else f"{a['agreement']:.1%} (constant {a['constant']:.1%})")
        + f", n={a.get('turns', a['pairs'])} replies of {a['dialogues']} dialogues"
        + (f" ({a['rejected_replies']} of them rejected)" if a.get("rejected_replies") else "")
        + f", {reviewers} reviewer{'s' if reviewers != 1 else ''}, {a['pairs']} labels"
        + (f"; {unchecked} labels where the check did not run left out" if unchecked else ""),
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
    paths = [Path(p) for p in options.dialogues]
    labels = options.labels or paths[0].with_name(LABELS_FILE)
    if not labels.exists():
        raise InputError(f"{labels}: no labels", "label dialogues with `personaemp review --dialogues`")
    report = compute_dialogue_agreement(
        paths, labels, resamples=options.resamples, seed=options.bootstrap_seed
    )
    out = options.out or paths[0].with_name("agreement")
    write_and_show(report, out, DIALOGUE_REPORT_FILE, dialogue_agreement_lines(report), console)
    return report
