"""The options of `personaemp gen-queries` (TOML `[queries]`), declared once: each field makes
its flag, TOML key, env var and docs row (personaemp/options.py). A module of their own beside
the stage's code, so that `personaemp --help` reads them without importing it (pydantic only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from personaemp.options import (
    CHECKS,
    PROCESSED,
    Categories,
    Checks,
    Force,
    Names,
    Opt,
    Section,
    Shard,
    _some_checks,
    declare,
)


@declare("queries")
class QueriesOptions(Section):
    input: Annotated[
        Path, Opt("Personas (infer-persona's output).", ("--input", "-i"), derive="persona.output", io="read")
    ] = PROCESSED / "personas.jsonl"
    output: Annotated[
        Path,
        Opt(
            "Accepted queries per user; rejected.jsonl goes beside it.",
            ("--output", "-o"),
            derive="processed:queries.jsonl",
            io="write",
            beside=("rejected.jsonl", "gen-queries.failures.jsonl"),
        ),
    ] = PROCESSED / "queries.jsonl"
    per_category: Annotated[int, Field(ge=1), Opt("Situations (so queries) per category per user.")] = 1
    categories: Annotated[
        Categories, Field(min_length=1), Opt("Query categories: a subset of ES, HEQ, SS.", metavar="CATS")
    ] = ["ES", "HEQ", "SS"]
    enforce: Annotated[
        Checks | None,
        Opt(
            f"Checks a query must pass (default: every check; all are recorded): {', '.join(CHECKS)}.",
            metavar="CHECKS",
        ),
    ] = None
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N eligible users.")] = None
    users: Annotated[
        Names | None,
        Field(min_length=1),
        Opt("Only these user ids (repeat or comma-separate).", metavar="ID"),
    ] = None
    shard: Shard = None
    force: Force = False

    _enforce_names_a_check = field_validator("enforce")(_some_checks)
