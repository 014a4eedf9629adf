"""The options of `personaemp stats` (TOML `[stats]`), declared once: each field makes
its flag, TOML key, env var and docs row (personaemp/options.py). A module of their own beside
the stage's code, so that `personaemp --help` reads them without importing it (pydantic only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from personaemp.options import PROCESSED, Force, Opt, Section, declare


@declare("stats")
class StatsOptions(Section):
    processed: Annotated[
        Path,
        Opt(
            "Folder the stages wrote to (its manifest.json names their files): the build to describe.",
            ("--processed",),
            derive="paths.processed",
        ),
    ] = PROCESSED
    out_dir: Annotated[
        Path,
        Opt(
            "Folder of stats.json and the plots (figures/*.png).",
            derive="processed:stats",
            io="folder",
            beside=("stats.json", "figures"),
            renamed_from="out",
        ),
    ] = PROCESSED / "stats"
    force: Force = False
