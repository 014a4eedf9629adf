"""The catalogue: every stage as one line of data (strings only), at the bottom of the package.

A line names the stage's command, its Python name, its module (under personaemp/, with
`from_options` and, if it prints one, `print_summary`), its help, its TOML sections and the
module that declares them. Everything else is read from it without importing a stage:

- `personaemp.options.sections()` loads the sections from the modules named here, in
  pipeline order;
- the registry (personaemp/registry.py) runs the stages named here; the commands
  (cli.py), `import personaemp as pe` (api.py) and `personaemp run` (pipeline.py) use it.

This module imports nothing of the package: a module at any floor may read it.

To add a stage: its module (a function with plain arguments, its section, `from_options`)
and one `StageLine(...)` below. docs/development.md shows one worked through.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StageLine:
    command: str  # the CLI command
    function: str  # its name in `import personaemp as pe` (an LLM stage also has "a" + function)
    module: str  # under personaemp/, with `from_options` (and `print_summary` if it has one)
    help: str  # the command's --help; the Python function's docstring begins with it
    positional: tuple[str, ...] = ("input", "output")  # the Python function's positional arguments
    progress: bool = False  # the Python function's default: print progress and the summary
    # An LLM stage skipped when current (manifest.py): its section has `force` and `shard`.
    fresh: bool = False
    # Its TOML sections: its own first, declared in `options_module` (default: its product's
    # options.py, e.g. dataset.options); "llm" makes it an LLM stage.
    sections: tuple[str, ...] = ()
    options_module: str = ""
    cli_only: dict[str, str] = field(default_factory=dict)  # its command-only flags: help

    @property
    def options_from(self) -> str:
        """The module (under personaemp/) that declares the stage's own section."""
        return self.options_module or self.module.split(".")[0] + ".options"

    @property
    def llm(self) -> bool:
        return "llm" in self.sections


LINES = (
    StageLine(
        "extract-memories", "extract_memories", "dataset.memories",
        "Extract AlpsBench-style memories and intents from your own conversation logs (LLM), for "
        "`filter`.",
        sections=("extract", "llm"),
    ),
    StageLine(
        "filter", "filter_users", "dataset.filter",
        "Keep the users whose memories show personality and emotionally relevant experience.",
        sections=("filter",), cli_only={"--show-rules": "Print the default rules file and exit."},
    ),
    StageLine(
        "infer-persona", "infer_personas", "dataset.persona",
        "Infer an evidence-grounded persona and Big Five levels for each filtered user (LLM).",
        fresh=True, sections=("persona", "llm"),
        cli_only={"--show": "Print this user's persona next to its evidence and exit."},
    ),
    StageLine(
        "gen-queries", "generate_queries", "dataset.queries",
        "Write empathy-seeking queries (ES, HEQ, SS) for each eligible persona and check them (LLM).",
        fresh=True, sections=("queries", "llm"),
    ),
    StageLine(
        "gen-dialogues", "generate_dialogues", "dataset.dialogues",
        "Simulate multi-turn conversations: each accepted query's user, grounded in their memories\n"
        "    and persona with a hidden need, talks with the supporter under test (LLM).",
        sections=("dialogues", "llm"),
    ),
    StageLine(
        "fidelity", "measure_fidelity", "dataset.fidelity",
        "Measure the simulated user against the real person: the next real message held out, each\n"
        "    context variant between the self and other controls, deterministic style metrics (LLM).",
        sections=("fidelity", "llm"), options_module="dataset.fidelity",
    ),
    StageLine(
        "split", "split_users", "dataset.split",
        "Split users into train/test: random 9:1, and (unless --no-ood) a held-out Big Five cluster.",
        positional=("input", "out_dir"), sections=("split",),
    ),
    StageLine(
        "stats", "write_stats", "dataset.stats",
        "Describe a build: funnel, Big Five levels, queries, checks, as stats.json, plots and a summary.",
        positional=("processed", "out_dir"), sections=("stats",),
    ),
    StageLine(
        "push", "publish", "dataset.publish",
        "Publish the splits as a Hub dataset (configs random and ood) with a dataset card;\n"
        "    without --repo-id, or with --dry-run, write the same repository to --out-dir.",
        positional=("splits",), sections=("push",),
    ),
    StageLine(
        "criteria", "write_criteria", "evaluation.criteria",
        "Write 4-6 weighted evaluation criteria per query and PERM dimension, seeing no response (LLM).",
        sections=("criteria", "llm"),
    ),
    StageLine(
        "respond", "write_responses", "evaluation.respond",
        "Have a policy model answer every query of a split, with the chosen context (LLM).",
        positional=("splits", "output"), sections=("respond", "llm"),
    ),
    StageLine(
        "export", "export_split", "training.export",
        "Write a split as training files: TRL's conversational prompts (JSON lines) or verl's parquet,\n"
        "    with the prompts `respond` sends and what the PereGRM reward reads.",
        positional=("splits", "output"), sections=("export",),
    ),
    StageLine(
        "evaluate", "evaluate", "evaluation.evaluate",
        "Score systems' responses per PERM dimension (fixed criteria, or dynamic @k), side by side "
        "(LLM);\n    with --dialogues, whole dialogues: the emotion trajectory and PERM over the "
        "supporter's side.",
        positional=("splits",), sections=("evaluate", "llm"),
    ),
    StageLine(
        "table", "write_table", "evaluation.table",
        "Render the paper's Table 1 (systems x judge x split: Res, Exp, Rec, Avg) from evaluate "
        "reports;\n    from evaluate --dialogues reports, the multi-turn table (final emotion, need "
        "met, H, n).",
        positional=(), sections=("table",),
    ),
    StageLine(
        "review", "serve_review", "review.page",
        "Serve a local page to label a stratified sample of queries: accept/reject, agree with the\n"
        "    judge or not, traits supported or not, a note; every click goes to the labels file.",
        positional=("input",), progress=True, sections=("review",), cli_only={
            "--export-label-studio": "Write the sample as a Label Studio project (tasks.json, "
            "label_config.xml) to this folder and exit.",
            "--import-label-studio": "Bring the labels file to a Label Studio export's state (JSON or "
            "JSON-MIN; edits and deletions included) and exit.",
        },
    ),
    StageLine(
        "agreement", "measure_agreement", "review.agreement",
        "How far the LLM judge agrees with people (kappa, intervals, precision, corrected pass\n"
        "    shares) and, with --judge-model, with a second judge re-running the check step.",
        positional=("input",), sections=("agreement", "llm"),
    ),
)  # fmt: skip

# The stages `personaemp run` chains, in order.
RUN_COMMANDS = ("filter", "infer-persona", "gen-queries", "split", "stats", "push")

# What every stage command, `run` and `merge` print: declared once (personaemp.cli).
OUTPUT_OPTIONS = {
    "--quiet": "No summaries or progress on stderr (errors are still shown).",
    "--json": "Print the command's result (files, counts, cost, report) as JSON on stdout.",
}
# Options of every stage command that are not stage settings (no TOML key); a line adds its own.
CLI_COMMON = {
    "--config": "personaemp.toml to read the command's sections from (flags and env vars win).",
    **OUTPUT_OPTIONS,
}

# stage command -> its sections (its own first), and its command-only flags -> their help.
COMMANDS = {line.command: line.sections for line in LINES}
CLI_ONLY = {line.command: {**CLI_COMMON, **line.cli_only} for line in LINES}

# TOML section -> the module (under personaemp/) that declares it, in pipeline order: [paths],
# each stage's own, then the shared [llm] and the stage-less [reward] (personaemp.reward).
SECTION_MODULES = {
    "paths": "shared_options",
    **{line.sections[0]: line.options_from for line in LINES},
    "llm": "shared_options",
    "reward": "training.options",
}
