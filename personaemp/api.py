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
from typing import TYPE_CHECKING, Any

from rich.console import Console

from personaemp.aio import run_sync
from personaemp.catalogue import COMMANDS
from personaemp.config import Resolver
from personaemp.errors import python_caller
from personaemp.options import renamed, spec
from personaemp.options import sections as declared_sections
from personaemp.progress import listening
from personaemp.registry import STAGES
from personaemp.results import StageResult

if TYPE_CHECKING:
    from personaemp.llm.settings import LLMSettings

Progress = bool | Callable[[str, int, "int | None"], object]
PathLike = str | Path | None
PATH = "str | Path | None"


def _resolve(command: str, given: dict[str, Any], config: str | Path | None) -> Resolver:
    """The command's sections from keyword arguments (routed by name), env vars and config."""
    from personaemp.paths import check_command

    names, models = COMMANDS[command], declared_sections()
    owner = {key: (name, renamed(models[name]).get(key, key)) for name in reversed(names)  # first wins
             for key in [*models[name].model_fields, *renamed(models[name])]}  # fmt: skip
    flags: dict[str, dict[str, Any]] = {name: {} for name in names}
    for key, value in given.items():
        if value is None:
            continue  # "not given": the default (or the config's value) applies
        if key not in owner:
            known = sorted({field for name in names for field in models[name].model_fields})
            raise TypeError(f"{command}: unknown option {key!r}; the options are {', '.join(known)}")
        section, field = owner[key]
        if isinstance(value, os.PathLike) and spec(section, field).base is str:
            value = os.fspath(value)
        flags[section][key] = value
    resolver = Resolver(Path(config) if config is not None else None, flags=flags, style="python")
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


# --- the stages: one function each, written out; each resolves its options, then runs the stage --


def _run(command: str, given: dict[str, Any], options: dict[str, Any], config, progress: Progress):
    """A stage on its options: positional `given` and keyword `options`, resolved as the command's."""
    with python_caller():
        resolver = _resolve(command, {**given, **options}, config)
        with _reporting(progress) as console:
            return STAGES[command].run(resolver, console)


async def _arun(
    command: str, given: dict[str, Any], options: dict[str, Any], settings, config, progress: Progress
):
    """An LLM stage on its options (the endpoint: LLM options, or `settings`), awaited."""
    with python_caller():
        resolver = _resolve(command, {**given, **options}, config)
        engine = _llm_settings(settings, resolver)
        with _reporting(progress) as console:
            return await STAGES[command].arun(resolver, console, llm=engine)


def __getattr__(name: str):
    """A stage of the catalogue not written out below yet (one just added): its function,
    made from its line (tests/integration/test_api.py asks for every stage's to be written out)."""
    from personaemp.catalogue import LINES

    for line in LINES:
        if name in (line.function, "a" + line.function) and line.function not in _WRITTEN:
            return _made_for(line, asynchronous=name.startswith("a") and name != line.function)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _made_for(line, asynchronous: bool):
    def function(*args, config=None, progress=line.progress, settings=None, **options):
        if len(args) > len(line.positional):
            raise TypeError(f"{line.function}() takes {len(line.positional)} positional arguments")
        given = dict(zip(line.positional, args, strict=False))
        if not line.llm:
            return _run(line.command, given, options, config, progress)
        coroutine = _arun(line.command, given, options, settings, config, progress)
        return coroutine if asynchronous else run_sync(coroutine)

    function.__doc__ = f"`personaemp {line.command}`: {inspect.cleandoc(line.help)}"
    return function


_WRITTEN = {
    "extract_memories",
    "filter_users",
    "infer_personas",
    "generate_queries",
    "generate_dialogues",
    "split_users",
    "write_stats",
    "publish",
    "write_criteria",
    "write_responses",
    "export_split",
    "evaluate",
    "write_table",
    "serve_review",
    "measure_agreement",
}  # the stages written out below


async def aextract_memories(
    input: PathLike = None,
    output: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp extract-memories`: Extract AlpsBench-style memories and intents from your own
    conversation logs (LLM), for `filter`.

    Options: the keys of [extract] and [llm] (docs/options.md), as keywords; or `settings=`."""
    return await _arun(
        "extract-memories", {"input": input, "output": output}, options, settings, config, progress
    )


def extract_memories(
    input: PathLike = None,
    output: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """The sync twin of `aextract_memories` (works in a running loop too)."""
    return run_sync(
        aextract_memories(input, output, settings=settings, config=config, progress=progress, **options)
    )


def filter_users(
    input: PathLike = None,
    output: PathLike = None,
    *,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp filter`: Keep the users whose memories show personality and emotionally relevant
    experience.

    Options: the keys of [filter] (docs/options.md), as keywords."""
    return _run("filter", {"input": input, "output": output}, options, config, progress)


async def ainfer_personas(
    input: PathLike = None,
    output: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp infer-persona`: Infer an evidence-grounded persona and Big Five levels for each filtered
    user (LLM).

    Options: the keys of [persona] and [llm] (docs/options.md), as keywords; or `settings=`."""
    return await _arun(
        "infer-persona", {"input": input, "output": output}, options, settings, config, progress
    )


def infer_personas(
    input: PathLike = None,
    output: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """The sync twin of `ainfer_personas` (works in a running loop too)."""
    return run_sync(
        ainfer_personas(input, output, settings=settings, config=config, progress=progress, **options)
    )


async def agenerate_queries(
    input: PathLike = None,
    output: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp gen-queries`: Write empathy-seeking queries (ES, HEQ, SS) for each eligible persona and
    check them (LLM).

    Options: the keys of [queries] and [llm] (docs/options.md), as keywords; or `settings=`."""
    return await _arun("gen-queries", {"input": input, "output": output}, options, settings, config, progress)


def generate_queries(
    input: PathLike = None,
    output: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """The sync twin of `agenerate_queries` (works in a running loop too)."""
    return run_sync(
        agenerate_queries(input, output, settings=settings, config=config, progress=progress, **options)
    )


async def agenerate_dialogues(
    input: PathLike = None,
    output: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp gen-dialogues`: Simulate multi-turn conversations: each accepted query's user, grounded
    in their memories and persona with a hidden need, talks with the supporter under test (LLM).

    Options: the keys of [dialogues] and [llm] (docs/options.md), as keywords; or `settings=`."""
    return await _arun(
        "gen-dialogues", {"input": input, "output": output}, options, settings, config, progress
    )


def generate_dialogues(
    input: PathLike = None,
    output: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """The sync twin of `agenerate_dialogues` (works in a running loop too)."""
    return run_sync(
        agenerate_dialogues(input, output, settings=settings, config=config, progress=progress, **options)
    )


async def ameasure_fidelity(
    input: PathLike = None,
    output: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp fidelity`: Measure the simulated user against the real person: the next real message
    held out, each context variant between the self and other controls, deterministic style metrics (LLM).

    Options: the keys of [fidelity] and [llm] (docs/options.md), as keywords; or `settings=`."""
    return await _arun("fidelity", {"input": input, "output": output}, options, settings, config, progress)


def measure_fidelity(
    input: PathLike = None,
    output: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """The sync twin of `ameasure_fidelity` (works in a running loop too)."""
    return run_sync(
        ameasure_fidelity(input, output, settings=settings, config=config, progress=progress, **options)
    )


def split_users(
    input: PathLike = None,
    out_dir: PathLike = None,
    *,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp split`: Split users into train/test: random 9:1, and (unless --no-ood) a held-out Big
    Five cluster.

    Options: the keys of [split] (docs/options.md), as keywords."""
    return _run("split", {"input": input, "out_dir": out_dir}, options, config, progress)


def write_stats(
    processed: PathLike = None,
    out_dir: PathLike = None,
    *,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp stats`: Describe a build: funnel, Big Five levels, queries, checks, as stats.json, plots
    and a summary.

    Options: the keys of [stats] (docs/options.md), as keywords."""
    return _run("stats", {"processed": processed, "out_dir": out_dir}, options, config, progress)


def publish(
    splits: PathLike = None, *, config: PathLike = None, progress: Progress = False, **options: Any
) -> StageResult:
    """`personaemp push`: Publish the splits as a Hub dataset (configs random and ood) with a dataset card;
    without --repo-id, or with --dry-run, write the same repository to --out-dir.

    Options: the keys of [push] (docs/options.md), as keywords."""
    return _run("push", {"splits": splits}, options, config, progress)


async def awrite_criteria(
    input: PathLike = None,
    output: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp criteria`: Write 4-6 weighted evaluation criteria per query and PERM dimension, seeing
    no response (LLM).

    Options: the keys of [criteria] and [llm] (docs/options.md), as keywords; or `settings=`."""
    return await _arun("criteria", {"input": input, "output": output}, options, settings, config, progress)


def write_criteria(
    input: PathLike = None,
    output: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """The sync twin of `awrite_criteria` (works in a running loop too)."""
    return run_sync(
        awrite_criteria(input, output, settings=settings, config=config, progress=progress, **options)
    )


async def awrite_responses(
    splits: PathLike = None,
    output: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp respond`: Have a policy model answer every query of a split, with the chosen context
    (LLM).

    Options: the keys of [respond] and [llm] (docs/options.md), as keywords; or `settings=`."""
    return await _arun("respond", {"splits": splits, "output": output}, options, settings, config, progress)


def write_responses(
    splits: PathLike = None,
    output: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """The sync twin of `awrite_responses` (works in a running loop too)."""
    return run_sync(
        awrite_responses(splits, output, settings=settings, config=config, progress=progress, **options)
    )


def export_split(
    splits: PathLike = None,
    output: PathLike = None,
    *,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp export`: Write a split as training files: TRL's conversational prompts (JSON lines) or
    verl's parquet, with the prompts `respond` sends and what the PereGRM reward reads.

    Options: the keys of [export] (docs/options.md), as keywords."""
    return _run("export", {"splits": splits, "output": output}, options, config, progress)


async def aevaluate(
    splits: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp evaluate`: Score systems' responses per PERM dimension (fixed criteria, or dynamic @k),
    side by side (LLM); with --dialogues, whole dialogues: the emotion trajectory and PERM over the
    supporter's side.

    Options: the keys of [evaluate] and [llm] (docs/options.md), as keywords; or `settings=`."""
    return await _arun("evaluate", {"splits": splits}, options, settings, config, progress)


def evaluate(
    splits: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """The sync twin of `aevaluate` (works in a running loop too)."""
    return run_sync(aevaluate(splits, settings=settings, config=config, progress=progress, **options))


def write_table(*, config: PathLike = None, progress: Progress = False, **options: Any) -> str:
    """`personaemp table`: Render the paper's Table 1 (systems x judge x split: Res, Exp, Rec, Avg) from
    evaluate reports; from evaluate --dialogues reports, the multi-turn table (final emotion, need
    met, H, n).

    Options: the keys of [table] (docs/options.md), as keywords."""
    return _run("table", {}, options, config, progress)


def serve_review(
    input: PathLike = None, *, config: PathLike = None, progress: Progress = True, **options: Any
) -> StageResult:
    """`personaemp review`: Serve a local page to label a stratified sample of queries: accept/reject,
    agree with the judge or not, traits supported or not, a note; every click goes to the labels
    file.

    Options: the keys of [review] (docs/options.md), as keywords."""
    return _run("review", {"input": input}, options, config, progress)


async def ameasure_agreement(
    input: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """`personaemp agreement`: How far the LLM judge agrees with people (kappa, intervals, precision,
    corrected pass shares) and, with --judge-model, with a second judge re-running the check step.

    Options: the keys of [agreement] and [llm] (docs/options.md), as keywords; or `settings=`."""
    return await _arun("agreement", {"input": input}, options, settings, config, progress)


def measure_agreement(
    input: PathLike = None,
    *,
    settings: LLMSettings | None = None,
    config: PathLike = None,
    progress: Progress = False,
    **options: Any,
) -> StageResult:
    """The sync twin of `ameasure_agreement` (works in a running loop too)."""
    return run_sync(ameasure_agreement(input, settings=settings, config=config, progress=progress, **options))


def merge_shards(
    stage: str,
    input: PATH = None,  # noqa: A002 - named as the command's flag
    output: PATH = None,
    *,
    config: str | Path | None = None,
    progress: Progress = False,
) -> StageResult:
    """`personaemp merge STAGE`: join the shard files of an LLM stage run with `shard="I/N"`
    (infer-persona or gen-queries) into its output, checking that every user is in exactly
    one shard (a quick look's shards: the users it picked). `input` and `output` default to
    the stage's paths in `config`, as the command's do. Returns the merge's StageResult."""
    from personaemp.config import load_config
    from personaemp.dataset.merge import from_options

    paths = {name: Path(value) for name, value in (("input_path", input), ("output", output)) if value}
    with _reporting(progress) as console:
        return from_options(stage, load_config(Path(config) if config else None), console, **paths)


def run_pipeline(
    config: str | Path | None = None, *, progress: Progress = False, **sections: Any
) -> dict[str, StageResult]:
    """`personaemp run`: filter -> infer-persona -> gen-queries -> split -> stats -> push from a
    config, resuming. `sections` override its tables: `run_pipeline(paths={"input": ...},
    llm={"base_url": [...], "model": ...})`. Returns the stages' results by stage name."""
    from personaemp import pipeline

    flags = {name: dict(values) for name, values in sections.items()}
    known = declared_sections()
    unknown = sorted(set(flags) - set(known))
    if unknown:
        raise TypeError(f"run_pipeline: unknown section(s) {', '.join(unknown)}; use {', '.join(known)}")
    resolver = Resolver(Path(config) if config is not None else None, flags=flags, style="python")
    options = resolver.all()
    with _reporting(progress) as console:
        return pipeline.run_pipeline(options, console).results
