"""`personaemp evaluate`'s tables on the terminal: systems side by side per PERM dimension
(and, for --dialogues, the emotion trajectory), what the command prints after the stage."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def print_sessions(evaluation: dict, console: Console) -> None:
    """`evaluate --dialogues`: systems side by side, the trajectory then PERM over the session."""
    from personaemp.records import DIMENSIONS

    table = Table(
        title=f"evaluate --dialogues · {evaluation['split']}/{evaluation['part']} · judge "
        f"{evaluation['judge_model']} ({evaluation['mode']})",
        title_justify="left",
    )
    table.add_column("")
    entries = list(evaluation["systems"].values())
    for name in evaluation["systems"]:
        table.add_column(escape(name), justify="right")

    def number(value, digits: int = 2) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    rows = [
        ("dialogues", lambda e: str(e.get("dialogues", 0))),
        ("queries without one", lambda e: str(e.get("queries_without_dialogue", 0))),
        # as `table` says it: a dialogue left out because another system has none of its query
        (
            "left out: another system lacks it",
            lambda e: str(sum(d["reason"].startswith("not every system") for d in e.get("left_out") or ())),
        ),
        ("n (scored)", lambda e: str(e.get("n", 0))),
        ("initial emotion", lambda e: number(e.get("initial_emotion"), 1)),
        ("final emotion", lambda e: number(e.get("final_emotion"), 1)),
        ("need met (share)", lambda e: number(e.get("need_met_share"), 3)),
        ("need met at turn", lambda e: number(e.get("need_met_at_turn"), 1)),
        ("supporter turns", lambda e: number(e.get("supporter_turns"), 1)),
        *((d, lambda e, d=d: number((e.get("dimensions") or {}).get(d))) for d in DIMENSIONS),
        ("H (0-1)", lambda e: number(e.get("harmonic"), 3)),
    ]
    if evaluation.get("behaviours"):  # the behaviour judge: per 1,000 words, tracking, reward
        rows += [
            ("tracking (share)", lambda e: number(e.get("tracking_rate"), 3)),
            ("risky / 1k words", lambda e: number(e.get("risky_per_1k"))),
            ("protective / 1k words", lambda e: number(e.get("protective_per_1k"))),
            ("quotes dropped", lambda e: str((e.get("behaviours") or {}).get("dropped_quotes", 0))),
            ("reward (safety)", lambda e: number(e.get("reward"), 3)),
        ]
    for label, value in rows:
        table.add_row(label, *(value(entry) for entry in entries))
    console.print(table)
    for supporter, styles in ((evaluation.get("seekers") or {}).get("supporters") or {}).items():
        for style, found in styles.items():
            drop = (found.get("drop") or {}).get("final_emotion") or {}
            if drop.get("mean") is not None:
                console.print(
                    f"{escape(supporter)} · {style}: final emotion {drop['mean']:+.1f} from cooperative "
                    f"[{drop['low']:+.1f}, {drop['high']:+.1f}] (n={drop['n']}, paired bootstrap 95%)"
                )


def print_evaluation(evaluation: dict, console: Console) -> None:
    """Systems side by side (with a panel, each judge's columns side by side): counts, each
    dimension, Avg and H beside it (and B, reward), then Avg by query category and by each
    Big Five level; then how far the judges agree."""
    from personaemp.records import BIG_FIVE, DIMENSIONS

    if evaluation.get("kind") == "dialogues":
        print_sessions(evaluation, console)
        return
    judges = evaluation.get("judges") or {
        evaluation["judge_model"]: {
            "systems": evaluation["systems"],
            "judge_model": evaluation["judge_model"],
        }
    }
    columns = [
        (f"{judge} · {system}" if len(judges) > 1 else system, entry)
        for judge, found in judges.items()
        for system, entry in found["systems"].items()
    ]
    models = ", ".join(f"{name} ({found['judge_model']})" for name, found in judges.items())
    shown = models if len(judges) > 1 else evaluation["judge_model"]
    title = (
        f"evaluate · {evaluation['split']}/{evaluation['part']} · judge {shown} "
        f"({evaluation['mode']}; missing: {evaluation.get('missing_rule', 'floor')})"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("")
    for name, _ in columns:
        table.add_column(escape(name), justify="right")
    entries = [entry for _, entry in columns]

    def row(label: str, value) -> None:
        table.add_row(label, *(value(entry) for entry in entries))

    def number(value, digits: int = 2) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    for field, label in (("queries", "queries"), ("judged", "judged"), ("missing", "missing"),
                         ("empty", "empty"), ("truncated", "cut (judged as seen)"),
                         ("cut_in_reasoning", "cut while reasoning"), ("unparsed", "unparsed"),
                         ("n", "n (scored)")):  # fmt: skip
        row(label, lambda entry, field=field: str(entry.get(field, 0)))
    for dimension in DIMENSIONS:
        row(dimension, lambda e, d=dimension: number(e.get("dimensions", {}).get(d)))
    row("Avg", lambda e: number(e.get("avg")))
    row("H (0-1)", lambda e: number(e.get("harmonic"), 3))
    if any("bystander" in entry for entry in entries):
        row("bystander B", lambda e: number(e.get("bystander"), 3))
        row(f"reward (λ={evaluation['lambda']:g})", lambda e: number(e.get("reward"), 3))
    categories = sorted({c for entry in entries for c in entry.get("by_category", {})})
    for category in categories:
        row(f"Avg · {category}", lambda e, c=category: _avg_n(e.get("by_category", {}).get(c)))
    for trait in BIG_FIVE:
        for level in ("low", "medium", "high"):
            cells = [_avg_n(e["by_big_five"][trait][level]) for e in entries]
            if any(cell != "—" for cell in cells):
                table.add_row(f"Avg · {trait} {level}", *cells)
    console.print(table)
    for pair, found in (evaluation.get("agreement") or {}).items():
        tau = found["kendall_tau_systems"]
        rho = found["spearman_per_query"]
        console.print(
            f"agreement {escape(pair)}: Kendall's τ over {found['systems']} systems (Avg) "
            f"{number(tau['avg'])}, H {number(tau['harmonic'])}; per-query rank correlation over "
            f"{found['responses']} responses: " + ", ".join(f"{d} {number(rho[d])}" for d in DIMENSIONS)
        )
    for name, entry in evaluation["systems"].items():
        if entry.get("unknown_query_ids"):
            console.print(
                f"[yellow]{escape(name)}:[/] {entry['unknown_query_ids']} responses to queries not in "
                f"this split, e.g. {escape(entry['unknown_examples'][0])}"
            )
        if entry.get("blank_lines"):
            console.print(
                f"[yellow]{escape(name)}:[/] blank lines skipped: {escape(', '.join(entry['blank_lines']))}"
            )
    console.print(f"wrote {evaluation['scores_file']} and the report beside it")


def _avg_n(metrics: dict | None) -> str:
    if not metrics or not metrics.get("n"):
        return "—"
    return f"{metrics['avg']:.2f} (n={metrics['n']})"
