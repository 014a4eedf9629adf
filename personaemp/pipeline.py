"""The stages as the commands and `personaemp run` call them, from resolved options.

`run_<stage>(options, ...)` is the one place a stage function is called from options
(and its summary printed): `personaemp <stage>` calls it with the options of its flags,
`personaemp run` with those of personaemp.toml, so both sides pass the same arguments.
`run_pipeline` chains filter -> infer-persona -> gen-queries -> split -> stats -> push; finished
LLM work is skipped through the stages' own resume (and the cache), so re-running the
pipeline after a crash or an edit redoes only what changed.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rich.console import Console
from rich.markup import escape

from personaemp import results
from personaemp.aio import run_sync
from personaemp.config import llm_settings
from personaemp.options import (
    CriteriaOptions,
    EvaluateOptions,
    FilterOptions,
    LLMOptions,
    PersonaOptions,
    PushOptions,
    QueriesOptions,
    RespondOptions,
    RunOptions,
    SplitOptions,
    StatsOptions,
)
from personaemp.results import StageResult
from personaemp.summaries import waits_for_a_batch


@dataclass
class PipelineResult:
    """`run`'s stages: their StageResults (`results`) and their own reports (`reports`)."""

    reports: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of each stage, in order
    results: dict[str, StageResult] = field(default_factory=dict)

    def add(self, name: str, result: StageResult) -> StageResult:
        self.results[name], self.reports[name] = result, result.report
        return result

    def as_dict(self) -> dict[str, Any]:
        return {
            "stages": {name: result.as_dict() for name, result in self.results.items()},
            "seconds": {name: round(seconds, 3) for name, seconds in self.seconds.items()},
        }

    @contextmanager
    def stage(self, name: str, console: Console):
        """A stage of `run`: its rule before, its wall time kept for the closing line."""
        rule(console, name)
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - started

    def print_timings(self, console: Console) -> None:
        parts = " · ".join(f"{name} {seconds:.1f} s" for name, seconds in self.seconds.items())
        console.print(f"run: {parts} · total {sum(self.seconds.values()):.1f} s")


def rule(console: Console, title: str) -> None:
    """A titled rule; as wide as a terminal, else 80 columns (a file's console is very wide)."""
    from rich.rule import Rule

    console.print(Rule(title), width=None if console.is_terminal else 80)


def call_filter(options: FilterOptions, console: Console) -> StageResult:
    from personaemp.build import filter as stage

    args = filter_args(options)
    return results.of_filter(stage.filter_users(**args, console=console), args["report_path"])


def run_filter(options: FilterOptions, console: Console) -> StageResult:
    from personaemp import summaries

    result = call_filter(options, console)
    summaries.print_filter_summary(result.report, console)
    return result


def filter_args(options: FilterOptions) -> dict[str, Any]:
    """filter_users' arguments from its options, for the command and for `run`'s streamed filter."""
    return {
        "source": options.input, "output": options.output, "fmt": options.format,
        "rules_path": options.rules, "split": options.benchmark_split, "hf_config": options.hf_config,
        "on_error": options.on_error, "keep_turns": options.turns,
        "report_path": options.output.with_name("filter_report.json"), "force": options.force,
    }  # fmt: skip


async def acall_persona(
    options: PersonaOptions,
    llm: LLMOptions,
    console: Console,
    env: Mapping[str, str] | None = None,
    full: bool | None = None,
    settings=None,
) -> StageResult:
    """infer-persona from its options; `settings` (LLMSettings) instead of those of `llm`."""
    from personaemp.build import persona as stage

    report, summary = await stage.ainfer_personas(
        options.input, options.output, settings or llm_settings(llm, env), **_persona_args(options, llm),
        full=full, console=console,
    )  # fmt: skip
    return results.of_llm_stage(report, summary)


def run_persona(
    options: PersonaOptions,
    llm: LLMOptions,
    console: Console,
    env: Mapping[str, str] | None = None,
    full: bool | None = None,
) -> StageResult:
    from personaemp import summaries

    result = run_sync(acall_persona(options, llm, console, env, full))
    summaries.print_stage_report(result.report, console)
    if summaries.wrote_rows(result.report):
        summaries.print_persona_summary(result.summary, console)
    return result


async def acall_queries(
    options: QueriesOptions,
    llm: LLMOptions,
    console: Console,
    env: Mapping[str, str] | None = None,
    full: bool | None = None,
    settings=None,
) -> StageResult:
    from personaemp.build import queries as stage

    report, funnel = await stage.agenerate_queries(
        options.input, options.output, settings or llm_settings(llm, env), **_queries_args(options, llm),
        full=full, console=console,
    )  # fmt: skip
    return results.of_llm_stage(report, funnel)


def run_queries(
    options: QueriesOptions,
    llm: LLMOptions,
    console: Console,
    env: Mapping[str, str] | None = None,
    full: bool | None = None,
) -> StageResult:
    from personaemp import summaries

    result = run_sync(acall_queries(options, llm, console, env, full))
    summaries.print_stage_report(result.report, console)
    if summaries.wrote_rows(result.report):
        summaries.print_query_funnel(result.summary, console)
    return result


def _persona_args(options: PersonaOptions, llm: LLMOptions) -> dict[str, Any]:
    """infer-persona's arguments from its options, for the command and for `run`'s chain."""
    return {
        "limit": options.limit, "users": options.users, "retry_failed": llm.retry_failed,
        "require_depth": options.require_depth, "shard": options.shard,
    }  # fmt: skip


def _queries_args(options: QueriesOptions, llm: LLMOptions) -> dict[str, Any]:
    """gen-queries' arguments from its options, for the command and for `run`'s chain."""
    from personaemp.build.queries import QueryOptions

    enforce = {"enforce": tuple(options.enforce)} if options.enforce is not None else {}
    return {
        "options": QueryOptions(
            categories=tuple(options.categories), per_category=options.per_category, **enforce
        ),
        "limit": options.limit, "users": options.users, "retry_failed": llm.retry_failed,
        "shard": options.shard,
    }  # fmt: skip


def run_persona_and_queries(
    options: RunOptions,
    console: Console,
    env: Mapping[str, str] | None = None,
    meanwhile: Callable[[], object] | None = None,
    stream=None,
):
    """The two stages' reports (see `persona_and_queries`)."""
    made = persona_and_queries(options, console, env, meanwhile, stream)
    return made[0].report, made[1].report


def persona_and_queries(
    options: RunOptions,
    console: Console,
    env: Mapping[str, str] | None = None,
    meanwhile: Callable[[], object] | None = None,
    stream=None,
) -> tuple[StageResult, StageResult]:
    """`run`'s two LLM stages on one engine, a user going on to gen-queries as soon as its
    persona is written (llm.run.run_llm_chain); each stage's files and report as alone.
    `meanwhile` is called once the first requests are going out. `stream`: infer-persona's
    input as the filter writes it (streaming.FilterFeed), whose summary is printed first."""
    from personaemp import summaries
    from personaemp.build import persona, queries
    from personaemp.llm.run import run_llm_chain

    # In `run`, a [persona] limit is the size of the build, not a quick look: the card quotes it.
    first = persona.persona_stage(
        options.persona.input, options.persona.output, **_persona_args(options.persona, options.llm),
        full=True, stream=stream,
    )  # fmt: skip
    second = queries.queries_stage(
        options.queries.input, options.queries.output, **_queries_args(options.queries, options.llm),
        full=True, chained=True,
    )  # fmt: skip
    written = functools.cache(lambda: queries.read_personas(options.queries.input))  # read once, at the end
    reports = run_llm_chain(
        first, second, queries.handoff, lambda: written()[0],
        settings=llm_settings(options.llm, env), console=console, meanwhile=meanwhile,
    )  # fmt: skip
    if written.cache_info().currsize:  # read as the chain ended: the funnel counts over it
        second.units, second.skipped = written()
    made = (
        results.of_llm_stage(reports[0], persona.summarize(first.output, first.picked())),
        results.of_llm_stage(reports[1], queries.funnel(second)),
    )
    if stream is not None:
        summaries.print_filter_summary(stream.report, console)
    summaries.print_stage_report(reports[0], console)
    summaries.print_persona_summary(made[0].summary, console)
    summaries.print_stage_report(reports[1], console)
    summaries.print_query_funnel(made[1].summary, console)
    return made


class _BackgroundImports:
    """Load what later work needs while the LLM stages wait on the endpoint: the language
    model (gen-queries' checks), then kmodes (scikit-learn), datasets and matplotlib, which
    took 3.5 of the 9 s of a `run` with nothing left to ask. Started once requests are out:
    begun before, the thread slowed the LLM stages' own imports and setup (they share the
    GIL and module locks) by about 2 s."""

    def __init__(self, *modules: str) -> None:
        self.modules, self.thread = modules, None

    def start(self) -> None:
        import threading

        self.thread = threading.Thread(target=self._load, name="personaemp-imports", daemon=True)
        self.thread.start()

    def _load(self) -> None:
        import importlib

        from personaemp.language import _identifier

        # First the language model: gen-queries' checks need it within seconds, and loading
        # it there would stop the event loop (and 32 requests' replies) for half a second.
        for load in (
            _identifier,
            *(functools.partial(importlib.import_module, module) for module in self.modules),
        ):
            try:
                load()
            except Exception:  # noqa: BLE001 - the stage that needs it reports it properly
                return

    def __enter__(self) -> _BackgroundImports:
        return self

    def __exit__(self, exc_type, *exc_info) -> None:
        # Joined even when the run stops: a thread still importing holds module locks, and a
        # process forked then (split's or the plots' workers, later in the same process)
        # waits on them for ever (a test after a failed `run` hung so). Not after Ctrl-C:
        # nothing is forked after it, and the join held the exit up to 6 s (datasets' import).
        if self.thread is not None and not (exc_type and issubclass(exc_type, KeyboardInterrupt)):
            self.thread.join()


def chains(options: RunOptions) -> bool:
    """Whether `run` can feed gen-queries while infer-persona runs: not for a batch (rounds
    of files), nor when gen-queries picks its users (--limit / --users need its whole input)."""
    return (
        options.llm.batch is None
        and options.queries.limit is None
        and not options.queries.users
        and options.queries.input == options.persona.output
    )


def streams(options: RunOptions) -> bool:
    """Whether `run` can hand infer-persona the filter's users as the filter writes them
    (streaming.py): not when infer-persona picks its users (--limit / --users)."""
    from personaemp.streaming import can_stream

    return (
        can_stream()
        and options.persona.limit is None
        and not options.persona.users
        and options.persona.input == options.filter.output
    )


def _background_imports() -> _BackgroundImports:
    """What split, stats and push import, loaded while the endpoint works."""
    return _BackgroundImports(
        "kmodes.kmodes", "datasets", "matplotlib.figure", "matplotlib.backends.backend_agg"
    )


def run_merge(
    stage: str,
    options: RunOptions,
    console: Console,
    input_path: Path | None = None,
    output: Path | None = None,
):
    """`personaemp merge STAGE`: the stage's shard files into its output (stages/merge.py)."""
    from personaemp.build.merge import merge_shards
    from personaemp.paths import check_paths

    name = "persona" if stage == "infer-persona" else "queries"
    given = {"input": input_path, "output": output}
    section = getattr(options, name).model_copy(update={k: v for k, v in given.items() if v is not None})
    check_paths([(name, section), ("llm", options.llm)])
    report = merge_shards(stage, section.input, section.output, options.llm.work_dir)
    result = results.of_merge(report)
    kinds = ", ".join(f"{kind} {n}" for kind, n in report.failures_by_kind.most_common())
    console.print(
        f"[bold]{stage}[/]: {report.shards} shards merged: {report.units} units, {report.done} done, "
        f"{report.failed} failed{f' ({kinds})' if kinds else ''}"
    )
    console.print(f"wrote {report.output}" + (f" and {report.failures}" if report.failed else ""))
    return result


def call_split(options: SplitOptions, console: Console | None = None) -> StageResult:
    from personaemp.build import split as stage

    report = stage.split_users(
        options.input,
        options.out_dir,
        ood=options.ood,
        seed=options.seed,
        test_size=options.test_size,
        k=options.k,
        k_range=(options.k_min, options.k_max),
        holdout=options.holdout,
        seeds=options.seeds,
        force=options.force,
    )
    return results.of_split(report, options.out_dir)


def run_split(options: SplitOptions, console: Console) -> StageResult:
    from personaemp import summaries

    result = call_split(options)
    summaries.print_split_report(result.report, options.out_dir, console)
    return result


def call_stats(options: StatsOptions, console: Console | None = None) -> StageResult:
    from personaemp.build import stats as stage

    return results.of_stats(stage.write_stats(options.processed, options.out_dir, options.force))


def run_stats(options: StatsOptions, console: Console) -> StageResult:
    from personaemp import summaries

    result = call_stats(options)
    summaries.print_stats(result.report, console)
    return result


def call_push(options: PushOptions, console: Console | None = None) -> StageResult:
    from personaemp.build import publish as stage

    dry = options.is_dry_run
    return results.of_publish(
        stage.publish(
            options.splits,
            repo_id=None if dry else options.repo_id,
            out=options.out_dir if dry else None,
            private=options.private,
            revision=options.revision,
            include_dialogue=options.include_dialogue,
            criteria=options.criteria,
            force=options.force,
        )
    )


def run_push(options: PushOptions, console: Console) -> StageResult:
    made = call_push(options)
    result, dry = made.report, options.is_dry_run
    if getattr(result, "unchanged_since", None):  # a dry run skipped (personaemp.freshness): its one line
        console.print(result.unchanged_since)
        return made
    if dry and not options.dry_run:
        console.print("no repo_id: a dry run, the repository that would be pushed goes to a folder")
    for setting, parts in result.rows.items():
        console.print(f"[bold]{setting}[/]: " + ", ".join(f"{split} {n} rows" for split, n in parts.items()))
    for warning in result.warnings:  # e.g. a stage report the card could not find
        console.print(f"[yellow]warning:[/] {escape(warning)}")
    console.print(f"wrote {result.target}")
    return made


async def acall_criteria(
    options: CriteriaOptions,
    llm: LLMOptions,
    console: Console,
    env: Mapping[str, str] | None = None,
    settings=None,
) -> StageResult:
    from personaemp.evaluation import criteria as stage

    report = await stage.awrite_criteria(
        options.input,
        options.output,
        settings or llm_settings(llm, env),
        limit=options.limit,
        users=options.users,
        retry_failed=llm.retry_failed,
        console=console,
    )
    return results.of_llm_stage(report)


def run_criteria(
    options: CriteriaOptions, llm: LLMOptions, console: Console, env: Mapping[str, str] | None = None
) -> StageResult:
    from personaemp import summaries

    result = run_sync(acall_criteria(options, llm, console, env))
    summaries.print_stage_report(result.report, console)
    return result


async def acall_respond(
    options: RespondOptions,
    llm: LLMOptions,
    console: Console,
    env: Mapping[str, str] | None = None,
    settings=None,
) -> StageResult:
    from personaemp.evaluation import respond as stage

    report = await stage.awrite_responses(
        options.splits,
        options.output_path,
        settings or llm_settings(llm, env),
        split=options.split,
        part=options.part,
        context=options.context,
        rag_k=options.rag_k,
        mismatch_seed=options.mismatch_seed,
        limit=options.limit,
        retry_failed=llm.retry_failed,
        console=console,
    )
    return results.of_llm_stage(report)


def run_respond(
    options: RespondOptions, llm: LLMOptions, console: Console, env: Mapping[str, str] | None = None
) -> StageResult:
    from personaemp import summaries

    result = run_sync(acall_respond(options, llm, console, env))
    report = result.report
    summaries.print_stage_report(report, console)
    if summaries.wrote_rows(report):
        console.print(f"wrote {options.output_path}")
    return result


def run_export(options, console: Console) -> dict:
    from personaemp.training.export import write_export

    written = write_export(
        options.splits, options.output_path, format=options.format, split=options.split,
        part=options.part, context=options.context, rag_k=options.rag_k,
        mismatch_seed=options.mismatch_seed, summaries=options.summaries,
        criteria_file=options.criteria, data_source=options.data_source,
    )  # fmt: skip
    console.print(f"wrote {written['rows']} rows ({written['format']}) to {written['output']}")
    return written


async def acall_evaluate(
    options: EvaluateOptions,
    llm: LLMOptions,
    console: Console,
    env: Mapping[str, str] | None = None,
    settings=None,
) -> StageResult:
    from personaemp.evaluation import evaluate as stage

    settings = settings or llm_settings(llm, env)
    report, evaluation = await stage.aevaluate(
        options.splits,
        [Path(path) for path in options.responses],
        options.output,
        settings,
        split=options.split,
        part=options.part,
        criteria_file=options.criteria,
        judge_model=options.judge_model,
        judges=judge_panel(options, settings, env),
        options=stage.JudgeOptions(
            dynamic=options.dynamic,
            samples=options.samples,
            bystander=options.bystander,
            reward_lambda=options.reward_lambda,
            missing=options.missing,
        ),
        retry_failed=llm.retry_failed,
        console=console,
    )
    return results.of_evaluate(report, evaluation, options.output)


def run_evaluate(
    options: EvaluateOptions,
    llm: LLMOptions,
    console: Console,
    env: Mapping[str, str] | None = None,
    tables: Console | None = None,
) -> StageResult:
    """`tables`: where the evaluation's tables go (the command: stdout)."""
    from personaemp import summaries

    result = run_sync(acall_evaluate(options, llm, console, env))
    for report in result.judges or [result.report]:  # a panel: one per judge
        summaries.print_stage_report(report, console)
    if result.summary is not None:  # None after --estimate
        summaries.print_evaluation(result.summary, tables or console)
    return result


RUN_COMMANDS = ("filter", "infer-persona", "gen-queries", "split", "stats", "push")


def run_table(options, console: Console) -> str:
    """Table 1 from evaluate reports: printed (stdout) or written to --output."""
    from personaemp.evaluation.table import write_table

    text = write_table(
        [Path(p) for p in options.reports], options.output, options.format,
        harmonic=options.harmonic, digits=options.digits,
    )  # fmt: skip
    if options.output is None:
        print(text, end="")
    else:
        console.print(f"wrote {options.output}")
    return text


def judge_panel(options: EvaluateOptions, settings, env: Mapping[str, str] | None = None) -> list:
    """The engine settings of each judge of `--judge`/[[evaluate.judges]]: its endpoint, model
    and key over the run's; the key read from its variable only."""
    import dataclasses
    import os

    from personaemp.errors import PersonaempError
    from personaemp.evaluation.evaluate import Judge

    env = os.environ if env is None else env
    panel = []
    for spec in options.judges:
        key = settings.api_key
        if spec.key_env is not None:
            key = env.get(spec.key_env) or None
            if key is None:
                raise PersonaempError(  # the environment, not the input: exit 1
                    f"judge {spec.name}: ${spec.key_env} is not set", f"export {spec.key_env}=... first"
                )
        changes: dict = {"model": spec.model or options.judge_model or settings.model, "api_key": key}
        if spec.base_url:
            changes["base_urls"] = [spec.base_url]
        panel.append(Judge(spec.name, dataclasses.replace(settings, **changes)))
    return panel


def run_pipeline(
    options: RunOptions, console: Console, env: Mapping[str, str] | None = None
) -> PipelineResult:
    """Every stage in order, each from its section of `options` (see config.load_config)."""
    from personaemp.paths import check_command

    for command in RUN_COMMANDS:  # before any stage writes
        check_command(command, functools.partial(getattr, options), toml=True)
    if options.persona.shard or options.queries.shard:
        from personaemp.errors import InputError

        raise InputError(
            "run does not work on shards: split and push need every user",
            "run infer-persona / gen-queries --shard I/N on each machine, then personaemp merge",
        )
    if options.llm.estimate:
        return estimate_pipeline(options, console, env)
    result = _run_stages(options, console, env, PipelineResult())
    result.print_timings(console)
    return result


def _run_stages(
    options: RunOptions, console: Console, env: Mapping[str, str] | None, result: PipelineResult
) -> PipelineResult:
    if chains(options) and streams(options):
        from personaemp.streaming import FilterFeed

        with (
            result.stage("filter → infer-persona → gen-queries", console),
            _background_imports() as importing,
        ):
            args = filter_args(options.filter)
            with FilterFeed(args) as stream:
                made = persona_and_queries(options, console, env, importing.start, stream)
            result.add("filter", results.of_filter(stream.report, args["report_path"]))
            result.add("infer-persona", made[0])
            result.add("gen-queries", made[1])
        return _split_stats_push(options, console, result)
    with result.stage("filter", console):
        result.add("filter", run_filter(options.filter, console))
    if chains(options):
        with result.stage("infer-persona → gen-queries", console), _background_imports() as importing:
            made = persona_and_queries(options, console, env, meanwhile=importing.start)
            result.add("infer-persona", made[0])
            result.add("gen-queries", made[1])
        return _split_stats_push(options, console, result)
    # In `run`, a [persona] limit is the size of the build, not a quick look: the card quotes it.
    with result.stage("infer-persona", console):
        result.add("infer-persona", run_persona(options.persona, options.llm, console, env, full=True))
    if waits_for_a_batch(result.reports["infer-persona"]):
        return result  # --batch: the next stage starts when this one's rounds are done
    with result.stage("gen-queries", console):
        result.add("gen-queries", run_queries(options.queries, options.llm, console, env, full=True))
    if waits_for_a_batch(result.reports["gen-queries"]):
        return result
    return _split_stats_push(options, console, result)


def _split_stats_push(options: RunOptions, console: Console, result: PipelineResult) -> PipelineResult:
    with result.stage("split", console):
        result.add("split", run_split(options.split, console))
    with result.stage("stats", console):
        result.add("stats", run_stats(options.stats, console))
    with result.stage("push (dry run)" if options.push.is_dry_run else "push", console):
        result.add("push", run_push(options.push, console))
    return result


def estimate_pipeline(options: RunOptions, console: Console, env: Mapping[str, str] | None = None):
    """`run` with [llm] estimate: what the LLM stages would send now, writing nothing.

    The filter runs into a temporary folder; infer-persona is estimated on its output;
    gen-queries on the personas already written, plus, for the users whose persona is
    still to be written, its whole chain at the eligible share seen so far (else all)."""
    import tempfile

    from personaemp import summaries
    from personaemp.build import queries as queries_stage
    from personaemp.llm.cache import ReplyCache
    from personaemp.llm.estimate import cache_history, project
    from personaemp.records import Persona
    from personaemp.runner import StageOutcome

    result = PipelineResult()
    with tempfile.TemporaryDirectory() as folder:
        filtered = Path(folder) / "filtered.jsonl"
        run_filter(options.filter.model_copy(update={"output": filtered}), Console(quiet=True))
        persona_options = options.persona.model_copy(update={"input": filtered})
        rule(console, "infer-persona --estimate")
        persona = result.add("infer-persona", run_persona(persona_options, options.llm, console, env)).report
    written = options.queries.input
    if written.exists():
        rule(console, "gen-queries --estimate (personas written)")
        result.add("gen-queries", run_queries(options.queries, options.llm, console, env))
    rows = (
        [Persona.model_validate_json(line) for line in written.read_text().splitlines()]
        if written.exists()
        else []
    )
    share = sum(row.eligible for row in rows) / len(rows) if rows else 1.0
    # Personas still to write: those needing requests, and those the cache alone would write.
    coming = persona.estimate["units_pending"] + persona.outcome.done
    units = round(coming * share)
    cache_path = options.llm.work_dir / "cache.sqlite"
    cache = ReplyCache(cache_path, write=False) if cache_path.exists() and not options.llm.no_cache else None
    try:
        history = cache_history(cache)
        mean_prompt = (
            persona.estimate["steps"]["persona"]["prompt_tokens"]
            * 4
            / max(persona.estimate["steps"]["persona"]["calls"], 1)
        )
        seen = history("situations")
        prompt, source = (seen[0], f"cache mean of {seen[2]}") if seen[2] else (mean_prompt, "as persona")
        projected = project(
            [(step, 1) for step in (s.name for s in queries_stage.STEPS)],
            units, prompt, source, options.llm.max_tokens, history,
            (options.llm.price_in, options.llm.price_out, options.llm.price_cached),
        )  # fmt: skip
    finally:
        if cache is not None:
            cache.close()
    rule(console, "gen-queries --estimate (personas still to write)")
    later = SimpleNamespace(
        stage="gen-queries", model=persona.model, estimate=projected,
        outcome=StageOutcome(units=units, pending=units),
    )  # fmt: skip
    summaries.print_estimate(later, console)
    basis = "of the personas written" if rows else "assumed"
    console.print(
        f"({units} of the {coming} users still without a persona, at the eligible share {share:.0%} {basis})"
    )
    parts = [r.estimate for r in result.reports.values()] + [projected]
    tokens_in, tokens_out = sum(p["prompt_tokens"] for p in parts), sum(p["completion_tokens"] for p in parts)
    costs = [p["cost"] for p in parts if p["cost"] is not None]
    cost = f" · about ${sum(costs):.2f}" if costs else ""
    rule(console, "the whole run")
    console.print(
        f"tokens (characters / 4): {tokens_in:,} in + {tokens_out:,} out{cost}. Nothing was sent or written."
    )
    result.add("gen-queries (projected)", results.of_llm_stage(later))
    return result
