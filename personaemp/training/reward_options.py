"""The options of the training reward (TOML `[reward]`), declared once: each field makes
its flag, TOML key, env var and docs row (personaemp/options.py). A module of their own beside
the stage's code, so that `personaemp --help` reads them without importing it (pydantic only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from personaemp.options import DEFAULT_LAYOUT, Layout, Opt, OptionProblem, Section, declare


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
        Literal["lowest", "neutral", "floor"],
        Opt("A judgment that cannot be had: lowest (the rollout gets at most the step's lowest judged "
            "reward: a judge failure never pays), floor (1, B = 0) or neutral (3 of 5, B = 0.8, the "
            "authors' values, above most judged B); counted and logged either way.",
            env="PERSONAEMP_REWARD_FALLBACK"),
    ] = "lowest"  # fmt: skip
    criteria: Annotated[
        Path | None, Opt("Fixed criteria (`personaemp criteria`) when dynamic is false.", io="read")
    ] = None
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
