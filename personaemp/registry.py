"""Every stage declared once: its command, its Python name, its module, its help and its
summary. The Typer commands (cli.py), `import personaemp as pe` (api.py) and `personaemp
run` (pipeline.py) are all derived from `STAGES`.

A stage's module has `from_options(section, console, ...)`: its resolved options to its
function's arguments, its return value to a StageResult (a coroutine for an LLM stage, given
`settings`, the engine's LLMSettings, and `retry`). What differs between stages stays there.

A stage's options: its TOML section, a pydantic model with `@options.declare("name")`, in
its options module (`Stage.options_module`, by default its product's `options.py`, which
`personaemp --help` imports without the stage's code). This module imports every one, puts
the sections in pipeline order and fills options.COMMANDS and options.CLI_ONLY, so flags,
TOML keys, env vars, the docs tables and the path checks all follow from the Stage line.

To add a stage: its module (a function with plain arguments, its section, and
`from_options`) and one `Stage(...)` below. docs/development.md shows one worked through.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from personaemp import freshness, results, summaries
from personaemp.aio import run_sync
from personaemp.options import CLI_COMMON, CLI_ONLY, COMMANDS, SECTIONS, markdown_tables, run_options
from personaemp.training import options as training_options  # [reward] too (no command)


@dataclass(frozen=True)
class Stage:
    command: str  # the CLI command
    function: str  # its name in `import personaemp as pe` (an LLM stage also has "a" + function)
    module: str  # under personaemp/, with `from_options` (see above)
    help: str  # the command's --help; the Python function's docstring begins with it
    summary: Callable[[Any, Console], None] | None = None  # (result, console): after the stage
    positional: tuple[str, ...] = ("input", "output")  # the Python function's positional arguments
    progress: bool = False  # the Python function's default: print progress and the summary
    # An LLM stage skipped when current (freshness.py): its section has `force` and `shard`.
    fresh: bool = False
    wiring: Callable[[], dict[str, Any]] | None = None  # arguments that come from another product
    # Its TOML sections: its own first, declared in `options_module` (default: its product's
    # options.py, e.g. dataset.options);
    # "llm" makes it an LLM stage (the [llm] options, the engine's settings).
    sections: tuple[str, ...] = ()
    options_module: str = ""
    cli_only: Mapping[str, str] = field(default_factory=dict)  # its command-only flags: help

    @property
    def options_from(self) -> str:
        return f"personaemp.{self.options_module or self.module.split('.')[0] + '.options'}"

    def call(self, *args, **extra):
        """The module's `from_options`, imported now (a command imports only its own stage)."""
        module = importlib.import_module(f"personaemp.{self.module}")
        return module.from_options(*args, **extra, **(self.wiring() if self.wiring else {}))

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
        section = self.options(options)
        sections = [(self.sections[0], section)]
        stamp = freshness.llm_stamp(sections, options.llm) if self.fresh else None
        last = freshness.current(self.command, section.output, stamp, section.force) if stamp else None
        if last is not None:
            console.print(freshness.unchanged(self.command, last))
            return results.StageResult(self.command, section.output, counts=last["result"])
        made = await self.call(section, console, llm, retry=options.llm.retry_failed, **extra)
        self._shown(made, console)  # the summary first: a failed print records nothing
        if stamp is not None:
            freshness.llm_finished(self.command, sections, stamp, [made], made.counts)
        return made

    def _shown(self, result, console: Console):
        if self.summary is not None:
            self.summary(result, console)
        return result


def _push_wiring() -> dict[str, Any]:
    """push's card shows the agreement measured in review: wired here, above both products."""
    from personaemp.review.agreement import card_quality

    return {"quality": card_quality}


# --- the summaries a command and `run` print ------------------------------------------------------


def print_memory_summary(summary, console: Console) -> None:
    from personaemp.dataset.memories import print_summary  # (imported when shown)

    print_summary(summary, console)


def _llm_summary(then: Callable[[Any, Console], None] | None = None):
    """An LLM stage's report, then `then(result, console)` if it wrote rows."""

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
            "extract-memories", "extract_memories", "dataset.memories",
            "Extract AlpsBench-style memories and intents from your own conversation logs (LLM), for "
            "`filter`.",
            _llm_summary(lambda result, console: print_memory_summary(result.summary, console)),
            sections=("extract", "llm"),
        ),
        Stage(
            "filter", "filter_users", "dataset.filter",
            "Keep the users whose memories show personality and emotionally relevant experience.",
            lambda result, console: summaries.print_filter_summary(result.report, console),
            sections=("filter",), cli_only={"--show-rules": "Print the default rules file and exit."},
        ),
        Stage(
            "infer-persona", "infer_personas", "dataset.persona",
            "Infer an evidence-grounded persona and Big Five levels for each filtered user (LLM).",
            _llm_summary(lambda result, console: summaries.print_persona_summary(result.summary, console)),
            fresh=True, sections=("persona", "llm"),
            cli_only={"--show": "Print this user's persona next to its evidence and exit."},
        ),
        Stage(
            "gen-queries", "generate_queries", "dataset.queries",
            "Write empathy-seeking queries (ES, HEQ, SS) for each eligible persona and check them (LLM).",
            _llm_summary(lambda result, console: summaries.print_query_funnel(result.summary, console)),
            fresh=True,
            sections=("queries", "llm"),
        ),
        Stage(
            "gen-dialogues", "generate_dialogues", "dataset.dialogues",
            "Simulate multi-turn conversations: each accepted query's user, grounded in their memories\n"
            "    and persona with a hidden need, talks with the supporter under test (LLM).",
            _llm_summary(),
            sections=("dialogues", "llm"),
        ),
        Stage(
            "fidelity", "measure_fidelity", "dataset.fidelity",
            "Measure the simulated user against the real person: the next real message held out, each\n"
            "    context variant between the self and other controls, deterministic style metrics (LLM).",
            _llm_summary(lambda result, console: importlib.import_module("personaemp.dataset.fidelity")
                         .print_report(result.summary, console)),
            sections=("fidelity", "llm"), options_module="dataset.fidelity",
        ),
        Stage(
            "split", "split_users", "dataset.split",
            "Split users into train/test: random 9:1, and (unless --no-ood) a held-out Big Five cluster.",
            lambda result, console: summaries.print_split_report(result.report, result.output, console),
            positional=("input", "out_dir"),
            sections=("split",),
        ),
        Stage(
            "stats", "write_stats", "dataset.stats",
            "Describe a build: funnel, Big Five levels, queries, checks, as stats.json, plots and a summary.",
            lambda result, console: summaries.print_stats(result.report, console),
            positional=("processed", "out_dir"),
            sections=("stats",),
        ),
        Stage(
            "push", "publish", "dataset.publish",
            "Publish the splits as a Hub dataset (configs random and ood) with a dataset card;\n"
            "    without --repo-id, or with --dry-run, write the same repository to --out-dir.",
            summaries.print_push, positional=("splits",), wiring=_push_wiring,
            sections=("push",),
        ),
        Stage(
            "criteria", "write_criteria", "evaluation.criteria",
            "Write 4-6 weighted evaluation criteria per query and PERM dimension, seeing no response (LLM).",
            _llm_summary(),
            sections=("criteria", "llm"),
        ),
        Stage(
            "respond", "write_responses", "evaluation.respond",
            "Have a policy model answer every query of a split, with the chosen context (LLM).",
            _llm_summary(),  # its last line says what it wrote
            positional=("splits", "output"),
            sections=("respond", "llm"),
        ),
        Stage(
            "export", "export_split", "training.export",
            "Write a split as training files: TRL's conversational prompts (JSON lines) or verl's parquet,\n"
            "    with the prompts `respond` sends and what the PereGRM reward reads.",
            lambda made, console: console.print(
                f"wrote {made['rows']} rows ({made['format']}) to {made['output']}"
            ),
            positional=("splits", "output"),
            sections=("export",),
        ),
        Stage(
            "evaluate", "evaluate", "evaluation.evaluate",
            "Score systems' responses per PERM dimension (fixed criteria, or dynamic @k), side by side "
            "(LLM);\n    with --dialogues, whole dialogues: the emotion trajectory and PERM over the "
            "supporter's side.",
            _evaluate_summary, positional=("splits",),
            sections=("evaluate", "llm"),
        ),
        Stage(
            "table", "write_table", "evaluation.table",
            "Render the paper's Table 1 (systems x judge x split: Res, Exp, Rec, Avg) from evaluate "
            "reports;\n    from evaluate --dialogues reports, the multi-turn table (final emotion, need "
            "met, H, n).",
            positional=(),
            sections=("table",),
        ),
        Stage(
            "review", "serve_review", "review.page",
            "Serve a local page to label a stratified sample of queries: accept/reject, agree with the\n"
            "    judge or not, traits supported or not, a note; every click goes to the labels file.",
            positional=("input",), progress=True,
            sections=("review",), cli_only={
                "--export-label-studio": "Write the sample as a Label Studio project (tasks.json, "
                "label_config.xml) to this folder and exit.",
                "--import-label-studio": "Bring the labels file to a Label Studio export's state (JSON or "
                "JSON-MIN; edits and deletions included) and exit.",
            },
        ),
        Stage(
            "agreement", "measure_agreement", "review.agreement",
            "How far the LLM judge agrees with people (kappa, intervals, precision, corrected pass\n"
            "    shares) and, with --judge-model, with a second judge re-running the check step.",
            positional=("input",),
            sections=("agreement", "llm"),
        ),
    )
}  # fmt: skip


def _catalogue() -> None:
    """Every stage's section declared (its options module imported), the sections in pipeline
    order ([paths], each stage's own in STAGES order, then the shared and stage-less ones:
    [llm], [reward]), and each command's sections and command-only flags."""
    for stage in STAGES.values():
        importlib.import_module(stage.options_from)
        missing = [name for name in stage.sections if name not in SECTIONS]
        if missing:
            raise TypeError(f"{stage.command}: no @declare({missing[0]!r}) in {stage.options_from}")
    order = ["paths", *(stage.sections[0] for stage in STAGES.values())]
    ordered = {name: SECTIONS[name] for name in [*order, *SECTIONS]}
    SECTIONS.clear()
    SECTIONS.update(ordered)
    COMMANDS.clear()
    COMMANDS.update({stage.command: stage.sections for stage in STAGES.values()})
    CLI_ONLY.clear()
    CLI_ONLY.update({stage.command: {**CLI_COMMON, **stage.cli_only} for stage in STAGES.values()})


_catalogue()
assert training_options.RewardConfig is SECTIONS["reward"]
RunOptions = run_options()  # personaemp.toml: every section (the file may leave any out)

RUN_COMMANDS = ("filter", "infer-persona", "gen-queries", "split", "stats", "push")


def signature_parameters(stage: Stage) -> list[inspect.Parameter]:
    """The stage's options as keyword arguments with the command's defaults (api.py)."""
    from personaemp.options import specs

    first: dict[str, Any] = {}  # an option in two sections: the first one's
    for section in stage.sections:
        for option in specs(section):
            first.setdefault(option.name, option)
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option.default,
                              annotation=option.info.annotation)
            for name, option in first.items() if name not in stage.positional]  # fmt: skip


if __name__ == "__main__":  # python -m personaemp.registry docs/options.md: the Options page's tables
    if len(sys.argv) > 1:
        from personaemp.options import update_readme

        changed = update_readme(Path(sys.argv[1]))
        print(f"{sys.argv[1]}: {'updated' if changed else 'up to date'}")
    else:
        print(markdown_tables(), end="")
