"""`personaemp agreement`: how far the LLM judge can be trusted, from people's labels and a
second judge.

For each LLM check (the judge's three judgments and its category reading):

- judge vs people: Cohen's kappa with a bootstrap 95% interval, raw agreement and what a
  constant answer would score, the confusion counts, the precision of what the judge
  passed (Wilson interval), and the judge's sensitivity and specificity against people;
- the corrected pass share: from the judge's pass share over every generated query and its
  error rates against people, the share that truly passes (Rogan-Gladen), with a bootstrap
  interval;
- people vs people where two reviewers labelled the same query;
- judge vs judge: the check step re-run on the same queries by a second judge (its own
  model and endpoint, `rejudge`), stored apart from the build.

A person's label of a check is a verdict: "agree" is the judge's verdict as the reviewer saw
it, "disagree" its opposite. Each (reviewer, query) is one pair; intervals resample queries,
so a query labelled by two reviewers counts once per resample, with both its pairs.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from personaemp.errors import InputError
from personaemp.instruments.judges import spearman as judges_spearman
from personaemp.instruments.judges import wilson
from personaemp.io import ErrorPolicy, iter_jsonl, write_json_atomic
from personaemp.records import DIMENSIONS
from personaemp.review.dialogues import LABELS_FILE, dialogue_event, read_dialogue_items
from personaemp.review.page import (
    LABEL_STUDIO_REVIEWER,
    LLM_CHECKS,
    UnknownTarget,
    current_labels,
    make_event,
    read_items,
    read_label_events,
)
from personaemp.summaries import NOT_SCORED, interval_text, judges_text, not_scored_text

REPORT_FILE, PLOT_FILE = "agreement.json", "agreement.png"


# --- the statistics ----------------------------------------------------------------------------


def confusion(pairs: Sequence[tuple[bool, bool]]) -> list[int]:
    """[both pass, first passes only, second passes only, both fail] of (first, second) pairs."""
    cells = [0, 0, 0, 0]
    for first, second in pairs:
        cells[(0 if second else 1) if first else (2 if second else 3)] += 1
    return cells


def kappa_of(cells: Sequence[float]) -> float | None:
    """Cohen's kappa of a 2x2 confusion; None when chance agreement is total (one answer only)."""
    a, b, c, d = cells
    n = a + b + c + d
    if not n:
        return None
    observed = (a + d) / n
    chance = ((a + b) * (a + c) + (c + d) * (b + d)) / (n * n)
    return None if chance >= 1 else (observed - chance) / (1 - chance)


def rogan_gladen(apparent: float, sensitivity: float, specificity: float) -> float | None:
    """The true share from an apparent one and the test's error rates (clipped to [0, 1]);
    None when the judge does no better than chance (Se + Sp <= 1)."""
    youden = sensitivity + specificity - 1
    if youden <= 0:
        return None
    return min(1.0, max(0.0, (apparent + specificity - 1) / youden))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


class Bootstrap:
    """Percentile intervals from resampling clusters (queries) with replacement."""

    def __init__(self, resamples: int, seed: int):
        import numpy as np

        self.np, self.resamples, self.rng = np, resamples, np.random.default_rng(seed)

    def cells(self, clusters: Sequence[Sequence[int]]):
        """(resamples, 4) confusion counts of resampled clusters, each a confusion of its own."""
        counts = self.np.asarray(clusters, dtype=float).reshape(-1, 4)
        picks = self.rng.integers(0, len(counts), size=(self.resamples, len(counts)))
        return counts[picks].sum(axis=1)

    def interval(self, values) -> list[float] | None:
        values = self.np.asarray(values, dtype=float)
        values = values[~self.np.isnan(values)]
        if len(values) < self.resamples / 2:  # mostly undefined: no honest interval
            return None
        low, high = self.np.percentile(values, [2.5, 97.5])
        return [round(float(low), 4), round(float(high), 4)]

    def kappa(self, cells):
        np = self.np
        a, b, c, d = cells.T
        n = a + b + c + d
        with np.errstate(divide="ignore", invalid="ignore"):
            observed = (a + d) / n
            chance = ((a + b) * (a + c) + (c + d) * (b + d)) / (n * n)
            return np.where(chance < 1, (observed - chance) / (1 - chance), np.nan)


def agreement_figures(clusters: dict[str, list[int]], boot: Bootstrap) -> dict[str, Any]:
    """Kappa (with interval), raw agreement and a constant answer's score, of the pairs
    grouped per query (`clusters`: query -> confusion). Pairs: (reference, other)."""
    cells = [sum(column) for column in zip(*clusters.values(), strict=True)] if clusters else [0, 0, 0, 0]
    n = sum(cells)
    passes = cells[0] + cells[2]  # the second's pass answers
    figures: dict[str, Any] = {"pairs": n, "queries": len(clusters), "confusion": cells}
    if not n:
        return {**figures, "kappa": None, "kappa_ci": None, "agreement": None, "constant": None}
    figures["kappa"] = _round(kappa_of(cells))
    # resampled in query order: the figures follow from the seed alone, never from hash order
    figures["kappa_ci"] = boot.interval(boot.kappa(boot.cells([clusters[q] for q in sorted(clusters)])))
    figures["agreement"] = round((cells[0] + cells[3]) / n, 4)
    # always answering what the second (people) says most often
    figures["constant"] = round(max(passes, n - passes) / n, 4)
    return figures


# --- from the files ----------------------------------------------------------------------------


def human_verdict(event: dict[str, Any]) -> bool | None:
    """What a reviewer says of a check: the verdict they saw if they agreed, else its opposite."""
    judge = event.get("judge")
    if not isinstance(judge, bool) or event.get("value") not in ("agree", "disagree"):
        return None
    return judge if event["value"] == "agree" else not judge


def read_second_judge(path: Path) -> tuple[dict[str, dict[str, Any]], str | None]:
    """query_id -> the second judge's checks, and its model."""
    verdicts, model = {}, None
    for _, _, row in iter_jsonl(path, ErrorPolicy("fail")):
        model = model or (row.get("provenance") or {}).get("model")
        for query in row.get("queries") or []:
            verdicts[query["query_id"]] = query["checks"]
    return verdicts, model


def labels_held(events, state: dict, not_scored, items: str) -> dict[str, Any]:
    """What the labels file held, for a report: its events, reviewers and `items` labelled
    (queries or dialogues), the reviewers who came from Label Studio, what was not scored."""
    return {
        "events": len(events),
        "reviewers": sorted(state),
        f"{items}_labelled": len({key for labelled in state.values() for key in labelled}),
        "label_studio_reviewers": sum(name.startswith(LABEL_STUDIO_REVIEWER) for name in state),
        "not_scored": not_scored,
    }


class AgreementReport(dict):
    """The figures (a JSON-ready dict), with `as_dict()` as every command's result has."""

    def as_dict(self) -> dict[str, Any]:
        return dict(self)


def compute_agreement(
    queries: Path,
    labels: Path | None,
    second_judge: Path | None = None,
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Every figure of the module docstring, as a JSON-ready dict."""
    items = {item["query_id"]: item for item in read_items(Path(queries))}
    events = read_label_events(labels) if labels is not None and Path(labels).exists() else []
    state, not_scored = scored_labels(current_labels(events), items)
    boot = Bootstrap(resamples, seed)
    report = AgreementReport(
        {
            "queries": len(items),
            "labels": labels_held(events, state, not_scored, "queries"),
            "resamples": resamples,
            "seed": seed,
        }
    )

    judge_people: dict[str, Any] = {}
    for check in LLM_CHECKS:
        clusters: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        for queries_labels in state.values():
            for query_id, fields in queries_labels.items():
                item, event = items.get(query_id), fields.get(f"check:{check}")
                truth = human_verdict(event) if event else None
                if item is None or truth is None or check not in item["checks"]:
                    continue
                cell = confusion([(item["checks"][check], truth)])
                clusters[query_id] = [x + y for x, y in zip(clusters[query_id], cell, strict=True)]
        figures = agreement_figures(dict(clusters), boot)
        a, b, c, d = figures["confusion"]
        figures["precision"] = _round(a / (a + b)) if a + b else None  # of what the judge passed
        figures["precision_ci"] = wilson(a, a + b)
        sensitivity = a / (a + c) if a + c else None
        specificity = d / (b + d) if b + d else None
        figures["sensitivity"], figures["specificity"] = _round(sensitivity), _round(specificity)
        verdicts = [item["checks"][check] for item in items.values() if check in item["checks"]]
        apparent = sum(verdicts) / len(verdicts) if verdicts else None
        figures["judged"] = len(verdicts)
        figures["apparent_pass"] = _round(apparent)
        corrected, interval = None, None
        if apparent is not None and sensitivity is not None and specificity is not None:
            corrected = rogan_gladen(apparent, sensitivity, specificity)
            ordered = [clusters[q] for q in sorted(clusters)]
            interval = _corrected_interval(boot, ordered, apparent, len(verdicts))
        figures["corrected_pass"], figures["corrected_pass_ci"] = _round(corrected), interval
        judge_people[check] = figures
    report["judge_vs_people"] = judge_people

    # the build's acceptance against people's accept/reject
    clusters = defaultdict(lambda: [0, 0, 0, 0])
    for queries_labels in state.values():
        for query_id, fields in queries_labels.items():
            event = fields.get("query")
            if query_id in items and event and event.get("value") in ("accept", "reject"):
                cell = confusion([(items[query_id]["accepted"], event["value"] == "accept")])
                clusters[query_id] = [x + y for x, y in zip(clusters[query_id], cell, strict=True)]
    acceptance = agreement_figures(dict(clusters), boot)
    a, b = acceptance["confusion"][:2]
    acceptance["precision"] = _round(a / (a + b)) if a + b else None  # accepted set people accept
    acceptance["precision_ci"] = wilson(a, a + b)
    report["acceptance"] = acceptance

    report["people_vs_people"] = _people_vs_people(state, items, boot)

    traits: dict[tuple[str, str, str], bool] = {}
    for reviewer, queries_labels in state.items():
        for query_id, fields in queries_labels.items():
            item = items.get(query_id)
            for name, event in fields.items():
                if item and name.startswith("trait:") and event.get("value") in ("supported", "unsupported"):
                    # a user's trait shows with each of their queries: counted once per reviewer
                    key = (reviewer, item["user_id"], name)
                    traits[key] = event["value"] == "supported"
    supported = sum(traits.values())
    report["traits"] = {
        "labelled": len(traits),
        "supported": supported,
        "share": _round(supported / len(traits)) if traits else None,
        "share_ci": wilson(supported, len(traits)),
    }

    report["judge_vs_judge"] = None
    if second_judge is not None and Path(second_judge).exists():
        verdicts, model = read_second_judge(Path(second_judge))
        checks = {}
        for check in LLM_CHECKS:
            clusters = {
                query_id: confusion([(items[query_id]["checks"][check], theirs[check])])
                for query_id, theirs in verdicts.items()
                if query_id in items
                and isinstance(theirs.get(check), bool)
                and check in items[query_id]["checks"]
            }
            checks[check] = agreement_figures(clusters, boot)
        report["judge_vs_judge"] = {"model": model, "queries": len(verdicts), "checks": checks}
    return report


def scored_labels(state, items: dict[str, dict[str, Any]]):
    """The current labels the figures count, and how many were left out by reason
    (NOT_SCORED): each is checked as the page checks a click, against this build's queries."""
    kept: dict[str, dict[str, dict[str, Any]]] = {}
    left_out = dict.fromkeys(NOT_SCORED, 0)
    for reviewer, queries_labels in state.items():
        for query_id, fields in queries_labels.items():
            for name, event in fields.items():
                body = {"reviewer": reviewer, "query_id": query_id, "field": name}
                try:
                    make_event({**body, "value": event.get("value")}, items, "-")
                except UnknownTarget:
                    left_out["unknown_target"] += 1
                    continue
                except InputError:
                    left_out["unknown_query" if query_id not in items else "invalid"] += 1
                    continue
                kept.setdefault(reviewer, {}).setdefault(query_id, {})[name] = event
    return kept, left_out


def _corrected_interval(boot: Bootstrap, clusters, apparent: float, judged: int) -> list[float] | None:
    """The Rogan-Gladen share's interval: the judge's error rates resampled from the labelled
    queries, its apparent pass share from all the queries it judged."""
    np = boot.np
    if not clusters:
        return None
    cells = boot.cells(clusters)
    a, b, c, d = cells.T
    shares = boot.rng.binomial(judged, apparent, size=boot.resamples) / judged
    with np.errstate(divide="ignore", invalid="ignore"):
        youden = a / (a + c) + d / (b + d) - 1
        corrected = np.where(youden > 0, np.clip((shares + d / (b + d) - 1) / youden, 0, 1), np.nan)
    return boot.interval(corrected)


def _people_vs_people(state, items, boot: Bootstrap) -> dict[str, Any]:
    """Per field kind, two reviewers' answers on the queries both labelled (every pair of
    reviewers pooled): accept/reject, each LLM check's verdict, traits supported."""
    kinds: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0, 0]))
    pairs = []
    for first, second in itertools.combinations(sorted(state), 2):
        shared = sorted(set(state[first]) & set(state[second]) & set(items))
        if shared:
            pairs.append([first, second])
        for query_id in shared:
            for name in sorted(set(state[first][query_id]) & set(state[second][query_id])):
                answers = [_answer(state[r][query_id][name]) for r in (first, second)]
                if None in answers or name == "note":
                    continue
                kind = "traits" if name.startswith("trait:") else name.removeprefix("check:")
                cell = confusion([tuple(answers)])
                counts = kinds[kind][query_id]
                kinds[kind][query_id] = [x + y for x, y in zip(counts, cell, strict=True)]
    order = ["query", *LLM_CHECKS, "traits"]
    return {
        "reviewer_pairs": pairs,
        "fields": {kind: agreement_figures(dict(kinds[kind]), boot) for kind in order if kind in kinds},
    }


def _answer(event: dict[str, Any]) -> bool | None:
    value = event.get("value")
    if value in ("accept", "supported"):
        return True
    if value in ("reject", "unsupported"):
        return False
    return human_verdict(event)


# --- dialogues (review --dialogues): people beside the simulator ------------------------------

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

    paths = [Path(p) for p in options.dialogues]
    labels = options.labels or paths[0].with_name(LABELS_FILE)
    if not labels.exists():
        raise InputError(f"{labels}: no labels", "label dialogues with `personaemp review --dialogues`")
    report = compute_dialogue_agreement(
        paths, labels, resamples=options.resamples, seed=options.bootstrap_seed
    )
    out = options.out or paths[0].with_name("agreement")
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / DIALOGUE_REPORT_FILE, report)
    for line in dialogue_agreement_lines(report):
        console.print(escape(line))
    console.print(f"wrote {escape(str(out / DIALOGUE_REPORT_FILE))}")
    return report


# --- fidelity (review --fidelity): people beside the LLM discriminator --------------------------


def fidelity_agreement(path: Path, labels: Path) -> dict[str, Any]:
    """review/fidelity.py's figures from a fidelity file and the labels people wrote on it."""
    from personaemp.review.fidelity import fidelity_figures

    if not Path(labels).exists():
        raise InputError(f"{labels}: no labels", "label pairs with `personaemp review --fidelity`")
    rows = {row["cut_id"]: row for _, _, row in iter_jsonl(Path(path), ErrorPolicy("fail"))}
    return fidelity_figures(rows, current_labels(read_label_events(Path(labels))), Path(labels))


def run_fidelity_agreement(options, console) -> dict[str, Any]:
    """`personaemp agreement --fidelity FILE`: the figures, written to --out-dir (default:
    agreement/ beside the file) and printed."""
    from rich.markup import escape

    from personaemp.review.fidelity import LABELS_FILE as FIDELITY_LABELS
    from personaemp.review.fidelity import REPORT_FILE as FIDELITY_REPORT
    from personaemp.review.fidelity import agreement_lines

    path = Path(options.fidelity)
    report = fidelity_agreement(path, options.labels or path.with_name(FIDELITY_LABELS))
    out = options.out or path.with_name("agreement")
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / FIDELITY_REPORT, report)
    for line in agreement_lines(report):
        console.print(escape(line))
    console.print(f"wrote {escape(str(out / FIDELITY_REPORT))}")
    return report


# --- the second judge --------------------------------------------------------------------------

STAGE = "second-judge"


def rejudge(queries: Path, output: Path, settings, console=None):
    """Run the check step of gen-queries again, with `settings`' model and endpoint, on every
    generated query of `queries`; one row per user in `output` (apart from the build), with
    each query's checks as that judge and the deterministic checks make them. Resumable and
    cached like every LLM stage. Returns the stage report."""
    from personaemp.instruments.query_check import CHECK
    from personaemp.io import read_stage_rows
    from personaemp.llm.stage import LLMStage, run_stage
    from personaemp.prompts import load_prompt
    from personaemp.records import Persona

    rows, _ = read_stage_rows(Path(queries), Persona, kind="queries")
    prompt = load_prompt(CHECK.prompt)

    def make_work(engine):
        async def work(row: dict) -> dict:
            return await judge_again(engine, row, prompt)

        return work

    plan = LLMStage(
        STAGE, rows, make_work, "user_id", Path(output),
        fingerprint=lambda engine: engine.fingerprint(CHECK, prompt.hash),
        steps=(CHECK,), input_path=Path(queries),
    )  # fmt: skip
    return run_stage(plan, settings=settings, console=console)


async def judge_again(engine, row: dict, prompt) -> dict:
    """One user's generated queries through the existing check step (stages/queries.py)."""
    from personaemp import checks
    from personaemp.instruments.query_check import (
        CHECK,
        SituationReply,
        build_check_messages,
        judge_checks,
        reviews_schema,
    )
    from personaemp.records import Persona

    persona = Persona.model_validate(row)
    generated = list(row.get("queries") or []) + list(row.get("rejected_queries") or [])
    out: dict[str, Any] = {"user_id": row["user_id"], "queries": []}
    if not generated:
        return out
    situations = [
        SituationReply.model_construct(
            category=query["category"],
            topic=(query.get("situation") or {}).get("topic", ""),
            text=(query.get("situation") or {}).get("text", ""),
            memory_ids=(query.get("situation") or {}).get("memory_ids") or query.get("memory_ids") or [],
            message=query["query"],
        )
        for query in generated
    ]
    texts = [query["query"] for query in generated]
    reply = await engine.call(
        CHECK, build_check_messages(persona, situations, texts, prompt), schema=reviews_schema(len(texts))
    )
    reviews = {}
    for review in reply.value.reviews:
        reviews.setdefault(review.message, review)
    repeats = checks.duplicates(texts)
    for index, (query, situation, text) in enumerate(zip(generated, situations, texts, strict=True)):
        repeat = repeats.get(index)
        result = judge_checks(
            persona, situation, text, reviews.get(index + 1), None if repeat is None else repeat + 1
        )
        out["queries"].append({"query_id": query["query_id"], "checks": result.model_dump(mode="json")})
    out["provenance"] = engine.provenance({"check": prompt.hash}).model_dump(mode="json")
    return out


# --- the report, its plot and the card ---------------------------------------------------------


def write_agreement(report: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / REPORT_FILE, report)
    (out / PLOT_FILE).write_bytes(plot_agreement(report))
    return [out / REPORT_FILE, out / PLOT_FILE]


def plot_agreement(report: dict[str, Any]) -> bytes:
    """Kappa per LLM check (judge vs people, people vs people, judge vs judge) with intervals,
    raw agreement and a constant answer beside them; the judge's and the corrected pass shares."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    checks = list(LLM_CHECKS)
    series = [
        ("judge vs people", report["judge_vs_people"]),
        ("people vs people", (report["people_vs_people"] or {}).get("fields", {})),
        ("judge vs judge", (report["judge_vs_judge"] or {}).get("checks", {})),
    ]
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(12, 5.2), width_ratios=[1.4, 1])
    width = 0.26
    for offset, (name, data) in enumerate(series):
        xs, values, lows, highs, raws, constants = [], [], [], [], [], []
        for i, check in enumerate(checks):
            figures = data.get(check) or {}
            if figures.get("kappa") is None:
                continue
            x = i + (offset - 1) * width
            interval = figures.get("kappa_ci") or [figures["kappa"], figures["kappa"]]
            xs.append(x)
            values.append(figures["kappa"])
            lows.append(figures["kappa"] - interval[0])
            highs.append(interval[1] - figures["kappa"])
            raws.append(figures["agreement"])
            constants.append(figures["constant"])
        if xs:
            left.bar(xs, values, width, yerr=[lows, highs], capsize=3, label=f"{name}: kappa (95% CI)")
            left.scatter(xs, raws, marker="o", color="black", zorder=3, s=14)
            left.scatter(xs, constants, marker="_", color="red", zorder=3, s=120)
    left.scatter([], [], marker="o", color="black", s=14, label="raw agreement")
    left.scatter([], [], marker="_", color="red", s=120, label="a constant answer's agreement")
    left.axhline(0, color="grey", linewidth=0.8)
    left.set_xticks(range(len(checks)), [c.replace("_", "\n") for c in checks], fontsize=8)
    left.set_ylim(-1, 1.05)
    left.set_title("Agreement per LLM check")
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)

    judged = report["judge_vs_people"]
    xs = range(len(checks))
    apparent = [judged[c]["apparent_pass"] or 0 for c in checks]
    corrected = [judged[c]["corrected_pass"] for c in checks]
    right.bar([x - 0.2 for x in xs], apparent, 0.4, label="judge's pass share")
    shown = [(x, v, judged[c]["corrected_pass_ci"]) for x, v, c in zip(xs, corrected, checks, strict=True)]
    shown = [(x, v, ci or [v, v]) for x, v, ci in shown if v is not None]
    if shown:
        right.bar(
            [x + 0.2 for x, _, _ in shown], [v for _, v, _ in shown], 0.4,
            yerr=[[v - ci[0] for _, v, ci in shown], [ci[1] - v for _, v, ci in shown]], capsize=3,
            label="corrected by people's labels (Rogan-Gladen, 95% CI)",
        )  # fmt: skip
    right.set_xticks(list(xs), [c.replace("_", "\n") for c in checks], fontsize=8)
    right.set_ylim(0, 1.05)
    right.set_title("Share of queries that pass")
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    pyplot.close(figure)
    return buffer.getvalue()


def agreement_table(report: dict[str, Any], console) -> None:
    from rich.table import Table

    table = Table(title="judge vs people, per LLM check")
    for name in ("check", "pairs", "κ [95% CI]", "agreement", "constant", "precision [95% CI]",
                 "judge pass", "corrected [95% CI]", "judge vs judge κ"):  # fmt: skip
        table.add_column(name)
    second = (report.get("judge_vs_judge") or {}).get("checks") or {}
    for check, f in report["judge_vs_people"].items():
        table.add_row(
            check, str(f["pairs"]), interval_text(f, "kappa"),
            "—" if f["agreement"] is None else f"{f['agreement']:.1%}",
            "—" if f["constant"] is None else f"{f['constant']:.1%}",
            interval_text(f, "precision", True),
            "—" if f["apparent_pass"] is None else f"{f['apparent_pass']:.1%}",
            interval_text(f, "corrected_pass", True),
            judges_text(second.get(check) or {}),
        )  # fmt: skip
    console.print(table)
    people = (report.get("people_vs_people") or {}).get("fields") or {}
    for kind, f in people.items():
        console.print(f"people vs people, {kind}: κ {interval_text(f, 'kappa')}, agreement "
                      f"{f['agreement']:.1%} (constant {f['constant']:.1%}), n={f['pairs']}")  # fmt: skip
    acceptance, traits = report["acceptance"], report["traits"]
    if acceptance["pairs"]:
        console.print(f"accepted queries people accept: {interval_text(acceptance, 'precision', True)}; "
                      f"acceptance κ {interval_text(acceptance, 'kappa')}")  # fmt: skip
    if traits["labelled"]:
        console.print(f"traits supported: {interval_text(traits, 'share', True)} of {traits['labelled']}")
    left_out = not_scored_text(report)
    if left_out:
        console.print(f"[yellow]not scored: {left_out}[/]")


def card_quality(queries: Path | None) -> tuple[dict[str, Any] | None, bytes | None]:
    """For the card: the agreement report and plot of a build whose labels (and second
    judge) sit beside its queries at their default names; (None, None) without labels."""
    if queries is None:
        return None, None
    labels, second = Path(queries).with_name("labels.jsonl"), Path(queries).with_name("second_judge.jsonl")
    if not labels.exists():
        return None, None
    report = compute_agreement(queries, labels, second if second.exists() else None)
    if not report["labels"]["events"]:
        return None, None
    return report, plot_agreement(report)


def run_agreement(options, settings, console) -> dict[str, Any]:
    """`personaemp agreement` (AgreementOptions, and the [llm] options as LLMSettings): the
    second judge first when --judge-model is given, then the figures, written to --out and
    printed."""
    import dataclasses

    from rich.markup import escape

    if options.dialogues:
        return run_dialogue_agreement(options, console)
    if getattr(options, "fidelity", None):
        return run_fidelity_agreement(options, console)
    labels, second_judge, out = options.paths()
    if options.judge_model:
        from personaemp.summaries import print_stage_report

        urls = list(options.judge_base_url or settings.base_urls)
        second = dataclasses.replace(settings, model=options.judge_model, base_urls=urls)
        report = rejudge(options.input, second_judge, second, console)
        print_stage_report(report, console)
    if not labels.exists() and not second_judge.exists():
        raise InputError(
            f"{labels}: no labels, and no second judge at {second_judge}",
            "label queries with `personaemp review`, or give --judge-model",
        )
    report = compute_agreement(
        options.input, labels, second_judge, resamples=options.resamples, seed=options.bootstrap_seed
    )
    paths = write_agreement(report, out)
    agreement_table(report, console)
    console.print(f"wrote {escape(', '.join(str(p) for p in paths))}")
    return report


# --- from options (the command and pe.*) ----------------------------------------------------------


async def from_options(options, console, settings, retry=False):
    """`personaemp agreement` on its options."""
    return run_agreement(options, settings, console)
