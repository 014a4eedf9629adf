"""Stage outputs as flat rows, for tables (StageResult.to_polars, .queries(), .scores()).

A personas or queries file has one row per user with the queries nested; a scores file has
one row per system and query with the scores nested. These views give one row per query
(or per scored query) with the user's columns beside it: user id, language, profile and
the five Big Five levels, so a DataFrame needs no hand flattening.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from personaemp.records import BIG_FIVE, DIMENSIONS


def levels(big_five: Any) -> dict[str, str | None]:
    """{trait: level} from a persona's Big Five ({trait: {level, ...}}) or a flat one."""
    found = big_five if isinstance(big_five, dict) else {}
    out = {}
    for trait in BIG_FIVE:
        entry = found.get(trait)
        out[trait] = entry.get("level") if isinstance(entry, dict) else entry
    return out


def user_columns(row: dict[str, Any]) -> dict[str, Any]:
    """What every flat row of a user carries: id, language, profile, Big Five levels."""
    return {
        "user_id": row.get("user_id"),
        "language": row.get("language"),
        "profile": row.get("profile"),
        **levels(row.get("big_five")),
    }


def with_levels(rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Rows as they are, plus the five levels as columns of their own when a row has a Big Five."""
    for row in rows:
        yield {**row, **levels(row["big_five"])} if isinstance(row.get("big_five"), dict) else row


def query_rows(rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One row per accepted query of a gen-queries or split file (nested per user), the
    user's columns joined; rows already one per query (a published dataset) pass through
    with their levels flattened."""
    for row in rows:
        if "queries" not in row and "query" in row:
            yield {**row, **levels(row.get("big_five"))}
            continue
        user = user_columns(row)
        for query in row.get("queries") or []:
            situation = query.get("situation") or {}
            yield {
                **user,
                "query_id": query.get("query_id"),
                "category": query.get("category"),
                "query": query.get("query"),
                "situation": situation.get("text") if isinstance(situation, dict) else situation,
                "topic": situation.get("topic") if isinstance(situation, dict) else None,
                "memory_ids": query.get("memory_ids") or [],
                "passed": (query.get("checks") or {}).get("passed"),
            }


def score_rows(rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One row per system and query of an evaluate scores file: each dimension's score, H
    (their harmonic mean / 5, when all three are there), B, and the user's levels."""
    from personaemp.instruments.judges import harmonic

    for row in rows:
        scores = row.get("scores") or {}
        whole = all(d in scores for d in DIMENSIONS)
        yield {
            "system": row.get("system"),
            "query_id": row.get("query_id"),
            "user_id": row.get("user_id"),
            "category": row.get("category"),
            "status": row.get("status"),
            **{d: scores.get(d) for d in DIMENSIONS},
            "harmonic": harmonic(scores) if whole else None,
            "bystander": row.get("bystander"),
            **levels(row.get("big_five")),
        }
