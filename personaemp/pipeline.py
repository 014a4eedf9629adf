"""`personaemp run`: filter -> infer-persona -> gen-queries -> split -> push, resuming.

Each stage is the same library function its command calls; finished LLM work is skipped
through the stages' own resume (and the cache), so re-running the pipeline after a
crash or an edit redoes only what changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from personaemp.config import RunConfig, llm_settings_from


@dataclass
class PipelineResult:
    reports: dict[str, Any] = field(default_factory=dict)


def run_pipeline(config: RunConfig, console: Console) -> PipelineResult:
    from personaemp import summaries
    from personaemp.stages.filter import filter_users
    from personaemp.stages.persona import infer_personas
    from personaemp.stages.publish import publish
    from personaemp.stages.queries import QueryOptions, generate_queries
    from personaemp.stages.split import split_users

    processed = config.paths.processed
    settings = llm_settings_from(config)
    result = PipelineResult()

    console.rule("filter")
    report = filter_users(
        config.paths.input,
        processed / "filtered.jsonl",
        fmt=config.filter.format,
        rules_path=config.filter.rules,
        split=config.filter.split,
        on_error=config.filter.on_error,
        report_path=processed / "filter_report.json",
        console=console,
    )
    summaries.print_filter_summary(report, console)
    result.reports["filter"] = report

    console.rule("infer-persona")
    report, summary = infer_personas(
        processed / "filtered.jsonl",
        processed / "personas.jsonl",
        settings,
        limit=config.persona.limit,
        require_depth=config.persona.require_depth,
        console=console,
    )
    summaries.print_stage_report(report, console)
    summaries.print_persona_summary(summary, console)
    result.reports["infer-persona"] = report

    console.rule("gen-queries")
    queries = config.queries
    options = QueryOptions(
        categories=tuple(queries.categories),
        per_category=queries.per_category,
        **({"enforce": tuple(queries.enforce)} if queries.enforce is not None else {}),
    )
    report, funnel = generate_queries(
        processed / "personas.jsonl", processed / "queries.jsonl", settings, options=options, console=console
    )
    summaries.print_stage_report(report, console)
    summaries.print_query_funnel(funnel, console)
    result.reports["gen-queries"] = report

    console.rule("split")
    split = config.split
    report = split_users(
        processed / "queries.jsonl",
        processed / "splits",
        ood=split.ood,
        seed=split.seed,
        test_size=split.test_size,
        k=split.k,
        k_range=(split.k_min, split.k_max),
        seeds=split.seeds,
    )
    summaries.print_split_report(report, processed / "splits", console)
    result.reports["split"] = report

    console.rule("push" if config.push.repo_id else "push (dry run)")
    published = publish(
        processed / "splits",
        repo_id=config.push.repo_id,
        out=None if config.push.repo_id else (config.push.out or processed / "dataset"),
        private=config.push.private,
        include_dialogue=config.push.include_dialogue,
    )
    for setting, parts in published.rows.items():
        console.print(f"[bold]{setting}[/]: " + ", ".join(f"{s} {n} rows" for s, n in parts.items()))
    console.print(f"dataset: {published.target}")
    result.reports["push"] = published
    return result
