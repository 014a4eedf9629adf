"""The options of `personaemp split` (TOML `[split]`), declared once: each field makes
its flag, TOML key, env var and docs row (personaemp/options.py). A module of their own beside
the stage's code, so that `personaemp --help` reads them without importing it (pydantic only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, model_validator

from personaemp.options import PROCESSED, Force, Opt, OptionProblem, Section, declare


@declare("split")
class SplitOptions(Section):
    input: Annotated[
        Path, Opt("Queries (gen-queries' output).", ("--input", "-i"), derive="queries.output", io="read")
    ] = PROCESSED / "queries.jsonl"
    out_dir: Annotated[
        Path,
        Opt(
            "Folder of the splits and split_report.json.",
            ("--out-dir", "-o"),
            derive="processed:splits",
            io="folder",
            beside=("random", "ood", "split_report.json"),
        ),
    ] = PROCESSED / "splits"
    ood: Annotated[
        bool, Opt("Also the OOD split: one Big Five cluster held out (the paper publishes both).")
    ] = True
    seed: Annotated[int, Opt("Seed of the shuffle and of KModes.")] = 13
    test_size: Annotated[float, Field(gt=0, lt=1), Opt("Share of users in test (OOD: the target size).")] = (
        0.1
    )
    k: Annotated[
        int | None, Field(ge=2), Opt("Clusters; default: the elbow over k_min..k_max.", ("--k",))
    ] = None
    k_min: Annotated[int, Field(ge=2), Opt("Smallest k of the elbow sweep.")] = 2
    k_max: Annotated[int, Field(ge=2), Opt("Largest k of the elbow sweep.")] = 8
    holdout: Annotated[
        int | None, Field(ge=0), Opt("Cluster id to hold out; default: the size closest to test_size.")
    ] = None
    seeds: Annotated[int, Field(ge=1), Opt("KModes runs per k (the lowest cost is kept).")] = 5
    force: Force = False

    @model_validator(mode="after")
    def _k_range(self) -> SplitOptions:
        if self.k_min > self.k_max:
            raise OptionProblem("k_min", "must be at most {k_max}")
        return self
