"""The query checker: the LLM judge's review of each generated query and the
deterministic checks beside it. gen-queries enforces them; `agreement` re-runs the judge
with a second model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from personaemp import checks
from personaemp.language import normalize_language
from personaemp.llm.step import Step, edit_schema
from personaemp.prompts import Prompt
from personaemp.records import (
    Category,
    Checks,
    Persona,
    category_definitions,
)
from personaemp.render import render_memories

JUDGED = ("emotional_support", "logical_consistency", "role_awareness")


CHECKS = (
    *JUDGED, "memory_ids_valid", "category_match", "length_ok", "language_match", "not_duplicate",
    "not_copied",
)  # fmt: skip


class SituationReply(BaseModel):
    category: Category
    topic: str
    text: str
    memory_ids: list[str] = Field(min_length=1)


class ReviewReply(BaseModel):
    message: int = Field(description="the message's number")
    emotional_support: bool
    logical_consistency: bool
    role_awareness: bool
    category: Category
    language: str
    reason: str = Field(description="one sentence; say which judgment failed and why")


class ReviewsReply(BaseModel):
    reviews: list[ReviewReply]


CHECK = Step("check", ReviewsReply, prompt="check", temperature=0.0)  # a judge should be repeatable


def numbered(items: Sequence[str]) -> str:
    return "\n".join(f"{number}. {text}" for number, text in enumerate(items, 1))


def build_check_messages(persona: Persona, situations, texts: Sequence[str], prompt: Prompt) -> list[dict]:
    queries = numbered([f"(moment: {s.text}) {text}" for s, text in zip(situations, texts, strict=True)])
    return prompt.render(
        profile=persona.profile,
        memories=render_memories(persona.memories),
        queries=queries,
        category_definitions=category_definitions(),  # all three: the judge may say another one fits
    )


def reviews_schema(count: int) -> dict[str, Any]:
    schema = edit_schema(CHECK.schema, ("properties", "reviews"), minItems=count, maxItems=count)
    return edit_schema(schema, ("$defs", "ReviewReply", "properties", "message"), minimum=1, maximum=count)


def judge_checks(
    persona: Persona,
    situation,  # a SituationReply: its memory_ids and category are checked
    text: str,
    review: ReviewReply | None,
    duplicate_of: int | None,
    enforce: Sequence[str] = (),
) -> Checks:
    """All checks of one query: the judge's verdicts and the deterministic ones.

    `duplicate_of`: the number of an earlier message of the user this one nearly repeats.
    `enforce`: the checks that must pass (default: all); the others are recorded only."""
    enforce = enforce or CHECKS
    reasons: dict[str, str] = {}
    results: dict[str, bool] = {}
    if review is None:
        for name in JUDGED:
            results[name] = False
            reasons[name] = "the judge gave no review for this message"
        judged_category, judged_language = None, None
    else:
        for name in JUDGED:
            results[name] = getattr(review, name)
            if not results[name]:
                reasons[name] = review.reason
        judged_category, judged_language = review.category, normalize_language(review.language)
    known = {m.memory_id for m in persona.memories}
    deterministic = {
        "memory_ids_valid": checks.memory_ids_valid(situation.memory_ids, known),
        "category_match": checks.category_match(judged_category, situation.category),
        "length_ok": checks.length_ok(text),
        "language_match": checks.language_match(text, persona.language),
        "not_copied": checks.not_copied(text, own_texts(persona)),
    }
    if persona.language and judged_language and judged_language != persona.language:
        deterministic["language_match"] = (False, f"the judge reads {judged_language}")
    for name, (ok, reason) in deterministic.items():
        results[name] = ok
        if not ok:
            reasons[name] = reason
    results["not_duplicate"] = duplicate_of is None
    if duplicate_of is not None:
        reasons["not_duplicate"] = f"nearly repeats message {duplicate_of}"
    passed = all(ok for name, ok in results.items() if name in enforce)
    return Checks(
        **results, language=judged_language, passed=passed, reasons=reasons,
        enforced=[name for name in CHECKS if name in enforce],
    )  # fmt: skip


def own_texts(persona: Persona) -> list[str]:
    """What the user wrote or what was noted about them: a query must not repeat it."""
    texts = [turn.text for turn in persona.turns if turn.role == "user"]
    for memory in persona.memories:
        texts += [memory.value, memory.evidence_text or ""]
    return [text for text in texts if text]
