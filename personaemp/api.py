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
from personaemp.catalogue import COMMANDS
from personaemp.config import Resolver
from personaemp.errors import python_caller
from personaemp.options import renamed, spec, specs
from personaemp.options import sections as declared_sections
from personaemp.progress import listening
from personaemp.registry import STAGES, Stage, signature_parameters
from personaemp.results import StageResult

Progress = bool | Callable[[str, int, "int | None"], object]
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


# --- the stages: one function each, derived from registry.STAGES --------------------------------


def _function(stage: Stage):
    """`pe.<stage.function>`: the stage's options as keyword arguments (its first ones also
    positional), resolved as the command resolves its flags; returns what the stage returns."""

    def bound(args: tuple, options: dict[str, Any]) -> dict[str, Any]:
        if len(args) > len(stage.positional):
            raise TypeError(f"{stage.function}() takes {len(stage.positional)} positional arguments")
        return {**dict(zip(stage.positional, args, strict=False)), **options}

    if stage.llm:

        async def function(*args, settings=None, config=None, progress=stage.progress, **options):
            with python_caller():
                resolver = _resolve(stage.command, bound(args, options), config)
                engine = _llm_settings(settings, resolver)
                with _reporting(progress) as console:
                    return await stage.arun(resolver, console, llm=engine)

    else:

        def function(*args, config=None, progress=stage.progress, **options):
            with python_caller():
                resolver = _resolve(stage.command, bound(args, options), config)
                with _reporting(progress) as console:
                    return stage.run(resolver, console)

    keyword = inspect.Parameter.KEYWORD_ONLY
    parameters = [
        *(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=PATH)
          for name in stage.positional),
        *([inspect.Parameter("settings", keyword, default=None)] if stage.llm else []),
        inspect.Parameter("config", keyword, default=None, annotation="str | Path | None"),
        inspect.Parameter("progress", keyword, default=stage.progress, annotation="Progress"),
        *signature_parameters(stage),
    ]  # fmt: skip
    function.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    function.__name__ = function.__qualname__ = ("a" if stage.llm else "") + stage.function
    lines = [
        f"        {option.name}: {option.help}" for section in stage.sections for option in specs(section)
    ]
    function.__doc__ = (
        f"`personaemp {stage.command}`: {inspect.cleandoc(stage.help)}"
        + ("\n\n    The endpoint: LLM options (`base_url=`, `model=`, ...) or `settings=pe.LLMSettings(...)`."
           if stage.llm else "")
        + f"\n\n    Options (as `personaemp {stage.command}`):\n" + "\n".join(lines)
    )  # fmt: skip
    return function


for _stage in STAGES.values():
    _made = _function(_stage)
    globals()[_made.__name__] = _made
    if _stage.llm:  # the sync twin, which works in a running loop too (personaemp.aio.run_sync)
        _twin = sync_twin(_made)
        _twin.__name__ = _twin.__qualname__ = _stage.function
        _twin.__signature__ = _made.__signature__  # type: ignore[attr-defined]
        _twin.__doc__ = (
            f"{_made.__doc__}\n\n    The sync twin of `{_made.__name__}` (works in a running loop too)."
        )
        globals()[_stage.function] = _twin


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
