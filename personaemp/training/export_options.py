"""The options of `personaemp export` (TOML `[export]`), declared once: each field makes
its flag, TOML key, env var and docs row (personaemp/options.py). A module of their own beside
the stage's code, so that `personaemp --help` reads them without importing it (pydantic only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from personaemp.options import (
    PROCESSED,
    Context,
    MismatchSeed,
    Opt,
    Part,
    RagK,
    Section,
    SplitSetting,
    SplitsFolder,
    declare,
)


@declare("export")
class ExportOptions(Section):
    splits: SplitsFolder = PROCESSED / "splits"
    split: SplitSetting = "random"
    part: Annotated[Part, Opt("Part of the split (train to train on, test to evaluate).")] = "train"
    format: Annotated[
        Literal["trl", "verl"],
        Opt(
            "trl: JSON lines with a conversational `prompt` and the reward's columns (datasets, "
            "GRPOTrainer); verl: parquet with data_source, prompt, ability, reward_model, extra_info."
        ),
    ] = "trl"
    context: Annotated[
        Context,
        Opt("What the policy sees besides the query, as `personaemp respond --context` (the same prompt)."),
    ] = "memory"
    rag_k: RagK = 3
    mismatch_seed: MismatchSeed = 0
    summaries: Annotated[
        Path | None,
        Opt(
            "With --context memory-summary: the responses of `respond --context memory-summary`, "
            "whose summaries the prompts carry.",
            metavar="FILE",
            io="read",
        ),
    ] = None
    criteria: Annotated[
        Path | None,
        Opt("Fixed criteria (`personaemp criteria`) to carry in each row, for a fixed-criteria reward.",
            ("--criteria",), metavar="FILE", io="read"),
    ] = None  # fmt: skip
    data_source: Annotated[str, Opt("verl's data_source of every row.")] = "personaemp"
    dialogues: Annotated[
        bool,
        Opt(
            "Rows for multi-turn rollouts with the simulated user: interaction_kwargs (verl: in "
            "extra_info) name personaemp's Interaction and carry the user it plays."
        ),
    ] = False
    output: Annotated[
        Path | None,
        Opt(
            "The file written (default: export/<split>-<part>-<context>.jsonl, or .parquet with "
            "--format verl, beside the splits folder).",
            ("--output", "-o"),
            io="write",
        ),
    ] = None

    @property
    def output_path(self) -> Path:
        suffix = "parquet" if self.format == "verl" else "jsonl"
        name = f"{self.split}-{self.part}-{self.context}.{suffix}"
        return self.output or self.splits.parent / "export" / name
