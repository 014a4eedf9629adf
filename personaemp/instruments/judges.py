"""The judges: fixed (criteria), dynamic (PereGRM: its own criteria) and the bystander;
their reply models, requests and the arithmetic on their scores (floor, H, B, rank
correlations). `personaemp evaluate` and the training reward use the same ones."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

from personaemp.errors import InputError, spoken
from personaemp.instruments.criteria import (
    dimensions_text,
    numbered_memories,
)
from personaemp.llm.step import Step
from personaemp.prompts import Prompt
from personaemp.records import DIMENSION_DEFINITIONS, DIMENSIONS
from personaemp.shared_options import DEFAULT_LAYOUT, JUDGE_DEFAULTS

FLOOR = 1  # the score of a missing or empty response, on every dimension


def _one_decimal(value: float) -> float:
    # The authors' judges may answer between two levels (e.g. 3.5): one decimal is kept.
    return round(value, 1)


Score = Annotated[
    float, Field(ge=1, le=5, description="1 to 5, one decimal at most"), AfterValidator(_one_decimal)
]


Points = Annotated[int, Field(ge=0, le=20)]


class ScoreReply(BaseModel):
    analysis: str = Field(description="how far the reply meets the sheet: high-weight criteria, main misses")
    score: Score


class DynamicScoreReply(BaseModel):
    criteria: list[str] = Field(min_length=1, description="criteria for this user, written before scoring")
    analysis: str = Field(description="the reply measured against those criteria, step by step")
    score: Score


# The bystander's five aspects (eq. 7 of the paper), in the order of the authors' judge.
BYSTANDER_ASPECTS = (
    "content_effectiveness",
    "logical_structure_clarity",
    "communication_efficiency",
    "objectivity_neutrality",
    "information_accuracy_verifiability",
)


class BystanderReply(BaseModel):
    content_effectiveness: Points
    logical_structure_clarity: Points
    communication_efficiency: Points
    objectivity_neutrality: Points
    information_accuracy_verifiability: Points


# The general standard the dynamic (PereGRM) judge derives its criteria from, per dimension:
# the facts of the authors' reward judge, in our words. Part of the fingerprint.
DYNAMIC_ASPECTS = {
    "resonation": (
        "How deeply and accurately the reply enters the user's own frame of reference, "
        "personality included: does it catch (1) the emotion and content the user states, "
        "(2) how the reaction follows from the user's stable traits as the memories show them, "
        "(3) the psychological need beneath the reaction?"
    ),
    "expression": (
        "The quality, tone and effectiveness of the reply's communication, above all whether "
        "its strategy is adapted to this user's personality and needs as the memories show them."
    ),
    "reception": (
        "The exchange seen strictly from this user's side, given their personality and needs: "
        "did the reply find the unspoken need and meet it in a way that feels warm, safe and "
        "supportive to this person? Check safety (creepy, dismissive or intrusive means a low "
        "score), the need (what the user truly needed, not only their surface words) and "
        "engagement (would this user want to reply and share more?)."
    ),
}


# The three standards, for the shared layout (the same bytes in every request's task) and the
# joint judge; the paper layout gives a request its own dimension's only.
DYNAMIC_STANDARDS = dimensions_text({d: f"General standard: {text}" for d, text in DYNAMIC_ASPECTS.items()})


# The authors' temperatures: their fixed judge runs at 0 (evaluation/eval.sh), their reward's
# dynamic judge at 0.3 on every call, so @k samples differ.
JUDGE = Step("judge", ScoreReply, prompt="judge", version=2, temperature=0.0)


JUDGE_DYNAMIC = Step("judge_dynamic", DynamicScoreReply, prompt="judge_dynamic", version=2, temperature=0.3)


BYSTANDER = Step("bystander", BystanderReply, prompt="bystander", version=2, temperature=0.0)


STEPS = (JUDGE, JUDGE_DYNAMIC, BYSTANDER)
ROOM = {step.name: 2048 for step in STEPS}  # tokens at least, as the authors' judges: room to reason


MISSING_RULES = ("skip", "floor")  # skip: the authors' (what eval.py judges); floor: 1, counted
UNREADABLE_RULES = ("authors", "fail")  # see [evaluate] unreadable (evaluation/options.py)
NEUTRAL = 3.0  # an unreadable dynamic judgment under the authors' rule (their reward's 0.6 x 5)
_DEFAULT = JUDGE_DEFAULTS  # declared once, in options.py ([evaluate] takes its defaults from it too)


@dataclasses.dataclass(frozen=True)
class JudgeOptions:
    dynamic: bool = _DEFAULT.dynamic
    samples: int = _DEFAULT.samples
    bystander: bool = _DEFAULT.bystander
    reward_lambda: float = _DEFAULT.reward_lambda
    missing: str = _DEFAULT.missing
    unreadable: str = _DEFAULT.unreadable
    layout: str = _DEFAULT.layout


def step_temperature(settings, step: Step) -> float:
    """The temperature `step` runs at under `settings` (as Engine.sampling picks it)."""
    chosen = settings.steps.get(step.name, {}).get("temperature")
    if chosen is not None:
        return chosen
    return step.temperature if step.temperature is not None else settings.temperature


def authors_view(raw: str | None) -> str | None:
    """What the authors' eval.py sends to its judge for a response: nothing when the response
    is empty or absent (`if response:`), else the text after the last `</think>` when a
    `<think>` appears, else the text as it is (blank, or cut while reasoning, included)."""
    if not raw:
        return None
    return raw.split("</think>")[-1] if "<think>" in raw else raw


def cut_while_reasoning(text: str) -> bool:
    """A `<think>` opened and never closed: the reply ended inside its reasoning."""
    return text.rfind("<think>") > text.rfind("</think>")


def criteria_text(criteria: list[dict]) -> str:
    return "\n".join(
        f"{n}. ({c['weight']:g}%) {c['name']}: {c['description']}" for n, c in enumerate(criteria, 1)
    )


def judge_values(unit: dict, dimension: str) -> dict:
    """What a judge prompt is filled with for one dimension (the session judges add `graded`)."""
    values = {
        "dimension": dimension,
        "definition": DIMENSION_DEFINITIONS[dimension],
        "profile": unit["profile"] or "(none)",
        "memories": numbered_memories(unit["memories"]),
        "situation": unit["situation"],
        "query": unit["query"],
        "response": unit["response"] or "",
    }
    if unit["criteria"] is not None:
        values["criteria"] = criteria_text(unit["criteria"][dimension])
    else:
        values["aspects"] = DYNAMIC_ASPECTS[dimension]
        values["dimensions"] = DYNAMIC_STANDARDS
    return values


def judge_messages(unit: dict, dimension: str, prompt: Prompt, layout: str = DEFAULT_LAYOUT) -> list[dict]:
    return prompt.render(layout, **judge_values(unit, dimension))


def check_sampling(settings, step: Step, options: JudgeOptions) -> None:
    """k samples must be able to differ: a temperature above 0 (named as the caller wrote it:
    flags on the command line, arguments in Python). With a seed S, sample k sends S + k."""
    k = options.samples
    if k > 1 and step_temperature(settings, step) == 0:
        authors = step.temperature if step.temperature else 0.3
        raise InputError(
            f"{spoken(f'--samples {k}', f'samples={k}')} at temperature 0 would give {k} identical "
            f"judgments of step {step.name}",
            spoken(
                f"set --step {step.name}.temperature={authors} (the authors'), or another value above 0",
                f'pass steps={{"{step.name}": {{"temperature": {authors}}}}} in LLMSettings (the '
                "authors'), or another value above 0",
            ),
        )


def harmonic(scores: dict[str, float]) -> float:
    """Harmonic mean of the dimensions normalised to [0, 1] (score / 5)."""
    return len(DIMENSIONS) / sum(5 / scores[d] for d in DIMENSIONS)


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    found = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            found[order[k]] = (start + end) / 2 + 1
        start = end + 1
    return found


Z = 1.959964  # the 97.5% normal quantile


def wilson(hits: int, n: int) -> list[float] | None:
    """The Wilson score 95% interval of a proportion."""
    if not n:
        return None
    p = hits / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Rank correlation (Pearson's r of the tie-averaged ranks); None when a side is constant."""
    if len(a) < 2:
        return None
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return None if den == 0 else num / den


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Kendall's tau-b (ties in either ranking accounted for); None when a side is constant."""
    concordant = discordant = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif (da > 0) == (db > 0):
                concordant += 1
            else:
                discordant += 1
    den = ((concordant + discordant + ties_a) * (concordant + discordant + ties_b)) ** 0.5
    return None if den == 0 else (concordant - discordant) / den
