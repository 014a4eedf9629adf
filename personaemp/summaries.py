"""The pieces of the stages' summaries they share: an LLM stage's run report (and its
--estimate and --batch forms), intervals and agreement figures. Each stage prints its own
summary with these (`print_summary(result, console)` in its module, found as `from_options` is)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table


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


def print_run_report(result, console: Console) -> bool:
    """An LLM stage's run report (print_stage_report); True when it wrote rows, so that the
    stage's own summary follows (not after --estimate or a --batch round still waiting)."""
    print_stage_report(result.report, console)
    return wrote_rows(result.report)


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
