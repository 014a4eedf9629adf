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
from pathlib import Path
from typing import Any

from personaemp.errors import InputError
from personaemp.instruments.judges import wilson
from personaemp.io import ErrorPolicy, iter_jsonl, write_json_atomic
from personaemp.review.dialogue_agreement import (  # noqa: F401  (their old home: still importable from here)
    DIALOGUE_REPORT_FILE,
    compute_dialogue_agreement,
    dialogue_agreement_lines,
    run_dialogue_agreement,
    spearman,
)
from personaemp.review.figures import (
    Bootstrap,
    _round,
    agreement_figures,
    confusion,
    labels_held,
    rogan_gladen,
    write_and_show,
)
from personaemp.review.figures import (
    kappa_of as kappa_of,  # its old home: still importable from here
)
from personaemp.review.page import (
    LLM_CHECKS,
    UnknownTarget,
    current_labels,
    make_event,
    read_items,
    read_label_events,
)
from personaemp.summaries import NOT_SCORED, interval_text, judges_text, not_scored_text

REPORT_FILE, PLOT_FILE = "agreement.json", "agreement.png"


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


# --- the second judge --------------------------------------------------------------------------

STAGE = "second-judge"


def rejudge(queries: Path, output: Path, settings, console=None):
    """Run the check step of gen-queries again, with `settings`' model and endpoint, on every
    generated query of `queries`; one row per user in `output` (apart from the build), with
    each query's checks as that judge and the deterministic checks make them. Resumable and
    cached like every LLM stage. Returns the stage report."""
    from personaemp.instruments.query_check import CHECK
    from personaemp.io import read_stage_rows
    from personaemp.llm.stage import LLMStage, run_llm_stage
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
    return run_llm_stage(plan, settings=settings, console=console)


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
    from personaemp.review.fidelity import LABELS_FILE as FIDELITY_LABELS
    from personaemp.review.fidelity import REPORT_FILE as FIDELITY_REPORT
    from personaemp.review.fidelity import agreement_lines

    path = Path(options.fidelity)
    report = fidelity_agreement(path, options.labels or path.with_name(FIDELITY_LABELS))
    out = options.out or path.with_name("agreement")
    write_and_show(report, out, FIDELITY_REPORT, agreement_lines(report), console)
    return report


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
