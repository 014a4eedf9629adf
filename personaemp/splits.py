"""The split files, as split writes them and evaluation, training and push read them:
where a part lives, what a queries row must hold, a user's Big Five profile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from personaemp.errors import InputError, first_problem
from personaemp.records import BIG_FIVE, Category, Memory, Record, Trait, Turn

LEVELS = ("low", "medium", "high")


REPORT_FILE = "split_report.json"


SETTINGS_WRITTEN = ("random", "ood")  # the folders a split writes under its --out-dir


class QuerySituation(Record):
    topic: str
    text: str


class PublishedQuery(Record):
    query_id: str
    category: Category
    query: str
    situation: QuerySituation
    memory_ids: list[str]


class QueriesRow(Record):
    """A gen-queries row as far as split and push read it (the rest is carried along as is).

    The Big Five is checked by `profile_of` instead: a user without a complete profile is
    counted as left out, not refused.
    """

    user_id: str
    eligible: bool = True
    language: str | None = None
    profile: str = ""
    topics: list[str] = []
    traits: list[Trait] = []
    memories: list[Memory]
    turns: list[Turn] = []
    big_five: Any = None
    queries: list[PublishedQuery]


def check_queries_row(row: Any, location: str, hint: str) -> QueriesRow:
    """`row` validated as a queries row, else an InputError naming `location` and the field."""
    if not isinstance(row, dict):
        raise InputError(f"{location}: not a queries row (a JSON object is expected)", hint)
    try:
        return QueriesRow.model_validate(row)
    except ValidationError as exc:
        raise InputError(f"{location}: not a queries row ({first_problem(exc)})", hint) from None


def profile_of(row: dict) -> tuple[str, ...] | None:
    """The user's five levels in BIG_FIVE order, or None if it has no complete Big Five."""
    big_five = row.get("big_five")
    if not isinstance(big_five, dict):
        return None
    entries = [big_five.get(trait) for trait in BIG_FIVE]
    levels = tuple(entry.get("level") if isinstance(entry, dict) else None for entry in entries)
    return levels if all(level in LEVELS for level in levels) else None


def split_file(splits: Path, split: str, part: str) -> Path:
    path = splits / split / f"{part}.jsonl"
    if not path.exists():
        raise InputError(f"{path}: no such split file", "run `personaemp split` first, or check --splits")
    return path
