"""The options of `personaemp respond` (TOML `[respond]`), declared once: each field makes
its flag, TOML key, env var and docs row (personaemp/options.py). A module of their own beside
the stage's code, so that `personaemp --help` reads them without importing it (pydantic only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from personaemp.options import (
    PROCESSED,
    Context,
    MismatchSeed,
    Opt,
    Part,
    RagK,
    Section,
    SplitSetting,
    SplitsFolder,
    declare,
)


@declare("respond")
class RespondOptions(Section):
    splits: SplitsFolder = PROCESSED / "splits"
    split: SplitSetting = "random"
    part: Annotated[Part, Opt("Part of the split.")] = "test"
    context: Annotated[
        Context,
        Opt(
            "What the policy sees besides the query: nothing (w/o memory), the numbered memories "
            "(the paper's input), a summary of the user it first writes from them (the Memory "
            "baseline), the rag_k memories most similar to the query (RAG), another user's "
            "memories (mismatched memory), or the persona (the judge reads it too)."
        ),
    ] = "memory"
    rag_k: RagK = 3
    mismatch_seed: MismatchSeed = 0
    output: Annotated[
        Path | None,
        Opt(
            "Responses, one per query (default: responses-<split>-<part>-<context>.jsonl beside the "
            "splits folder; name one per model).",
            ("--output", "-o"),
            io="write",
            beside=("{stem}.failures.jsonl",),
        ),
    ] = None
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N queries.")] = None

    @property
    def output_path(self) -> Path:
        return self.output or self.splits.parent / f"responses-{self.split}-{self.part}-{self.context}.jsonl"
