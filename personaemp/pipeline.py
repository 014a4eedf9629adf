"""`personaemp run`: filter -> infer-persona -> gen-queries -> split -> stats -> push from one
config, each stage as registry.STAGES declares it (the same call as its command). Finished
LLM work is skipped through the stages' own resume (and the cache), so re-running the
pipeline after a crash or an edit redoes only what changed.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from personaemp import results
from personaemp.catalogue import RUN_COMMANDS
from personaemp.config import llm_settings
from personaemp.registry import STAGES, RunOptions
from personaemp.results import StageResult, stop_if_failed
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

    @contextlib.contextmanager
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


def persona_and_queries(
    options: RunOptions,
    console: Console,
    env: Mapping[str, str] | None = None,
    meanwhile: Callable[[], object] | None = None,
    stream=None,
) -> tuple[StageResult, StageResult]:
    """`run`'s two LLM stages on one engine, a user going on to gen-queries as soon as its
    persona is written (llm.stage.run_llm_chain); each stage's files and report as alone.
    `meanwhile` is called once the first requests are going out. `stream`: infer-persona's
    input as the filter writes it (streaming.FilterFeed), whose summary is printed first."""
    from personaemp.dataset import filter as filter_stage
    from personaemp.dataset import persona, queries
    from personaemp.llm.stage import run_llm_chain

    # In `run`, a [persona] limit is the size of the build, not a quick look: the card quotes it.
    retry = options.llm.retry_failed
    first = persona.persona_stage(
        options.persona.input, options.persona.output, **persona.persona_args(options.persona, retry),
        full=True, stream=stream,
    )  # fmt: skip
    second = queries.queries_stage(
        options.queries.input, options.queries.output, **queries.queries_args(options.queries, retry),
        full=True, chained=True,
    )  # fmt: skip
    written = functools.cache(lambda: _personas_written(options.queries.input))  # read once, at the end
    reports = run_llm_chain(
        first, second, queries.handoff, lambda: written()[0],
        settings=llm_settings(options.llm, env), console=console, meanwhile=meanwhile,
    )  # fmt: skip
    if written.cache_info().currsize:  # read as the chain ended: the funnel counts over it
        second.units, second.skipped = written()
    if stream is not None:
        filter_stage.print_funnel(stream.report, console)
    personas = results.of_llm_stage(reports[0], persona.summarize(first.output, first.picked()))
    STAGES["infer-persona"].summary(personas, console)
    stop_if_failed(personas)  # gen-queries had no persona to work on
    made = (personas, results.of_llm_stage(reports[1], queries.funnel(second)))
    STAGES["gen-queries"].summary(made[1], console)
    return made


def _personas_written(path: Path):
    """The chain's personas; none when every one failed (`run` then stops with that line)."""
    from personaemp.dataset import queries
    from personaemp.io import StageRows

    if path.exists() and path.stat().st_size == 0:
        return StageRows(path, [], []), 0
    return queries.read_personas(path)


def chains(options: RunOptions) -> bool:
    """Whether `run` can feed gen-queries while infer-persona runs (in one process or on
    Ray): not for a batch (rounds of files), nor when gen-queries picks its users (--limit /
    --users need its whole input)."""
    return (
        options.llm.batch is None
        and options.llm.llm != "vllm"  # rounds too
        and options.queries.limit is None
        and not options.queries.users
        and options.queries.input == options.persona.output
    )


def streams(options: RunOptions) -> bool:
    """Whether `run` can hand infer-persona the filter's users as the filter writes them
    (streaming.py): not when infer-persona picks its users (--limit / --users)."""
    from personaemp.dataset.streaming import can_stream

    return (
        can_stream()
        and options.persona.limit is None
        and not options.persona.users
        and options.persona.input == options.filter.output
    )


def _background_imports(on_ray: bool = False):
    """Loaded while the LLM stages wait on the endpoint (they took 3.5 of the 9 s of a `run`
    with nothing left to ask): first the language model, which gen-queries' checks need
    within seconds (loaded there, it stopped the event loop and 32 requests' replies for
    half a second; on Ray the workers check, and load it), then what split, stats and push
    import."""
    from personaemp.language import _identifier
    from personaemp.parallel import BackgroundImports

    later = ("kmodes.kmodes", "datasets", "matplotlib.figure", "matplotlib.backends.backend_agg")
    return BackgroundImports(*later) if on_ray else BackgroundImports(_identifier, *later)


def run_pipeline(
    options: RunOptions, console: Console, env: Mapping[str, str] | None = None
) -> PipelineResult:
    """Every stage in order, each from its section of `options` (see config.load_config)."""
    from personaemp.paths import check_command

    for command in RUN_COMMANDS:  # before any stage writes
        check_command(command, functools.partial(getattr, options), toml=True)
    from personaemp.errors import InputError

    if not llm_settings(options.llm, env).uses_local and not options.llm.model:
        # (said by the first LLM stage too, but after the filter ran: here before any stage)
        raise InputError("no model given for the endpoint", "pass --model or set PERSONAEMP_MODEL")
    if options.persona.shard or options.queries.shard:
        raise InputError(
            "run does not work on shards: split and push need every user",
            "run infer-persona / gen-queries --shard I/N on each machine, then personaemp merge",
        )
    from personaemp.sources.logs import is_conversation_log

    result = PipelineResult()
    if is_conversation_log(str(options.filter.input)):  # no memories yet: extract them first
        options = _from_conversations(options, console, env, result)
        if options is None:
            return result  # --estimate, or a batch round still out
    if options.llm.estimate:
        return estimate_pipeline(options, console, env)
    result = _run_stages(options, console, env, result)
    result.print_timings(console)
    return result


def _from_conversations(options: RunOptions, console: Console, env, result: PipelineResult):
    """extract-memories on the log `filter` would read; then `filter` reads its records (the
    AlpsBench raw-export shape). None when the run stops there (estimate, batch round)."""
    log = options.filter.input
    options = options.model_copy(update={"extract": options.extract.model_copy(update={"input": log})})
    with result.stage("extract-memories", console):
        made = STAGES["extract-memories"].run(options, console, env=env, full=True)
        result.add("extract-memories", made)
    stop_if_failed(made)
    if options.llm.estimate or waits_for_a_batch(made.report):
        return None
    into = {"input": options.extract.output, "format": "raw"}
    return options.model_copy(update={"filter": options.filter.model_copy(update=into)})


CHAIN = "infer-persona → gen-queries"  # run's record of the two LLM stages (manifest.py)


def _chain(options: RunOptions) -> list[tuple[str, Any]]:
    return [("persona", options.persona), ("queries", options.queries)]


def _skipped_chain(options: RunOptions, console: Console, result: PipelineResult) -> bool:
    """A re-run whose filter and LLM stages are all current reads none of their files: one
    line each (the filter's own, then the chain's)."""
    from personaemp.dataset.filter import filter_args, filter_is_current
    from personaemp.manifest import LLMBooks

    if not filter_is_current(filter_args(options.filter)):
        return False
    books = LLMBooks(CHAIN, _chain(options), options.llm)
    last = books.current(options.persona.force or options.queries.force)
    if last is None:
        return False
    with result.stage("filter", console):
        result.add("filter", STAGES["filter"].run(options, console))
    console.print(books.unchanged(last))
    for name, section in (("infer-persona", options.persona), ("gen-queries", options.queries)):
        result.add(name, StageResult(name, section.output, counts=last["result"][name]))
    return True


def _record_chain(options: RunOptions, made) -> None:
    """The chain finished every unit: a later run with the same inputs may skip it."""
    from personaemp.manifest import LLMBooks

    # Stamped after the chain, not before as a stage alone: a streamed filter writes its input meanwhile.
    counts = {"infer-persona": made[0].counts, "gen-queries": made[1].counts}
    LLMBooks(CHAIN, _chain(options), options.llm).record(made, counts)


def _run_stages(
    options: RunOptions, console: Console, env: Mapping[str, str] | None, result: PipelineResult
) -> PipelineResult:
    chained = chains(options)
    if chained and _skipped_chain(options, console, result):
        return _split_stats_push(options, console, result)
    streamed = chained and streams(options)
    if not streamed:
        with result.stage("filter", console):
            result.add("filter", STAGES["filter"].run(options, console))
    if chained:
        from personaemp.dataset.filter import filter_args

        args = filter_args(options.filter)
        title = ("filter → " if streamed else "") + CHAIN
        with result.stage(title, console), _background_imports(options.llm.executor == "ray") as importing:
            with _filter_feed(args) if streamed else contextlib.nullcontext() as stream:
                made = persona_and_queries(options, console, env, importing.start, stream)
            if streamed:
                result.add("filter", results.of_filter(stream.report, args["report_path"]))
            result.add("infer-persona", made[0])
            result.add("gen-queries", made[1])
        stop_if_failed(made[1])  # (its personas: in the chain) the later stages would read nothing
        _record_chain(options, made)
        return _split_stats_push(options, console, result)
    # In `run`, a [persona] limit is the size of the build, not a quick look: the card quotes it.
    for name in ("infer-persona", "gen-queries"):
        with result.stage(name, console):
            made = result.add(name, STAGES[name].run(options, console, env=env, full=True))
        stop_if_failed(made)
        if waits_for_a_batch(made.report):
            return result  # --batch: the next stage starts when this one's rounds are done
    return _split_stats_push(options, console, result)


def _filter_feed(args: dict[str, Any]):
    from personaemp.dataset.streaming import FilterFeed

    return FilterFeed(args)


def _split_stats_push(options: RunOptions, console: Console, result: PipelineResult) -> PipelineResult:
    for name in ("split", "stats", "push"):
        title = "push (dry run)" if name == "push" and options.push.is_dry_run else name
        with result.stage(title, console):
            result.add(name, STAGES[name].run(options, console))
    return result


def _share_range(eligible: int, seen: int, coming: int, projected: dict) -> str:
    """How far the eligible share seen so far (`eligible` of `seen` personas) may be from the
    share of the users to come (Wilson 95%), and what that range makes of the projected users
    and prompt tokens: a look at 20 users that were all eligible does not say that all the
    others are."""
    from personaemp.instruments.judges import wilson

    low, high = wilson(eligible, seen)
    tokens = projected["prompt_tokens"] * seen / eligible if eligible else 0  # at a share of 100%
    return (
        f"; from {seen} personas the share is 95% likely {low:.0%}-{high:.0%}: "
        f"{round(coming * low)}-{round(coming * high)} users, "
        f"{round(tokens * low):,}-{round(tokens * high):,} prompt tokens"
    )


def estimate_pipeline(options: RunOptions, console: Console, env: Mapping[str, str] | None = None):
    """`run` with [llm] estimate: what the LLM stages would send now, writing nothing.

    The filter runs into a temporary folder; infer-persona is estimated on its output;
    gen-queries on the personas already written, plus, for the users whose persona is
    still to be written, its whole chain at the eligible share seen so far (else all)."""
    import tempfile

    from personaemp import summaries
    from personaemp.dataset import queries as queries_stage
    from personaemp.llm.estimate import project_from_cache
    from personaemp.records import Persona
    from personaemp.units import StageOutcome

    result = PipelineResult()
    with tempfile.TemporaryDirectory() as folder:
        filtered = Path(folder) / "filtered.jsonl"
        into = {"filter": options.filter.model_copy(update={"output": filtered}),
                "persona": options.persona.model_copy(update={"input": filtered})}  # fmt: skip
        estimated = options.model_copy(update=into)
        STAGES["filter"].run(estimated, Console(quiet=True))
        rule(console, "infer-persona --estimate")
        persona = result.add("infer-persona", STAGES["infer-persona"].run(estimated, console, env=env)).report
    written, rows = options.queries.input, []
    if written.exists():
        rule(console, "gen-queries --estimate (personas written)")
        result.add("gen-queries", STAGES["gen-queries"].run(options, console, env=env))
        rows = [Persona.model_validate_json(line) for line in written.read_text().splitlines()]
    eligible = sum(row.eligible for row in rows)
    share = eligible / len(rows) if rows else 1.0
    # Personas still to write: those needing requests, and those the cache alone would write.
    coming = persona.estimate["units_pending"] + persona.outcome.done
    units = round(coming * share)
    asked = persona.estimate["steps"]["persona"]
    first = (asked["prompt_tokens"] * 4 / max(asked["calls"], 1), "as persona")
    projected = project_from_cache([step.name for step in queries_stage.STEPS], units, first, options.llm)
    rule(console, "gen-queries --estimate (personas still to write)")
    later = SimpleNamespace(
        stage="gen-queries", model=persona.model, estimate=projected,
        outcome=StageOutcome(units=units, pending=units),
    )  # fmt: skip
    summaries.print_estimate(later, console)
    basis = "of the personas written" if rows else "assumed"
    console.print(
        f"({units} of the {coming} users still without a persona, at the eligible share {share:.0%} {basis}"
        + (_share_range(eligible, len(rows), coming, projected) if rows else "")
        + ")"
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
