"""The criteria writer: what it is asked per query and PERM dimension (4-6 weighted
criteria from the user's memories, persona, situation and query, no response seen), how
its reply is read (weights normalised to 100), and the criteria file that evaluation,
training and push read."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from personaemp.errors import InputError, RowError, first_problem
from personaemp.io import ErrorPolicy, iter_jsonl
from personaemp.llm.step import RejectedReply, Step
from personaemp.manifest import resolved
from personaemp.prompts import Prompt
from personaemp.records import BIG_FIVE, DIMENSION_DEFINITIONS, DIMENSIONS, Criterion
from personaemp.shared_options import DEFAULT_LAYOUT


class CriterionReply(BaseModel):
    name: str
    weight: float = Field(description="how much this criterion counts, a positive number")
    description: str = Field(description="what a response must do to meet it, for this user")


class CriteriaReply(BaseModel):
    criteria: list[CriterionReply] = Field(min_length=4, max_length=6)


# Shared by every system; at the authors' temperature (evaluation/prepare_criteria.py: 0.2).
CRITERIA = Step("criteria", CriteriaReply, prompt="criteria", temperature=0.2)


ROOM = {CRITERIA.name: 2048}  # tokens at least, as the authors' criteria writer


# What each dimension covers when criteria are written (the sub-aspects the authors'
# criteria writer lists per dimension, in our words). Part of the fingerprint.
CRITERIA_ASPECTS = {
    "resonation": (
        "- recognition: the feeling the user shows, how strong it is, and what set it off;",
        "- inference: the concern, unmet need, conflict or vulnerability under the surface;",
        "- grounding: an understanding the moment and the message support, without over-reading "
        "or inventing motives;",
        "- personal resonance: persona and memories sharpen the understanding of this person "
        "without pinning them to a fixed trait;",
        "- humility: room left for what cannot be known about the user's inner state.",
    ),
    "expression": (
        "- tone: warm, sincere, calm, in step with the user's emotional state;",
        "- validation first: feelings and situation acknowledged before advice, reframing or "
        "problem solving;",
        "- clarity and use: coherent, concrete, helpful for the situation at hand;",
        "- respect and boundaries: no judgment, pressure, exaggeration, false certainty or "
        "intrusive claims about the user's inner world;",
        "- personal adaptation: style and support strategy fitted to persona and memories where "
        "relevant, without sounding scripted or over-familiar.",
    ),
    "reception": (
        "- felt understanding: the user would feel their feeling, situation and concern were "
        "truly understood;",
        "- emotional safety: respectful, non-judgmental, non-intrusive, safe to receive;",
        "- need met: the likely immediate need (validation, reassurance, autonomy, perspective, "
        "encouragement or direction) is answered;",
        "- engagement: the user would want to go on, clarify, reflect or share more;",
        "- personal fit: right for this user's personality, history, sensitivities and "
        "preferences, while meeting the general standards of emotional intelligence.",
    ),
}


def numbered_memories(memories: Sequence[dict]) -> str:
    return "\n".join(f"[{m['memory_id']}] {m['value']}" for m in memories) or "(none)"


def query_units(path: Path, hint: str, unit_maker=None) -> list[dict[str, Any]]:
    """Every accepted query of a gen-queries or split file, with what a judge reads about
    its user (or what `unit_maker(record, levels)` makes of each query). Query ids must be
    unique: they key the criteria, responses, dialogues and scores."""
    from personaemp.splits import check_queries_row, profile_of

    units: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    try:
        for lineno, _, row in iter_jsonl(path, ErrorPolicy("fail")):
            record = check_queries_row(row, f"{path}:{lineno}", hint)
            make = (unit_maker or judge_unit)(record, profile_of(row))
            for query in record.queries:
                if query.query_id in seen:
                    raise InputError(
                        f"{path}:{lineno}: query id {query.query_id} appears twice "
                        f"(first at {seen[query.query_id]})",
                        hint,
                    )
                seen[query.query_id] = f"{path}:{lineno}"
                units.append(make(query))
    except RowError as error:
        raise InputError(f"{error.location}: {error.reason}", hint) from None
    if not units:
        raise InputError(f"{path}: no accepted query", hint)
    return units


def judge_unit(record, levels):
    """A query as a judge or a policy reads it, with its user's profile, memories and levels."""
    return lambda query: {
        "query_id": query.query_id, "user_id": record.user_id, "category": query.category,
        "query": query.query, "situation": query.situation.text, "profile": record.profile,
        "memories": [m.model_dump(include={"memory_id", "value"}) for m in record.memories],
        "big_five": dict(zip(BIG_FIVE, levels, strict=True)) if levels else None,
    }  # fmt: skip


# What a query is, for everything made for it (criteria, responses, scores): its text, category
# and situation, and what a judge or a policy reads about its user. Query ids are
# `<user_id>-qN`, so a rebuild gives new texts under old ids: whatever joins two files by id
# also compares this hash.
QUERY_FIELDS = ("query_id", "user_id", "category", "query", "situation", "profile", "memories", "big_five")


def query_hash(unit: dict[str, Any]) -> str:
    """The hash of a query unit (as `query_units` reads it) that criteria, responses and
    evaluate reports carry as `query_hash`."""
    encoded = json.dumps({key: unit.get(key) for key in QUERY_FIELDS}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(encoded.encode()).hexdigest()[:16]


def made_for(path: Path) -> dict[str, str | None]:
    """query id -> the `query_hash` a file's row carries (None: a row written by hand or by a
    personaemp from before the hash, which nothing can check)."""
    found: dict[str, str | None] = {}
    for _, _, row in iter_jsonl(path, ErrorPolicy("fail")):
        if isinstance(row, dict) and "query_id" in row:
            value = row.get("query_hash")
            found[str(row["query_id"])] = value if isinstance(value, str) else None
    return found


def check_made_for(path: Path, hashes: dict[str, str | None], units: Sequence[dict], what: str, remake: str):
    """Stop when `path`'s rows were made for another version of a query of `units` (the same
    id, another text, situation or user): nothing is scored or published on stale rows."""
    stale = [u["query_id"] for u in units if hashes.get(u["query_id"]) not in (None, query_hash(u))]
    if stale:
        shown = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
        raise InputError(
            f"{path}: the {what} of {len(stale)} "
            f"{'query were' if len(stale) == 1 else 'queries were'} made for another version of "
            f"{'it' if len(stale) == 1 else 'them'} ({shown})",
            f"run `{remake}` to remake them",
        )


def dimensions_text(aspects: dict[str, Any]) -> str:
    """Every dimension with its definition and what it covers: the shared layout's task (the
    same bytes for every query, where a provider's prefix cache serves them)."""
    parts = []
    for dimension in DIMENSIONS:
        lines = [aspects[dimension]] if isinstance(aspects[dimension], str) else aspects[dimension]
        parts.append(f"{dimension} — {DIMENSION_DEFINITIONS[dimension]}\n" + "\n".join(lines))
    return "\n\n".join(parts)


def build_messages(unit: dict, dimension: str, prompt: Prompt, layout: str = DEFAULT_LAYOUT) -> list[dict]:
    return prompt.render(
        layout,
        dimension=dimension,
        definition=DIMENSION_DEFINITIONS[dimension],
        aspects="\n".join(CRITERIA_ASPECTS[dimension]),
        dimensions=dimensions_text(CRITERIA_ASPECTS),
        profile=unit["profile"] or "(none)",
        memories=numbered_memories(unit["memories"]),
        situation=unit["situation"],
        query=unit["query"],
    )


def normalise(reply: CriteriaReply) -> list[Criterion]:
    """Weights scaled to sum to exactly 100, in hundredths (largest remainders get the
    rounding); a weight <= 0, or one too small to show, is refused and re-asked."""
    given = [c.weight for c in reply.criteria]
    if any(w <= 0 for w in given):
        raise RejectedReply("invalid", "every weight must be a positive number")
    total = sum(given)
    exact = [w * 10_000 / total for w in given]  # in hundredths of a point
    cents = [int(x) for x in exact]
    for index in sorted(range(len(exact)), key=lambda i: cents[i] - exact[i])[: 10_000 - sum(cents)]:
        cents[index] += 1
    if min(cents) == 0:
        raise RejectedReply("invalid", "a weight is too small next to the others: give each at least 1")
    return [
        Criterion(
            name=c.name.strip(), weight=cent / 100, description=c.description.strip(), given_weight=c.weight
        )
        for c, cent in zip(reply.criteria, cents, strict=True)
    ]


def with_room(settings, room: dict[str, int]):
    """`settings` whose steps get at least `room` tokens (more with --max-tokens); a step's
    own --step STEP.max_tokens wins."""
    import dataclasses

    steps = dict(settings.steps)
    for name, tokens in room.items():
        steps[name] = {"max_tokens": max(settings.max_tokens, tokens), **steps.get(name, {})}
    return dataclasses.replace(settings, steps=steps)


def definitions_hash(*extra: dict) -> str:
    """The dimension definitions (and aspects) rendered into the prompts live in code: part of
    the fingerprint."""
    parts = [DIMENSION_DEFINITIONS, CRITERIA_ASPECTS, *extra]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def read_criteria(path: Path) -> dict[str, dict[str, list[dict]]]:
    """query id -> {dimension: criteria} from a criteria file."""
    found: dict[str, dict[str, list[dict]]] = {}
    hint = "pass the output of `personaemp criteria`"
    try:
        for lineno, _, row in iter_jsonl(path, ErrorPolicy("fail")):
            criteria = row.get("criteria") if isinstance(row, dict) else None
            if not isinstance(criteria, dict) or not all(
                isinstance(criteria.get(d), list) and criteria[d] for d in DIMENSIONS
            ):
                raise InputError(
                    f"{path}:{lineno}: not a criteria row (criteria for {', '.join(DIMENSIONS)})", hint
                )
            try:
                checked = {
                    d: [Criterion.model_validate(item, strict=True).model_dump() for item in criteria[d]]
                    for d in DIMENSIONS
                }
            except ValidationError as exc:
                raise InputError(
                    f"{path}:{lineno}: not a criteria row ({first_problem(exc)})", hint
                ) from None
            found[str(row.get("query_id"))] = checked
    except RowError as error:
        raise InputError(f"{error.location}: {error.reason}", hint) from None
    return found


def remake_criteria(split_path: Path, criteria: Path) -> str:
    """The command that remakes a criteria file for the queries behind a split file (the split
    report names them); on the split file alone it would keep only that part's criteria."""
    report = Path(split_path).parent.parent / "split_report.json"
    try:
        source = json.loads(report.read_text(encoding="utf-8")).get("input")
    except (OSError, ValueError, AttributeError):
        source = None
    source = resolved(source, report.parent) if isinstance(source, str) else None
    source = source or "QUERIES (the file the split was made from)"
    return f"personaemp criteria --input {source} --output {criteria}"


def fresh_criteria(path: Path, split_paths: Sequence[Path]) -> dict[str, dict[str, list[dict]]]:
    """`read_criteria`, after checking every row made for a query of the split files was made
    for the query they hold now (what `push` publishes beside them)."""
    found = read_criteria(path)
    hashes = made_for(path)
    for split_path in split_paths:
        check_made_for(
            path, hashes, query_units(split_path, "pass the folder written by `personaemp split`"),
            "criteria", remake_criteria(split_path, path),
        )  # fmt: skip
    return found
