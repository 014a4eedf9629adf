"""Rich terminal summaries printed by the CLI after each stage."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from personaemp.errors import InputError
from personaemp.io import ErrorPolicy, iter_jsonl


def print_filter_summary(report, console: Console) -> None:
    if report.unchanged_since:  # skipped (personaemp.freshness): its one line
        return console.print(report.unchanged_since)
    funnel = Table(title="filter funnel", title_justify="left")
    funnel.add_column("step")
    funnel.add_column("users", justify="right")
    funnel.add_row("users read", str(report.users_in))
    for gate, count in report.dropped.items():
        funnel.add_row(f"  dropped by {gate}", str(count))
    funnel.add_row("[bold]kept[/]", f"[bold]{report.kept}[/]")
    console.print(funnel)
    console.print(
        f"bad rows skipped: {report.bad_rows_skipped} · users without intents (passed the "
        f"intent gate): {report.users_without_intents} · flagged false memories dropped: "
        f"{report.flagged_memories_dropped} of {report.memories_in}"
    )
    if report.top_labels_kept:
        labels = Table(title="most frequent matched labels", title_justify="left")
        labels.add_column("label")
        labels.add_column("memories", justify="right")
        for label, count in report.top_labels_kept.items():
            labels.add_row(label, str(count))
        console.print(labels)
    if report.nobody_kept:
        console.print(f"[yellow]{escape(report.nobody_kept)}[/]")
    console.print(f"wrote {report.output}")


def print_stage_report(report, console: Console) -> None:
    """The run report of an LLM stage: outcome, then per-step requests, cache, tokens."""
    if report.estimate is not None:
        print_estimate(report, console)
        return
    if waits_for_a_batch(report):
        print_batch_round(report, console)
        return
    outcome = report.outcome
    console.print(
        f"[bold]{report.stage}[/]: {outcome.units} units = {outcome.done} done + "
        f"{outcome.done_before} done earlier + {outcome.failed} failed + {outcome.failed_before} "
        f"failed earlier (content failures, kept; --retry-failed asks again)"
    )
    table = Table(title=f"{report.stage} · {report.model} ({report.endpoint_kind})", title_justify="left")
    columns = {
        "calls": "calls", "requests": "sent", "cache_hits": "cached", "retries": "retry",
        "reasks": "re-ask", "cut_replies": "cut", "prompt_tokens": "tok in",
        "completion_tokens": "tok out", "reasoning_tokens": "of them think",
    }  # fmt: skip
    if any(stats.get("cached_tokens") for stats in report.steps.values()):
        # The provider's prefix cache (billed at --price-cached), not the reply cache.
        columns = {**dict(list(columns.items())[:7]), "cached_tokens": "of them prefix-cached",
                   **dict(list(columns.items())[7:])}  # fmt: skip
    table.add_column("step")
    for title in columns.values():
        table.add_column(title, justify="right")
    for name, stats in report.steps.items():
        table.add_row(name, *(str(stats.get(field, 0)) for field in columns))
    console.print(table)
    timings = [
        f"{name} {stats['seconds'] / stats['answered']:.1f}/{stats['slowest']:.1f} s, "
        f"{stats['completion_tokens'] / stats['seconds']:.0f} tok/s"
        for name, stats in report.steps.items()
        if stats.get("answered") and stats.get("seconds")
    ]
    if timings:
        console.print("answer time per request (mean/max): " + " · ".join(timings))
    structured = report.structured
    if structured:
        refused = "; refused " + " | ".join(structured["refused"]) if structured.get("refused") else ""
        console.print(
            f"structured output: {structured['configured']} -> {structured['used']} "
            f"({structured['decided_by']}){escape(refused)}"
        )
    cut_thinking = sum(stats.get("cut_in_reasoning", 0) for stats in report.steps.values())
    if cut_thinking:
        console.print(
            f"{cut_thinking} replies were cut while reasoning (re-asked with twice the budget): "
            "raise --max-tokens for this model"
        )
    if outcome.failures_by_kind:
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(outcome.failures_by_kind.items()))
        console.print(f"failures by kind: {kinds} · see {report.failures}")
    if report.temperatures:
        console.print(
            "temperature: " + ", ".join(f"{name} {value:g}" for name, value in report.temperatures.items())
        )
    for note in report.notes.values():
        console.print(escape(note["text"]))
    cost = f" · cost {report.cost:.4f}" if report.cost is not None else ""
    console.print(f"wall time {report.wall_seconds:.1f} s{cost} · wrote {report.output}")


def print_persona_summary(summary, console: Console) -> None:
    console.print(
        f"personas: {summary.eligible} eligible + {summary.ineligible} failed the depth gate "
        f"(kept, eligible: false) of {summary.users_in} users · traits kept {summary.traits_kept}, "
        f"dropped for lack of valid evidence {summary.traits_dropped} · citations of unknown "
        f"memories removed {summary.citations_dropped} · Big Five levels on thin evidence "
        f"{summary.thin_levels}"
    )


def print_persona(path, user_id: str, console: Console) -> None:
    """One persona with each trait and level next to the memories it cites, for auditing."""
    from personaemp.records import BIG_FIVE, Persona

    for _, _, row in iter_jsonl(path, ErrorPolicy("fail")):
        if str(row.get("user_id")) == user_id:
            persona = Persona.model_validate(row)
            break
    else:
        raise InputError(
            f"{path}: no persona for user {user_id!r}",
            f"run `personaemp infer-persona --users {user_id}` first, or check the id",
        )
    memories = {m.memory_id: m for m in persona.memories}

    def cite(ids: list[str]) -> str:
        return "\n".join(f"    [dim]{i}[/] {escape(memories[i].value)}" for i in ids if i in memories)

    console.print(
        f"[bold]{escape(persona.user_id)}[/] · language {persona.language} · eligible {persona.eligible}"
    )
    console.print(f"gate: {escape(persona.gate_reason)}")
    console.print(f"topics: {escape(', '.join(persona.topics))}")
    for trait in persona.traits:
        console.print(f"[bold]{trait.aspect}[/]: {escape(trait.statement)}")
        console.print(cite(trait.evidence))
    if persona.big_five:
        for name in BIG_FIVE:
            level = getattr(persona.big_five, name)
            thin = " [yellow](thin evidence)[/]" if level.thin_evidence else ""
            console.print(f"[bold]{name}[/] {level.level}{thin}: {escape(level.rationale)}")
            if level.evidence:
                console.print(cite(level.evidence))
    console.print(
        f"[dim]model {persona.provenance.model} ({persona.provenance.endpoint_kind}) · prompts "
        f"{persona.provenance.prompts} · {persona.provenance.created_at}[/]"
    )


def print_query_funnel(funnel, console: Console) -> None:
    table = Table(title="gen-queries funnel", title_justify="left")
    table.add_column("step")
    table.add_column("count", justify="right")
    table.add_row("eligible users in", str(funnel.users_in))
    table.add_row("  ineligible personas skipped", str(funnel.ineligible_skipped))
    table.add_row("users with a result", str(funnel.users_done))
    table.add_row("situations kept", str(funnel.situations))
    for reason, count in sorted(funnel.situations_dropped.items()):
        table.add_row(f"  situations dropped: {reason}", str(count))
    table.add_row("queries generated", str(funnel.generated))
    for check, count in sorted(funnel.failed_checks.items()):
        table.add_row(f"  failed {check}", str(count))
    for category in ("ES", "HEQ", "SS"):
        table.add_row(
            f"{category}: accepted / rejected",
            f"{funnel.accepted.get(category, 0)} / {funnel.rejected.get(category, 0)}",
        )
    accepted = sum(funnel.accepted.values())
    table.add_row("[bold]accepted[/]", f"[bold]{accepted}[/]")
    console.print(table)
    mean, low, high = funnel.per_user()
    console.print(f"accepted per user: mean {mean:.2f}, min {low}, max {high}")


def print_split_report(report, out_dir, console: Console) -> None:
    if report.unchanged_since:
        return console.print(report.unchanged_since)
    left = ", ".join(f"{reason} {count}" for reason, count in sorted(report.left_out.items())) or "none"
    console.print(f"users read: {report.users_in} · left out: {left}")
    for name, setting in report.settings.items():
        console.print(
            f"[bold]{name}[/]: train {setting['train_users']} users / {setting['train_queries']} queries · "
            f"test {setting['test_users']} users / {setting['test_queries']} queries"
        )
        if name == "ood":
            curve = ", ".join(f"k={k}: {cost:g}" for k, cost in setting["cost_curve"].items())
            fixed = "fixed" if setting["k_fixed"] else "elbow"
            console.print(f"  k = {setting['k']} ({fixed}); cost curve: {curve}")
            clusters = Table(title_justify="left")
            for column in ("cluster", "users", "O", "C", "E", "A", "N"):
                clusters.add_column(column)
            for cluster in setting["clusters"]:
                held = " (test)" if cluster["id"] == setting["holdout_cluster"] else ""
                clusters.add_row(f"{cluster['id']}{held}", str(cluster["users"]), *cluster["mode"].values())
            console.print(clusters)
        levels = Table(title=f"{name}: share of users per level, train → test", title_justify="left")
        levels.add_column("trait")
        for level in ("low", "medium", "high"):
            levels.add_column(level, justify="right")
        for trait, shares in setting["levels_train"].items():
            test = setting["levels_test"][trait]
            levels.add_row(trait, *(f"{shares[lv]:.2f} → {test[lv]:.2f}" for lv in ("low", "medium", "high")))
        console.print(levels)
    console.print(f"wrote {out_dir}")


def print_stats(result, console: Console) -> None:
    """`personaemp stats`: the figures stats.json holds, in short, and where they came from."""
    if result.unchanged_since:
        return console.print(result.unchanged_since)
    from personaemp.records import BIG_FIVE

    stats = result.stats
    for name, path in result.sources.found().items():
        console.print(f"{name}: {escape(path) if path else '[yellow]not found[/]'}")
    funnel = stats["funnel"]
    if funnel["users"]:
        console.print("users: " + " → ".join(f"{s['stage']} {s['count']}" for s in funnel["users"]))
    if funnel["queries"]:
        console.print("queries: " + " → ".join(f"{s['stage']} {s['count']}" for s in funnel["queries"]))
    if "big_five" in stats:
        levels = Table(title=f"Big Five levels of {stats['big_five']['users']} users", title_justify="left")
        levels.add_column("trait")
        for level in ("low", "medium", "high"):
            levels.add_column(level, justify="right")
        for trait in BIG_FIVE:
            levels.add_row(trait, *(str(n) for n in stats["big_five"]["levels"][trait].values()))
        console.print(levels)
    queries = stats.get("queries")
    if queries:
        per_user, length = queries["per_user"], queries["length"]
        console.print(
            "per category: " + (", ".join(f"{c} {n}" for c, n in queries["categories"].items()) or "none")
        )
        console.print(
            "per language: " + (", ".join(f"{c} {n}" for c, n in queries["languages"].items()) or "none")
        )
        console.print(
            f"per user: mean {per_user['mean']:g}, min {per_user['min']}, max {per_user['max']} · "
            f"length: mean {length['mean']:g}, min {length['min']}, max {length['max']} characters · "
            f"memories cited: mean {queries['memories_cited']['mean']:g}"
        )
    if stats.get("checks"):
        console.print(
            "checks passed: " + ", ".join(f"{name} {c['rate']:.0%}" for name, c in stats["checks"].items())
        )
    console.print(f"wrote {escape(str(result.out))}: {', '.join(result.files)}")


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


def print_estimate(report, console: Console) -> None:
    """--estimate: what the stage would send now, per step, and the cost at the given prices."""
    estimate, outcome = report.estimate, report.outcome
    console.print(
        f"[bold]{report.stage} --estimate[/]: {outcome.units} units: {outcome.done_before} done earlier, "
        f"{outcome.done} would come from the cache, {estimate['units_pending']} need requests, "
        f"{outcome.failed_before + outcome.failed} failed (kept). Nothing was sent or written."
    )
    table = Table(title=f"{report.stage} · {report.model}", title_justify="left")
    for title in ("step", "calls", "tok in", "of them prefix-cached", "tok out", "from"):
        table.add_column(title, justify="left" if title in ("step", "from") else "right")
    for name, entry in estimate["steps"].items():
        table.add_row(name, f"{entry['calls']:,}", f"{entry['prompt_tokens']:,}",
                      f"{entry.get('cached_tokens', 0):,}", f"{entry['completion_tokens']:,}",
                      escape(entry["source"]))  # fmt: skip
    console.print(table)
    prices = "--price-in/--price-out/--price-cached"
    cost = "" if estimate["cost"] is None else f" · about ${estimate['cost']:.2f} at {prices}"
    console.print(
        f"tokens ({estimate['counted_as']}): {estimate['prompt_tokens']:,} in "
        f"({estimate.get('cached_tokens', 0):,} in a prefix sent before) + "
        f"{estimate['completion_tokens']:,} out{cost}"
    )


def wrote_rows(report) -> bool:
    """The stage ran and is done: not --estimate, not a --batch round still to be answered
    (only then is there a summary of what it wrote)."""
    return report.estimate is None and not waits_for_a_batch(report)


def waits_for_a_batch(report) -> bool:
    """--batch: this round wrote requests still to be answered (the stage is not done)."""
    return bool(getattr(report, "batch", None) and report.batch["files"])


def print_batch_round(report, console: Console) -> None:
    batch, outcome = report.batch, report.outcome
    files = batch["new_files"] or batch["files"]
    unknown = f", {batch['unknown']} answers to requests whose input file is gone" if batch["unknown"] else ""
    console.print(
        f"[bold]{report.stage} --batch[/]: {batch['imported']} new answers, {batch['failed']} failed lines "
        f"(asked again), {batch['refused']} refused (their units fail){unknown}; "
        f"{outcome.done + outcome.done_before} of {outcome.units} units done, {outcome.pending} waiting on "
        f"{batch['requests']} requests."
    )
    if not batch["new_files"]:
        console.print(f"No new requests: waiting for the answers to {escape(', '.join(files))}.")
        return
    first = escape(files[0])
    more = f" (and {len(files) - 1} more files)" if len(files) > 1 else ""
    console.print(
        f"Submit {first}{more} to the OpenAI Batch API, or run `vllm run-batch -i {first} "
        f"-o {first.removesuffix('.jsonl')}.output.jsonl --model {escape(report.model)}`; put the output "
        "file in the same folder and run this command again."
    )


def interval_text(figures: dict[str, Any], key: str, percent: bool = False) -> str:
    value, ci = figures.get(key), figures.get(f"{key}_ci")
    if value is None:
        return "—"
    shown = f"{value:.1%}" if percent else f"{value:.2f}"
    if ci:
        shown += f" [{ci[0]:.1%}, {ci[1]:.1%}]" if percent else f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    return shown


def judges_text(figures: dict[str, Any]) -> str:
    """Judge vs judge: kappa and, beside it, raw agreement (kappa is undefined when both
    judges give one answer throughout)."""
    if not figures or figures.get("agreement") is None:
        return "—"
    return f"{interval_text(figures, 'kappa')} ({figures['agreement']:.0%} agree)"


def print_push(made, console: Console) -> None:
    result = made.report
    if getattr(result, "unchanged_since", None):  # a dry run skipped (freshness.py): its one line
        return console.print(result.unchanged_since)
    for setting, parts in result.rows.items():
        console.print(f"[bold]{setting}[/]: " + ", ".join(f"{split} {n} rows" for split, n in parts.items()))
    for warning in result.warnings:  # e.g. a stage report the card could not find
        console.print(f"[yellow]warning:[/] {escape(warning)}")
    console.print(f"wrote {result.target}")


# Why a label is not scored by `agreement` (and the card): checked as the page checks a click.
NOT_SCORED = {
    "unknown_query": "about a query this build does not have",
    "unknown_target": "about a trait or check the query does not have",
    "invalid": "not a label the page would take (its value, field or reviewer name)",
}


def not_scored_text(report: dict[str, Any]) -> str:
    """'3 labels about a trait or check the query does not have, ...', or ''."""
    counts = (report.get("labels") or {}).get("not_scored") or {}
    return "; ".join(f"{n} label{'s' if n != 1 else ''} {NOT_SCORED[k]}" for k, n in counts.items() if n)
