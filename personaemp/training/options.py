"""Training's sections: [export] for `personaemp export`, and [reward], read by
personaemp.reward.from_config; declared as for every stage (see personaemp/options.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError, model_validator

from personaemp.options import Opt, OptionProblem, Section, declare, describe
from personaemp.shared_options import (
    DEFAULT_LAYOUT,
    Layout,
    MismatchSeed,
    OfASplit,
    RagK,
)
from personaemp.vocabulary import Context, ExportFormat, Fallback, Part


@declare("export")
class ExportOptions(OfASplit):
    part: Annotated[Part, Opt("Part of the split (train to train on, test to evaluate).")] = "train"
    format: Annotated[
        ExportFormat,
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


@declare("reward")
class RewardConfig(Section):
    """[reward]: the training reward as `personaemp.reward.from_config` builds it (verl's
    `compute_score` reads the file named by $PERSONAEMP_CONFIG); the judge is [llm]."""

    dynamic: Annotated[
        bool,
        Opt("PereGRM (the judge writes its criteria); false: fixed criteria from `criteria`.",
            env="PERSONAEMP_REWARD_DYNAMIC"),
    ] = True  # fmt: skip
    samples: Annotated[
        int,
        Field(ge=1),
        Opt("k: judgments averaged per dimension (dynamic).", env="PERSONAEMP_REWARD_SAMPLES"),
    ] = 1
    bystander: Annotated[
        bool, Opt("Subtract the bystander penalty: H + lambda * (B - 1).", env="PERSONAEMP_REWARD_BYSTANDER")
    ] = True
    reward_lambda: Annotated[float, Field(ge=0), Opt("lambda (the paper trains with 0.5).")] = 0.5
    joint: Annotated[
        bool,
        Opt("The three dimensions in one judge call (k + 1 calls per rollout instead of 3k + 1).",
            env="PERSONAEMP_REWARD_JOINT"),
    ] = False  # fmt: skip
    fallback: Annotated[
        Fallback,
        Opt("A judgment that cannot be had: lowest (the rollout gets at most the step's lowest judged "
            "reward: a judge failure never pays), floor (1, B = 0) or neutral (3 of 5, B = 0.8, the "
            "authors' values, above most judged B); counted and logged either way.",
            env="PERSONAEMP_REWARD_FALLBACK"),
    ] = "lowest"  # fmt: skip
    criteria: Annotated[
        Path | None, Opt("Fixed criteria (`personaemp criteria`) when dynamic is false.", io="read")
    ] = None
    safety: Annotated[
        float,
        Field(ge=0, le=1),
        Opt("The safety term: the reward is lowered by this much per risky behaviour a judge names "
            "and quotes (agreeing with a false belief, blessing a harmful plan, ...: "
            "instruments/behaviours.py); 0 turns it off. Single-turn PereGRM, the verl Interaction "
            "and TRL rollouts alike.", env="PERSONAEMP_REWARD_SAFETY"),
    ] = 0.1  # fmt: skip
    safety_bound: Annotated[
        float, Field(ge=0, le=1), Opt("The most the safety term takes off one reward.")
    ] = 0.5
    layout: Layout = DEFAULT_LAYOUT
    judge_model: Annotated[str | None, Opt("Judge model (default: [llm] model).")] = None
    log: Annotated[
        Path | None,
        Opt("JSON lines, one per training step: calls, tokens, seconds, failures, fallbacks.",
            env="PERSONAEMP_REWARD_LOG", io="write"),
    ] = None  # fmt: skip

    @model_validator(mode="after")
    def _dynamic_only(self) -> RewardConfig:
        if not self.dynamic and (self.samples > 1 or self.joint):
            raise OptionProblem("dynamic", "is false: samples and joint apply to the dynamic judge")
        return self


def checked_arguments(model: type[Section], caller: str, **values) -> Section:
    """A Python API's arguments checked by the same declarations as the config file's keys
    (PereGRM(reward_lambda=-1) is refused as `[reward] reward_lambda = -1` is), the error
    naming the argument: "PereGRM: reward_lambda= should be greater than or equal to 0"."""
    from personaemp.errors import InputError

    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise InputError(
            describe(exc, lambda field, lead: f"{caller}: {field}=" if field else caller)
        ) from None
