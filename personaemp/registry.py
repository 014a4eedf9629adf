"""Every stage declared once: its command, its Python name, how its options reach its
function, and its summary. The Typer commands (cli.py), `import personaemp as pe` (api.py)
and `personaemp run` (pipeline.py) are all derived from `STAGES`.

A stage's `call(section, console, llm)` turns its resolved options into its function's
arguments and its return value into a StageResult; `llm` is the engine's settings
(LLMSettings) for an LLM stage, whose `call` is a coroutine. What differs between stages
stays in the stage's own module (personaemp/build, evaluation, review, training).

To add a stage: its module (a function with plain arguments), its options section
(options.py: SECTIONS and COMMANDS), and one `Stage(...)` below.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from personaemp import freshness, results, summaries
from personaemp.aio import run_sync
from personaemp.options import COMMANDS


@dataclass(frozen=True)
class Stage:
    command: str  # the CLI command; its options: the sections of options.COMMANDS[command]
    function: str  # its name in `import personaemp as pe` (an LLM stage also has "a" + function)
    call: Callable[..., Any]  # (section, console, llm=None, **extra) -> result (a coroutine: LLM)
    help: str  # the command's --help; the Python function's docstring begins with it
    summary: Callable[[Any, Console], None] | None = None  # (result, console): after the stage
    positional: tuple[str, ...] = ("input", "output")  # the Python function's positional arguments
    progress: bool = False  # the Python function's default: print progress and the summary
    # An LLM stage skipped when current (freshness.py): its section has `force` and `shard`.
    fresh: bool = False

    @property
    def sections(self) -> tuple[str, ...]:
        return COMMANDS[self.command]

    @property
    def llm(self) -> bool:
        return "llm" in self.sections

    def options(self, options) -> Any:
        """The stage's own section of `options` (a config.Resolver, or run's RunOptions)."""
        name = self.sections[0]
        return getattr(options, name) if hasattr(options, name) else options.section(name)

    def run(self, options, console: Console, llm=None, env: Mapping[str, str] | None = None, **extra):
        """The stage on `options` (its section; an LLM stage also [llm], whose key is read from
        `env`, unless `llm` gives the engine's settings), then its summary on `console`."""
        if self.llm:
            return run_sync(self.arun(options, console, llm, env, **extra))
        return self._shown(self.call(self.options(options), console, **extra), console)

    async def arun(self, options, console: Console, llm=None, env: Mapping[str, str] | None = None, **extra):
        """`run` of an LLM stage, awaited."""
        if llm is None:
            from personaemp.config import llm_settings

            llm = llm_settings(options.llm, env)
        retry = options.llm.retry_failed
        section = self.options(options)
        stamp = self._fingerprint(section, options.llm) if self.fresh else None
        last = freshness.current(self.command, section.output, stamp, section.force) if stamp else None
        if last is not None:
            console.print(freshness.unchanged(self.command, last))
            return results.StageResult(self.command, section.output, counts=last["result"])
        result = self._shown(await self.call(section, console, llm, retry=retry, **extra), console)
        if stamp is not None:
            self._record(section, stamp, result)
        return result

    def _record(self, section, stamp: str, result) -> None:
        """A run that failed no unit and wrote its output: the next one may skip it."""
        if result.counts.get("failed") or result.counts.get("failed_before") or not section.output.exists():
            return
        outputs = [touch.path for touch in self._touched(section)[1] if touch.path.exists()]
        freshness.record(self.command, section.output, stamp, outputs, result.counts)

    def _touched(self, section):
        from personaemp.paths import touched

        return touched([(self.sections[0], section)])

    def _fingerprint(self, section, llm) -> str | None:
        """What an LLM stage's output depends on: its input files, its options, the [llm]
        options that shape a reply, the code. None: not skipped (a shard, or no reply shape)."""
        shape = reply_shape(llm)
        if section.shard or shape is None:
            return None
        used = {"options": section.model_dump(mode="json", exclude={"force"}), "llm": shape}
        return freshness.fingerprint([touch.path for touch in self._touched(section)[0]], used)

    def _shown(self, result, console: Console):
        if self.summary is not None:
            self.summary(result, console)
        return result


# [llm] options that change no reply: a stage run with other values is still current.
RUNTIME = ("concurrency", "rpm", "timeout", "max_retries", "work_dir", "price_in", "price_out",
           "price_cached", "max_cost")  # fmt: skip


def reply_shape(llm) -> dict[str, Any] | None:
    """The [llm] options an LLM stage's fingerprint covers (freshness.py); None when the
    run must not be skipped (asked to retry, refresh, estimate, batch, or no cache)."""
    if llm.retry_failed or llm.refresh or llm.no_cache or llm.estimate or llm.batch is not None:
        return None
    return llm.model_dump(mode="json", exclude=set(RUNTIME))


# --- how each stage's options reach its function -------------------------------------------------


def filter_args(options) -> dict[str, Any]:
    """filter_users' arguments from its options, for the command and for `run`'s streamed filter."""
    return {
        "source": options.input, "output": options.output, "fmt": options.format,
        "rules_path": options.rules, "split": options.benchmark_split, "hf_config": options.hf_config,
        "on_error": options.on_error, "keep_turns": options.turns,
        "report_path": options.output.with_name("filter_report.json"), "force": options.force,
    }  # fmt: skip


async def _extract(options, console, llm, retry=False, full=None):
    from personaemp.build import memories

    made = await memories.aextract_memories(
        Path(options.input), options.output, llm, **memories.extract_args(options), retry_failed=retry,
        full=full, console=console,
    )  # fmt: skip
    return memories.extract_result(options, *made)


def _filter(options, console):
    from personaemp.build.filter import filter_users

    args = filter_args(options)
    return results.of_filter(filter_users(**args, console=console), args["report_path"])


def persona_args(options, retry: bool) -> dict[str, Any]:
    """infer-persona's arguments from its options, for the command and for `run`'s chain."""
    return {
        "limit": options.limit, "users": options.users, "retry_failed": retry,
        "require_depth": options.require_depth, "shard": options.shard,
    }  # fmt: skip


def queries_args(options, retry: bool) -> dict[str, Any]:
    """gen-queries' arguments from its options, for the command and for `run`'s chain."""
    from personaemp.build.queries import QueryOptions

    enforce = {"enforce": tuple(options.enforce)} if options.enforce is not None else {}
    return {
        "options": QueryOptions(
            categories=tuple(options.categories), per_category=options.per_category, **enforce
        ),
        "limit": options.limit, "users": options.users, "retry_failed": retry, "shard": options.shard,
    }  # fmt: skip


async def _persona(options, console, llm, retry=False, full=None):
    from personaemp.build.persona import ainfer_personas

    made = await ainfer_personas(
        options.input, options.output, llm, **persona_args(options, retry), full=full, console=console
    )
    return results.of_llm_stage(*made)


async def _queries(options, console, llm, retry=False, full=None):
    from personaemp.build.queries import agenerate_queries

    made = await agenerate_queries(
        options.input, options.output, llm, **queries_args(options, retry), full=full, console=console
    )
    return results.of_llm_stage(*made)


def _split(options, console):
    from personaemp.build.split import split_users

    report = split_users(
        options.input, options.out_dir, ood=options.ood, seed=options.seed, test_size=options.test_size,
        k=options.k, k_range=(options.k_min, options.k_max), holdout=options.holdout, seeds=options.seeds,
        force=options.force,
    )  # fmt: skip
    return results.of_split(report, options.out_dir)


def _stats(options, console):
    from personaemp.build.stats import write_stats

    return results.of_stats(write_stats(options.processed, options.out_dir, options.force))


def _push(options, console):
    from personaemp.build.publish import publish
    from personaemp.review.agreement import card_quality

    dry = options.is_dry_run
    made = results.of_publish(
        publish(
            options.splits, repo_id=None if dry else options.repo_id, out=options.out_dir if dry else None,
            private=options.private, revision=options.revision, include_dialogue=options.include_dialogue,
            criteria=options.criteria, quality=card_quality, force=options.force,
        )
    )  # fmt: skip
    if dry and not options.dry_run and not getattr(made.report, "unchanged_since", None):
        console.print("no repo_id: a dry run, the repository that would be pushed goes to a folder")
    return made


async def _criteria(options, console, llm, retry=False):
    from personaemp.evaluation.criteria import awrite_criteria

    report = await awrite_criteria(
        options.input, options.output, llm, limit=options.limit, users=options.users,
        retry_failed=retry, layout=options.layout, console=console,
    )  # fmt: skip
    return results.of_llm_stage(report)


async def _respond(options, console, llm, retry=False):
    from personaemp.evaluation.respond import awrite_responses

    report = await awrite_responses(
        options.splits, options.output_path, llm, split=options.split, part=options.part,
        context=options.context, rag_k=options.rag_k, mismatch_seed=options.mismatch_seed,
        limit=options.limit, retry_failed=retry, console=console,
    )  # fmt: skip
    return results.of_llm_stage(report)


def _export(options, console) -> dict:
    from personaemp.training.export import write_export

    return write_export(
        options.splits, options.output_path, format=options.format, split=options.split,
        part=options.part, context=options.context, rag_k=options.rag_k,
        mismatch_seed=options.mismatch_seed, summaries=options.summaries,
        criteria_file=options.criteria, data_source=options.data_source,
    )  # fmt: skip


async def _evaluate(options, console, llm, retry=False, env=None):
    from personaemp.evaluation import evaluate as stage

    report, evaluation = await stage.aevaluate(
        options.splits, [Path(path) for path in options.responses], options.output, llm,
        split=options.split, part=options.part, criteria_file=options.criteria,
        judge_model=options.judge_model, judges=stage.judge_panel(options, llm, env),
        options=stage.JudgeOptions(
            dynamic=options.dynamic, samples=options.samples, bystander=options.bystander,
            reward_lambda=options.reward_lambda, missing=options.missing,
            unreadable=options.unreadable, layout=options.layout,
        ),
        retry_failed=retry, console=console,
    )  # fmt: skip
    return results.of_evaluate(report, evaluation, options.output)


def _table(options, console) -> str:
    from personaemp.evaluation.table import write_table

    return write_table(
        [Path(p) for p in options.reports], options.output, options.format,
        harmonic=options.harmonic, digits=options.digits, judge=options.judge, systems=options.systems,
    )  # fmt: skip


async def _agreement(options, console, llm, retry=False):
    from personaemp.review.agreement import run_agreement

    return run_agreement(options, llm, console)


def _review(options, console):
    from personaemp.review.page import serve_review

    serve_review(options, console)


# --- the summaries a command and `run` print ------------------------------------------------------


def print_memory_summary(summary, console: Console) -> None:
    from personaemp.build.memories import print_summary

    print_summary(summary, console)


def _llm_summary(then: Callable[[Any, Console], None] | None = None):
    def show(result, console: Console) -> None:
        summaries.print_stage_report(result.report, console)
        if then is not None and summaries.wrote_rows(result.report):
            then(result, console)

    return show


def _evaluate_summary(result, console: Console) -> None:
    for report in result.judges or [result.report]:  # a panel: one per judge
        summaries.print_stage_report(report, console)


# --- the stages ----------------------------------------------------------------------------------

STAGES: dict[str, Stage] = {
    stage.command: stage
    for stage in (
        Stage(
            "extract-memories", "extract_memories", _extract,
            "Extract AlpsBench-style memories and intents from your own conversation logs (LLM), for "
            "`filter`.",
            _llm_summary(lambda result, console: print_memory_summary(result.summary, console)),
        ),
        Stage(
            "filter", "filter_users", _filter,
            "Keep the users whose memories show personality and emotionally relevant experience.",
            lambda result, console: summaries.print_filter_summary(result.report, console),
        ),
        Stage(
            "infer-persona", "infer_personas", _persona,
            "Infer an evidence-grounded persona and Big Five levels for each filtered user (LLM).",
            _llm_summary(lambda result, console: summaries.print_persona_summary(result.summary, console)),
            fresh=True,
        ),
        Stage(
            "gen-queries", "generate_queries", _queries,
            "Write empathy-seeking queries (ES, HEQ, SS) for each eligible persona and check them (LLM).",
            _llm_summary(lambda result, console: summaries.print_query_funnel(result.summary, console)),
            fresh=True,
        ),
        Stage(
            "split", "split_users", _split,
            "Split users into train/test: random 9:1, and (unless --no-ood) a held-out Big Five cluster.",
            lambda result, console: summaries.print_split_report(result.report, result.output, console),
            positional=("input", "out_dir"),
        ),
        Stage(
            "stats", "write_stats", _stats,
            "Describe a build: funnel, Big Five levels, queries, checks, as stats.json, plots and a summary.",
            lambda result, console: summaries.print_stats(result.report, console),
            positional=("processed", "out_dir"),
        ),
        Stage(
            "push", "publish", _push,
            "Publish the splits as a Hub dataset (configs random and ood) with a dataset card;\n"
            "    without --repo-id, or with --dry-run, write the same repository to --out-dir.",
            summaries.print_push, positional=("splits",),
        ),
        Stage(
            "criteria", "write_criteria", _criteria,
            "Write 4-6 weighted evaluation criteria per query and PERM dimension, seeing no response (LLM).",
            _llm_summary(),
        ),
        Stage(
            "respond", "write_responses", _respond,
            "Have a policy model answer every query of a split, with the chosen context (LLM).",
            _llm_summary(),  # its last line says what it wrote
            positional=("splits", "output"),
        ),
        Stage(
            "export", "export_split", _export,
            "Write a split as training files: TRL's conversational prompts (JSON lines) or verl's parquet,\n"
            "    with the prompts `respond` sends and what the PereGRM reward reads.",
            lambda made, console: console.print(
                f"wrote {made['rows']} rows ({made['format']}) to {made['output']}"
            ),
            positional=("splits", "output"),
        ),
        Stage(
            "evaluate", "evaluate", _evaluate,
            "Score systems' responses per PERM dimension (fixed criteria, or dynamic @k), side by side "
            "(LLM).",
            _evaluate_summary, positional=("splits",),
        ),
        Stage(
            "table", "write_table", _table,
            "Render the paper's Table 1 (systems x judge x split: Res, Exp, Rec, Avg) from evaluate reports.",
            positional=(),
        ),
        Stage(
            "review", "serve_review", _review,
            "Serve a local page to label a stratified sample of queries: accept/reject, agree with the\n"
            "    judge or not, traits supported or not, a note; every click goes to the labels file.",
            positional=("input",), progress=True,
        ),
        Stage(
            "agreement", "measure_agreement", _agreement,
            "How far the LLM judge agrees with people (kappa, intervals, precision, corrected pass\n"
            "    shares) and, with --judge-model, with a second judge re-running the check step.",
            positional=("input",),
        ),
    )
}  # fmt: skip

RUN_COMMANDS = ("filter", "infer-persona", "gen-queries", "split", "stats", "push")


def signature_parameters(stage: Stage) -> list[inspect.Parameter]:
    """The stage's options as keyword arguments with the command's defaults (api.py)."""
    from personaemp.options import specs

    taken, out = set(stage.positional), []
    for section in stage.sections:
        for option in specs(section):
            if option.name not in taken:
                taken.add(option.name)
                out.append(
                    inspect.Parameter(
                        option.name, inspect.Parameter.KEYWORD_ONLY, default=option.default,
                        annotation=option.info.annotation,
                    )
                )  # fmt: skip
    return out
