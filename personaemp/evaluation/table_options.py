"""The options of `personaemp table` (TOML `[table]`), declared once: each field makes
its flag, TOML key, env var and docs row (personaemp/options.py). A module of their own beside
the stage's code, so that `personaemp --help` reads them without importing it (pydantic only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from personaemp.options import Names, Opt, Section, declare


@declare("table")
class TableOptions(Section):
    reports: Annotated[
        Names,
        Opt(
            "Report of `personaemp evaluate` (one per split: random, ood), repeatable; each judge "
            "of a report is a column group.",
            ("--report", "-r"),
            metavar="FILE",
            io="read",
        ),
    ] = []
    format: Annotated[Literal["markdown", "csv", "latex"], Opt("Output format.")] = "markdown"
    output: Annotated[
        Path | None, Opt("Write the table here (default: print it).", ("--output", "-o"), io="write")
    ] = None
    harmonic: Annotated[bool, Opt("Add H (0-1) beside Avg in each group.")] = False
    digits: Annotated[int, Field(ge=0, le=6), Opt("Decimals shown.")] = 2
    judge: Annotated[
        str | None,
        Opt("Only this judge of a panel report (e.g. the paper's Table 2 from a Table 1 run).", ("--judge",)),
    ] = None
    systems: Annotated[
        Names | None,
        Field(min_length=1),
        Opt("Only these systems, in this order (repeat or comma-separate).", metavar="NAME"),
    ] = None
