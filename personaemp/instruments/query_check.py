"""The query checker: the LLM judge's review of each generated query and the
deterministic checks beside it. gen-queries enforces them; `agreement` re-runs the judge
with a second model."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from personaemp import checks
from personaemp.language import normalize_language
from personaemp.llm.step import Step, edit_schema
from personaemp.prompts import COMPACT, Prompt, prompts_dir
from personaemp.records import (
    CATEGORIES,
    Category,
    Checks,
    Memory,
    Persona,
    category_definitions,
)
from personaemp.render import render_memories
from personaemp.vocabulary import CHECKS, JUDGED  # the judge's checks, then the rest

# How the judge lists the messages, and a moment's category as a tag ("[HEQ]", as moments were
# once listed to the writer, and as a model writing moments by category may still put it): a
# query that repeats these frames is made of our prompt (no_scaffolding).
CATEGORY_TAG = "[{category}]"
MESSAGE_LINE = "(moment: {moment}) {query}"


# One moment of the situations step (dataset/queries.py) and the message the user sends at it;
# the judge reads the moment's category and memory ids. (A comment, not a docstring: pydantic
# would send a docstring in the schema, billed in every request.)
class SituationReply(BaseModel):
    category: Category
    topic: str
    text: str
    memory_ids: list[str] = Field(min_length=1)
    message: str


class ReviewReply(BaseModel):
    message: int = Field(description="the message's number")
    emotional_support: bool
    logical_consistency: bool
    role_awareness: bool
    category: Category
    language: str
    # null when all three pass: a reason nobody reads is billed as output (issue 52)
    reason: str | None = Field(description="which judgment failed and why; null when none did")


class ReviewsReply(BaseModel):
    reviews: list[ReviewReply]


CHECK = Step("check", ReviewsReply, prompt="check", temperature=0.0)  # a judge should be repeatable


def numbered(items: Sequence[str]) -> str:
    return "\n".join(f"{number}. {text}" for number, text in enumerate(items, 1))


def build_check_messages(persona: Persona, situations, texts: Sequence[str], prompt: Prompt) -> list[dict]:
    queries = numbered(
        [MESSAGE_LINE.format(moment=s.text, query=text) for s, text in zip(situations, texts, strict=True)]
    )
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
                reasons[name] = review.reason or "the judge gave no reason"
        judged_category, judged_language = review.category, normalize_language(review.language)
    known = {m.memory_id for m in persona.memories}
    deterministic = {
        "memory_ids_valid": checks.memory_ids_valid(situation.memory_ids, known),
        "category_match": checks.category_match(judged_category, situation.category),
        "length_ok": checks.length_ok(text),
        "language_match": checks.language_match(text, persona.language),
        "not_copied": checks.not_copied(text, own_texts(persona)),
        "no_scaffolding": checks.scaffolding(text, *scaffolding()),
        "no_internal_ids": ids_in_query(persona, situation, text),
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


def ids_in_query(persona: Persona, situation, text: str) -> tuple[bool, str]:
    """no_internal_ids on what the dataset shows with a query: its text and its moment."""
    known = checks.user_ids(persona)
    ok, reason = checks.internal_ids(text, known)
    if ok:
        ok, reason = checks.internal_ids(situation.text, known)
        reason = reason and f"the moment {reason}"
    return ok, reason


# Where a value is missing from a frame: what is left around it is ours.
_GAP = "\x00"
# A line our prompts put right above a slot ("The user's message:" over $query).
_LABEL = re.compile(r"^([^\n$]*\S:)[ \t]*\n[ \t]*\$\w+[ \t]*$", re.MULTILINE)


def scaffolding() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(markers, labels) for `checks.scaffolding`, read off what our prompts are made of (so a
    new prompt's label is checked with no list to keep): the frames a memory and a moment
    are written in, the field names of the replies and memories, and the labels above the
    slots of every template in the prompts folder in use."""
    root = prompts_dir()
    if str(root) not in _SCAFFOLDING:
        _SCAFFOLDING[str(root)] = _scaffolding(root)
    return _SCAFFOLDING[str(root)]


_SCAFFOLDING: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # prompts folder -> (markers, labels)


def _scaffolding(root) -> tuple[tuple[str, ...], tuple[str, ...]]:
    frames = [render_memories([Memory(memory_id=_GAP, label=_GAP, value=_GAP, evidence_text=_GAP)])]
    frames += [CATEGORY_TAG.format(category=c) for c in CATEGORIES]
    frames.append(MESSAGE_LINE.format(moment=_GAP, query=_GAP))
    pieces = [piece.strip().strip("\"'").strip() for frame in frames for piece in frame.split(_GAP)]
    markers = [piece for piece in pieces if re.search(r"[A-Za-z]{2}", piece)]
    fields = [*ReviewReply.model_fields, *SituationReply.model_fields, *Memory.model_fields]
    markers += [name for name in fields if "_" in name]
    templates = [entry for entry in root.iterdir() if entry.name.endswith(".md")]
    if (root / COMPACT).is_dir():
        templates += [entry for entry in (root / COMPACT).iterdir() if entry.name.endswith(".md")]
    labels = [label for entry in templates for label in _LABEL.findall(entry.read_text(encoding="utf-8"))]
    return tuple(dict.fromkeys(markers)), tuple(dict.fromkeys(labels))
