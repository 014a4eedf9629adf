"""The stages for notebooks and scripts: `import personaemp as pe`.

Each function takes the options of its command as keyword arguments, named as the TOML
keys are (`pe.split_users(ood=False)`, `pe.infer_personas(limit=3, model=...)`), with the
command's defaults and the same resolution: argument > environment variable > `config`
(a personaemp.toml) > default, file paths following one another as in a config. Each
returns a `StageResult`; nothing is printed unless `progress=True` (rich bars and the
command's summaries, on stderr) or `progress=callback` (`callback(stage, completed,
total)`, total None while unknown).

The LLM stages have async twins (`await pe.ainfer_personas(...)`); their sync names work
inside a running event loop too (Jupyter), through personaemp.aio.run_sync.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from personaemp.aio import sync_twin
from personaemp.config import Resolver
from personaemp.options import COMMANDS, SECTIONS, renamed, spec, specs
from personaemp.progress import listening
from personaemp.results import StageResult

Progress = bool | Callable[[str, int, "int | None"], object]


def _resolve(command: str, given: dict[str, Any], config: str | Path | None) -> Resolver:
    """The command's sections from keyword arguments (routed by name), env vars and config."""
    sections = COMMANDS[command]
    flags: dict[str, dict[str, Any]] = {name: {} for name in sections}
    for key, value in given.items():
        if value is None:
            continue  # "not given": the default (or the config's value) applies
        section = next(
            (
                name
                for name in sections
                if key in SECTIONS[name].model_fields or key in renamed(SECTIONS[name])
            ),
            None,
        )
        if section is None:
            known = sorted({field for name in sections for field in SECTIONS[name].model_fields})
            raise TypeError(f"{command}: unknown option {key!r}; the options are {', '.join(known)}")
        if (
            isinstance(value, os.PathLike)
            and spec(section, renamed(SECTIONS[section]).get(key, key)).base is str
        ):
            value = os.fspath(value)
        flags[section][key] = value
    resolver = Resolver(Path(config) if config is not None else None, flags=flags, style="python")
    from personaemp.paths import check_command

    check_command(command, resolver.section, toml=True)
    return resolver


@contextlib.contextmanager
def _reporting(progress: Progress) -> Iterator[Console]:
    """The console a stage draws on: stderr when asked (progress=True), else a silent one."""
    if progress is True:
        yield Console(stderr=True, soft_wrap=True)
        return
    with listening(progress if callable(progress) else None):
        yield Console(quiet=True)


def _printed(progress: Progress, console: Console, show: Callable[[Console], object]) -> None:
    if progress is True:  # the command's summary too
        show(console)


def _llm_settings(settings, resolver: Resolver):
    if settings is None:
        from personaemp.config import llm_settings

        return llm_settings(resolver.llm)
    given = {key for key in resolver.flags.get("llm", {}) if key != "retry_failed"}
    if given:
        raise TypeError(
            f"give settings=LLMSettings(...) or LLM options ({', '.join(sorted(given))}), not both"
        )
    return settings


async def _llm_stage(
    command: str, values: dict[str, Any], config, settings, progress: Progress, call, show=None
):
    """An LLM stage: its options resolved, its engine (`settings`, or the LLM options), then
    `call` (a pipeline.acall_*) on its section; `show(report, console)` with progress=True."""
    resolver = _resolve(command, values, config)
    engine = _llm_settings(settings, resolver)
    with _reporting(progress) as console:
        result = await call(resolver.section(COMMANDS[command][0]), resolver.llm, console, settings=engine)
        if show is not None:
            _printed(progress, console, lambda c: show(result.report, c))
    return result


# --- the stages ----------------------------------------------------------------------------------


def filter_users(
    input: str | Path | None = None,  # noqa: A002 - the option's name
    output: str | Path | None = None,
    *,
    config: str | Path | None = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp filter`: keep the users whose memories show personality and emotionally
    relevant experience. Rows: `result.rows()`; the funnel: `result.report`."""
    from personaemp import pipeline, summaries

    resolver = _resolve("filter", {"input": input, "output": output, **options}, config)
    with _reporting(progress) as console:
        result = pipeline.call_filter(resolver.filter, console)
        _printed(progress, console, lambda c: summaries.print_filter_summary(result.report, c))
    return result


async def ainfer_personas(
    input: str | Path | None = None,  # noqa: A002
    output: str | Path | None = None,
    *,
    settings=None,
    config: str | Path | None = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp infer-persona`: an evidence-grounded persona and Big Five levels per user.
    The endpoint: LLM options (`base_url=`, `model=`, ...) or `settings=pe.LLMSettings(...)`."""
    from personaemp import pipeline, summaries

    values = {"input": input, "output": output, **options}
    return await _llm_stage(
        "infer-persona",
        values,
        config,
        settings,
        progress,
        pipeline.acall_persona,
        summaries.print_stage_report,
    )


async def agenerate_queries(
    input: str | Path | None = None,  # noqa: A002
    output: str | Path | None = None,
    *,
    settings=None,
    config: str | Path | None = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp gen-queries`: empathy-seeking queries (ES, HEQ, SS) per eligible persona,
    checked; the funnel is `result.summary`."""
    from personaemp import pipeline, summaries

    values = {"input": input, "output": output, **options}
    return await _llm_stage(
        "gen-queries",
        values,
        config,
        settings,
        progress,
        pipeline.acall_queries,
        summaries.print_stage_report,
    )


def split_users(
    input: str | Path | None = None,  # noqa: A002
    out_dir: str | Path | None = None,
    *,
    config: str | Path | None = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp split`: train/test by user, random 9:1 and (unless ood=False) a held-out
    Big Five cluster. A part's rows: `result.rows("random/test")`."""
    from personaemp import pipeline, summaries

    resolver = _resolve("split", {"input": input, "out_dir": out_dir, **options}, config)
    with _reporting(progress) as console:
        result = pipeline.call_split(resolver.split)
        _printed(progress, console, lambda c: summaries.print_split_report(result.report, result.output, c))
    return result


def write_stats(
    processed: str | Path | None = None,
    out_dir: str | Path | None = None,
    *,
    config: str | Path | None = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp stats`: stats.json and the plots of a build."""
    from personaemp import pipeline, summaries

    resolver = _resolve("stats", {"processed": processed, "out_dir": out_dir, **options}, config)
    with _reporting(progress) as console:
        result = pipeline.call_stats(resolver.stats)
        _printed(progress, console, lambda c: summaries.print_stats(result.report, c))
    return result


def publish(
    splits: str | Path | None = None,
    *,
    config: str | Path | None = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp push`: the splits as a Hub dataset (`repo_id=`), or with `dry_run=True`
    (or no repo_id) the same repository written to a folder."""
    from personaemp import pipeline

    resolver = _resolve("push", {"splits": splits, **options}, config)
    with _reporting(progress):
        return pipeline.call_push(resolver.push)


async def awrite_criteria(
    input: str | Path | None = None,  # noqa: A002
    output: str | Path | None = None,
    *,
    settings=None,
    config: str | Path | None = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp criteria`: weighted evaluation criteria per query and PERM dimension."""
    from personaemp import pipeline

    values = {"input": input, "output": output, **options}
    return await _llm_stage("criteria", values, config, settings, progress, pipeline.acall_criteria)


async def awrite_responses(
    splits: str | Path | None = None,
    output: str | Path | None = None,
    *,
    settings=None,
    config: str | Path | None = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp respond`: a policy model's response to every query of a split part."""
    from personaemp import pipeline

    values = {"splits": splits, "output": output, **options}
    return await _llm_stage("respond", values, config, settings, progress, pipeline.acall_respond)


async def aevaluate(
    splits: str | Path | None = None,
    *,
    settings=None,
    config: str | Path | None = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp evaluate`: systems' responses scored per PERM dimension; the evaluation
    (scores per system) is `result.summary`."""
    from personaemp import pipeline

    values = {"splits": splits, **options}
    return await _llm_stage("evaluate", values, config, settings, progress, pipeline.acall_evaluate)


def write_table(
    *,
    config: str | Path | None = None,
    progress: Progress = False,
    **options: Any,
) -> str:
    """`personaemp table`: the paper's Table 1 from evaluate reports (the text; written to
    `output=` when given)."""
    from personaemp.evaluation.table import write_table as render

    chosen = _resolve("table", options, config).section("table")
    return render(
        [Path(p) for p in chosen.reports], chosen.output, chosen.format,
        harmonic=chosen.harmonic, digits=chosen.digits, judge=chosen.judge, systems=chosen.systems,
    )  # fmt: skip


def export_split(
    splits: str | Path | None = None,
    output: str | Path | None = None,
    *,
    config: str | Path | None = None,
    progress: Progress = False,
    **options: Any,
) -> dict[str, Any]:
    """`personaemp export`: a split as training files (TRL JSON lines or verl parquet)."""
    from personaemp import pipeline

    resolver = _resolve("export", {"splits": splits, "output": output, **options}, config)
    with _reporting(progress) as console:
        return pipeline.run_export(resolver.section("export"), console)


def measure_agreement(
    input: str | Path | None = None,  # noqa: A002
    *,
    config: str | Path | None = None,
    progress: Progress = False,
    **options: Any,
) -> dict[str, Any]:
    """`personaemp agreement`: the judge against people (and a second judge); the figures."""
    from personaemp.review.agreement import run_agreement

    resolver = _resolve("agreement", {"input": input, **options}, config)
    with _reporting(progress) as console:
        return run_agreement(resolver.section("agreement"), resolver.llm, console)


def serve_review(
    input: str | Path | None = None,  # noqa: A002
    *,
    config: str | Path | None = None,
    progress: Progress = True,
    **options: Any,
) -> None:
    """`personaemp review`: serve the labelling page until interrupted (blocks)."""
    from personaemp.review.page import serve_review as serve

    resolver = _resolve("review", {"input": input, **options}, config)
    with _reporting(progress) as console:
        serve(resolver.section("review"), console)


def run_pipeline(
    config: str | Path | None = None, *, progress: Progress = False, **sections: Any
) -> dict[str, StageResult]:
    """`personaemp run`: filter -> infer-persona -> gen-queries -> split -> stats -> push from a
    config, resuming. `sections` override its tables: `run_pipeline(paths={"input": ...},
    llm={"base_url": [...], "model": ...})`. Returns the stages' results by stage name."""
    from personaemp import pipeline

    flags = {name: dict(values) for name, values in sections.items()}
    unknown = sorted(set(flags) - set(SECTIONS))
    if unknown:
        raise TypeError(f"run_pipeline: unknown section(s) {', '.join(unknown)}; use {', '.join(SECTIONS)}")
    resolver = Resolver(Path(config) if config is not None else None, flags=flags, style="python")
    options = resolver.all()
    with _reporting(progress) as console:
        return pipeline.run_pipeline(options, console).results


infer_personas = sync_twin(ainfer_personas)
generate_queries = sync_twin(agenerate_queries)
write_criteria = sync_twin(awrite_criteria)
write_responses = sync_twin(awrite_responses)
evaluate = sync_twin(aevaluate)


# --- signatures: every option of the command, with its default, for help() and completion ----


def _with_options(function: Callable[..., Any], command: str) -> None:
    """Replace `**options` in the function's signature by the command's options (keyword
    arguments with the command's defaults), and list them in its docstring."""
    signature = inspect.signature(function)
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    taken = {p.name for p in own}
    added, lines = [], []
    for section in COMMANDS[command]:
        for option in specs(section):
            if option.name in taken:
                continue
            taken.add(option.name)
            added.append(
                inspect.Parameter(
                    option.name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=option.default,
                    annotation=option.info.annotation,
                )
            )
            lines.append(f"        {option.name}: {option.help}")
    function.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
    function.__doc__ = (
        (function.__doc__ or "") + "\n\n    Options (as `personaemp " + command + "`):\n" + "\n".join(lines)
    )


for _function, _command in (
    (filter_users, "filter"),
    (split_users, "split"),
    (write_stats, "stats"),
    (publish, "push"),
    (ainfer_personas, "infer-persona"),
    (agenerate_queries, "gen-queries"),
    (awrite_criteria, "criteria"),
    (awrite_responses, "respond"),
    (aevaluate, "evaluate"),
    (write_table, "table"),
    (export_split, "export"),
    (measure_agreement, "agreement"),
    (serve_review, "review"),
):
    _with_options(_function, _command)
for _twin, _async in (
    (infer_personas, ainfer_personas),
    (generate_queries, agenerate_queries),
    (write_criteria, awrite_criteria),
    (write_responses, awrite_responses),
    (evaluate, aevaluate),
):
    _twin.__signature__ = _async.__signature__  # type: ignore[attr-defined]
    _twin.__doc__ = (
        f"{_async.__doc__}\n\n    The sync twin of `{_async.__name__}` (works in a running loop too)."
    )
