"""The options of `personaemp filter` (TOML `[filter]`), declared once: each field makes
its flag, TOML key, env var and docs row (personaemp/options.py). A module of their own beside
the stage's code, so that `personaemp --help` reads them without importing it (pydantic only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from personaemp.options import PROCESSED, RAW_INPUT, Force, Format, Opt, Section, declare


@declare("filter")
class FilterOptions(Section):
    input: Annotated[
        str,
        Opt(
            "AlpsBench task1 folder, benchmark_data/ root, raw export file or folder, or hf:OWNER/NAME.",
            ("--input", "-i"),
            env="PERSONAEMP_INPUT",
            derive="paths.input",
            io="read",
        ),
    ] = RAW_INPUT
    format: Annotated[Format, Opt("Input format (auto: detected).")] = "auto"
    rules: Annotated[
        Path | None,
        Opt(
            "Rules TOML; each key it sets overrides the shipped default (see --show-rules).",
            metavar="FILE",
            io="read",
        ),
    ] = None
    output: Annotated[
        Path,
        Opt(
            "Kept users, one per line; filter_report.json goes beside it.",
            ("--output", "-o"),
            derive="processed:filtered.jsonl",
            io="write",
            beside=("filter_report.json",),
        ),
    ] = PROCESSED / "filtered.jsonl"
    benchmark_split: Annotated[
        str | None,
        Opt(
            "Split of a benchmark_data/ root (dev, validation, examples) or of a Hub dataset (train).",
            renamed_from="split",
        ),
    ] = None
    hf_config: Annotated[str | None, Opt("Config name of a Hub dataset.")] = None
    on_error: Annotated[
        Literal["fail", "skip"],
        Opt("fail: stop at the first bad row, write nothing; skip: skip bad rows and count them."),
    ] = "fail"
    turns: Annotated[
        Literal["user", "all"],
        Opt("user: keep the user's own turns (what later stages read); all: keep assistant turns too."),
    ] = "user"
    force: Force = False
