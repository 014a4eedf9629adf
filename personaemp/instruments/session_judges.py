"""The session judges: PERM over the supporter's side of a whole dialogue (or one of its
turns), fixed (the dialogue's criteria sheet) or dynamic (PereGRM: its own criteria). The
same reply models, temperatures and score arithmetic as the single-turn judges; the
conversation reaches the judge as one data block it cannot close, so nothing a simulated
user or a supporter wrote can steer it, and the judge never sees the simulator's inner
state (emotions, hidden need). `personaemp evaluate --dialogues` and the training
Interaction's session reward use them."""

from __future__ import annotations

from collections.abc import Sequence

from personaemp.instruments.judges import (
    JUDGE,
    JUDGE_DYNAMIC,
    DynamicScoreReply,
    ScoreReply,
    judge_values,
)
from personaemp.llm.step import Step
from personaemp.prompts import Prompt
from personaemp.records import DialogueTurn

# At the single-turn judges' temperatures (the authors': fixed 0, dynamic 0.3).
SESSION_JUDGE = Step("session_judge", ScoreReply, prompt="session_judge", temperature=JUDGE.temperature)
SESSION_JUDGE_DYNAMIC = Step(
    "session_judge_dynamic", DynamicScoreReply, prompt="session_judge_dynamic",
    temperature=JUDGE_DYNAMIC.temperature,
)  # fmt: skip
STEPS = (SESSION_JUDGE, SESSION_JUDGE_DYNAMIC)
ROOM = {step.name: 2048 for step in STEPS}  # as the single-turn judges: room to reason

WHOLE = "Grade the assistant's side of the conversation as a whole: every one of its turns."


def dialogue_text(turns: Sequence[DialogueTurn]) -> str:
    """The conversation as the judge reads it: who said what, nothing of the simulator's state."""
    return "\n\n".join(f"{'User' if t.role == 'user' else 'Assistant'}: {t.text}" for t in turns)


def turn_graded(number: int) -> str:
    return (
        f"Grade only the assistant's turn {number}, its last turn shown: the turns before it are "
        "the context it answered."
    )


def up_to_turn(turns: Sequence[DialogueTurn], number: int) -> list[DialogueTurn]:
    """The turns up to and including the supporter's `number`-th (1-based)."""
    seen = 0
    for index, turn in enumerate(turns):
        seen += turn.role == "assistant"
        if seen == number:
            return list(turns[: index + 1])
    raise ValueError(f"no supporter turn {number}")


def session_messages(unit: dict, dimension: str, prompt: Prompt, layout: str) -> list[dict]:
    """One session judge request: `unit` as evaluate's (profile, memories, situation, query:
    the opening message, criteria or None), its `response` the conversation's text and
    `graded` which turns of it are graded."""
    return prompt.render(layout, **judge_values(unit, dimension), graded=unit.get("graded") or WHOLE)
