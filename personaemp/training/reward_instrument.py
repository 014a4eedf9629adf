"""The training reward's instrument: what it asks the judge in joint mode (the step and its
reply), the options that choose the instrument (RewardOptions, checked as the [reward] keys
are) and what a judgment that could not be had scores (FALLBACKS).
personaemp.training.reward scores with them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pydantic import BaseModel, Field

from personaemp.instruments.judges import FLOOR, Score
from personaemp.llm.step import Step
from personaemp.records import DIMENSIONS
from personaemp.training.options import RewardConfig, checked_arguments

FALLBACKS = {
    # dimension score (1-5) and B (0-1) of a judgment that could not be had
    "lowest": (float(FLOOR), 0.0),  # then capped at the step's lowest judged reward
    "neutral": (3.0, 0.8),  # the authors' reward: 0.6 normalised, and 0.8 (above most judged B)
    "floor": (float(FLOOR), 0.0),
}


class DimensionJudgment(BaseModel):
    criteria: list[str] = Field(min_length=1, description="criteria for this user, written before scoring")
    analysis: str = Field(description="the reply measured against those criteria")
    score: Score


class JointReply(BaseModel):
    """The three dimensions in one reply (joint mode)."""

    resonation: DimensionJudgment
    expression: DimensionJudgment
    reception: DimensionJudgment


# A dynamic judge: at the authors' 0.3, as JUDGE_DYNAMIC.
JUDGE_JOINT = Step("judge_joint", JointReply, prompt="judge_joint", version=1, temperature=0.3)
STEPS = (JUDGE_JOINT,)
JOINT_ROOM = {JUDGE_JOINT.name: 4096}  # three judgments' worth of reasoning


DEFAULTS = RewardConfig()  # the defaults live with the [reward] options


@dataclasses.dataclass(frozen=True)
class RewardOptions:
    """The instrument (personaemp.options.RewardConfig says what each field means)."""

    dynamic: bool = DEFAULTS.dynamic  # PereGRM; False: fixed criteria (file or `criteria` column)
    samples: int = DEFAULTS.samples  # k: judgments averaged per dimension (dynamic only)
    bystander: bool = DEFAULTS.bystander
    reward_lambda: float = DEFAULTS.reward_lambda
    joint: bool = DEFAULTS.joint  # the three dimensions in one call (dynamic only)
    fallback: str = DEFAULTS.fallback
    criteria_file: Path | None = DEFAULTS.criteria
    layout: str = DEFAULTS.layout  # where a request holds its dimension's standard (prompts.LAYOUTS)
    safety: float = DEFAULTS.safety  # off per risky behaviour the behaviour judge quotes; 0: off
    safety_bound: float = DEFAULTS.safety_bound  # the most it takes off

    @property
    def mode(self) -> str:
        judge = (
            (f"joint@{self.samples}" if self.joint else f"dynamic@{self.samples}")
            if self.dynamic
            else "fixed"
        )
        return judge + ("+bystander" if self.bystander else "")

    @property
    def calls_per_rollout(self) -> int:
        """Judge calls one judged rollout asks for (before cache and de-duplication)."""
        per_sample = 1 if self.joint else len(DIMENSIONS)
        return per_sample * (self.samples if self.dynamic else 1) + int(self.bystander) + int(self.safety > 0)


def checked_options(options: RewardOptions, caller: str = "Reward") -> RewardOptions:
    """`options` checked where the [reward] keys are (RewardConfig: samples >= 1, a finite
    reward_lambda >= 0, samples and joint only with the dynamic judge...), as read there
    ("3" for samples is 3, as in the file); an error names the argument."""
    checked = checked_arguments(
        RewardConfig, caller, dynamic=options.dynamic, samples=options.samples, bystander=options.bystander,
        reward_lambda=options.reward_lambda, joint=options.joint, fallback=options.fallback,
        criteria=options.criteria_file, layout=options.layout, safety=options.safety,
        safety_bound=options.safety_bound,
    )  # fmt: skip
    return dataclasses.replace(
        options, dynamic=checked.dynamic, samples=checked.samples, bystander=checked.bystander,
        reward_lambda=checked.reward_lambda, joint=checked.joint, safety=checked.safety,
        safety_bound=checked.safety_bound,
    )  # fmt: skip
