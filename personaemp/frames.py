"""Stage outputs as flat rows, for tables (StageResult.to_polars, .queries(), .scores()).

A personas or queries file has one row per user with the queries nested; a scores file has
one row per system and query with the scores nested. These views give one row per query
(or per scored query) with the user's columns beside it: user id, language, profile and
the five Big Five levels, so a DataFrame needs no hand flattening.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel

from personaemp.records import BIG_FIVE, DIMENSIONS, Persona, Query, User

# The columns of the flat views, declared once: an empty view has them too (0 rows).
LEVEL_COLUMNS = {trait: str for trait in BIG_FIVE}
USER_COLUMNS = {"user_id": str, "language": str, "profile": str, **LEVEL_COLUMNS}
QUERY_COLUMNS = {
    **USER_COLUMNS, "query_id": str, "category": str, "query": str, "situation": str, "topic": str,
    "memory_ids": list[str], "passed": bool,
}  # fmt: skip
SCORE_COLUMNS = {
    "system": str, "query_id": str, "user_id": str, "category": str, "status": str,
    **{d: float for d in DIMENSIONS}, "harmonic": float, "bystander": float, **LEVEL_COLUMNS,
}  # fmt: skip
# What a row of each stage's output holds (a gen-queries or split row: the persona and its queries).
RECORD_COLUMNS: dict[str, dict[str, Any]] = {
    "filter": dict(User.model_fields),
    "infer-persona": {**Persona.model_fields, **LEVEL_COLUMNS},
    "gen-queries": {**Persona.model_fields, "queries": list[Query], **LEVEL_COLUMNS},
}
RECORD_COLUMNS["split"] = RECORD_COLUMNS["gen-queries"]


def polars_schema(columns: dict[str, Any]) -> dict[str, Any]:
    """{name: polars dtype} of Python types, pydantic fields or records (structs)."""
    return {name: _dtype(getattr(kind, "annotation", kind)) for name, kind in columns.items()}


def _dtype(annotation: Any):
    import polars as pl

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        present = [arg for arg in args if arg is not type(None)]
        return _dtype(present[0]) if len(present) == 1 else pl.String
    if origin is typing.Literal:
        return pl.String
    if origin is list:
        return pl.List(_dtype(args[0]))
    if origin is dict:
        return pl.Struct({})  # its keys vary by row
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return pl.Struct(polars_schema(dict(annotation.model_fields)))
    return {str: pl.String, int: pl.Int64, float: pl.Float64, bool: pl.Boolean}.get(annotation, pl.String)


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
