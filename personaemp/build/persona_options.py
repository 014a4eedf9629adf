"""The options of `personaemp infer-persona` (TOML `[persona]`), declared once: each field makes
its flag, TOML key, env var and docs row (personaemp/options.py). A module of their own beside
the stage's code, so that `personaemp --help` reads them without importing it (pydantic only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from personaemp.options import (
    PERSONA_CHECKS,
    PROCESSED,
    Force,
    Names,
    Opt,
    PersonaChecks,
    Section,
    Shard,
    _some_checks,
    declare,
)


@declare("persona")
class PersonaOptions(Section):
    input: Annotated[
        Path, Opt("Filtered users (filter's output).", ("--input", "-i"), derive="filter.output", io="read")
    ] = PROCESSED / "filtered.jsonl"
    output: Annotated[
        Path,
        Opt(
            "Personas, one per user.",
            ("--output", "-o"),
            derive="processed:personas.jsonl",
            io="write",
            beside=("infer-persona.failures.jsonl",),
        ),
    ] = PROCESSED / "personas.jsonl"
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N users.")] = None
    users: Annotated[
        Names | None,
        Field(min_length=1),
        Opt("Only these user ids (repeat or comma-separate).", metavar="ID"),
    ] = None
    require_depth: Annotated[
        bool, Opt("Drop users the depth check turns away (--no-require-depth keeps grounded ones).")
    ] = True
    enforce: Annotated[
        PersonaChecks | None,
        Opt(
            "Checks a trait statement or Big Five rationale must pass, else the reply is asked "
            f"again (default: every check; all are recorded): {', '.join(PERSONA_CHECKS)}.",
            metavar="CHECKS",
        ),
    ] = None
    shard: Shard = None
    force: Force = False

    _enforce_names_a_check = field_validator("enforce")(_some_checks)
