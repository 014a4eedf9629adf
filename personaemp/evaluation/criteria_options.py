"""The options of `personaemp criteria` (TOML `[criteria]`), declared once: each field makes
its flag, TOML key, env var and docs row (personaemp/options.py). A module of their own beside
the stage's code, so that `personaemp --help` reads them without importing it (pydantic only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from personaemp.options import DEFAULT_LAYOUT, PROCESSED, Layout, Names, Opt, Section, declare


@declare("criteria")
class CriteriaOptions(Section):
    input: Annotated[
        Path,
        Opt(
            "Queries (gen-queries' output, or a split file).",
            ("--input", "-i"),
            derive="queries.output",
            io="read",
        ),
    ] = PROCESSED / "queries.jsonl"
    output: Annotated[
        Path,
        Opt(
            "Criteria per query and dimension.",
            ("--output", "-o"),
            derive="processed:criteria.jsonl",
            io="write",
            beside=("criteria.failures.jsonl",),
        ),
    ] = PROCESSED / "criteria.jsonl"
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N queries.")] = None
    users: Annotated[
        Names | None,
        Field(min_length=1),
        Opt("Only the queries of these user ids (repeat or comma-separate).", metavar="ID"),
    ] = None
    layout: Layout = DEFAULT_LAYOUT
