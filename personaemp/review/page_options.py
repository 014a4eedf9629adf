"""The options of `personaemp review` (TOML `[review]`), declared once: each field makes
its flag, TOML key, env var and docs row (personaemp/options.py). A module of their own beside
the stage's code, so that `personaemp --help` reads them without importing it (pydantic only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from personaemp.options import PROCESSED, Opt, Section, declare


@declare("review")
class ReviewOptions(Section):
    input: Annotated[
        Path,
        Opt("Queries to review (gen-queries' output: accepted and rejected).", ("--input", "-i"),
            derive="queries.output", io="read"),
    ] = PROCESSED / "queries.jsonl"  # fmt: skip
    labels: Annotated[
        Path | None,
        Opt(
            "Labels file: every click is appended to it at once (JSON lines; several reviewers share "
            "it). Default: labels.jsonl beside --input, where `agreement` and the card look.",
            ("--labels",),
            io="update",
        ),
    ] = None
    size: Annotated[
        int,
        Field(ge=1),
        Opt("Queries in the sample, taken in turn from each category/language/outcome stratum."),
    ] = 60
    seed: Annotated[
        int, Opt("Seed of the sample (the same seed gives the same queries in the same order).")
    ] = 0
    host: Annotated[
        str,
        Opt(
            "Address to serve the page on. Every API call needs the session's token (in the address "
            "printed at start); beyond loopback (0.0.0.0), whoever reaches it with that address can "
            "read the sample and label, over plain HTTP."
        ),
    ] = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535), Opt("Port of the page (0: any free port).")] = 8765
