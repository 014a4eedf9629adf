"""The options of `personaemp gen-dialogues` (TOML `[dialogues]`), declared once: each field makes
its flag, TOML key, env var and docs row (personaemp/options.py). A module of their own beside
the stage's code, so that `personaemp --help` reads them without importing it (pydantic only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from personaemp.options import PROCESSED, Context, MismatchSeed, Names, Opt, RagK, Section, declare


@declare("dialogues")
class DialoguesOptions(Section):
    input: Annotated[
        Path,
        Opt(
            "Accepted queries: gen-queries' output or a split file (one dialogue per query).",
            ("--input", "-i"),
            derive="queries.output",
            io="read",
        ),
    ] = PROCESSED / "queries.jsonl"
    output: Annotated[
        Path,
        Opt(
            "Dialogues, one per query.",
            ("--output", "-o"),
            derive="processed:dialogues.jsonl",
            io="write",
            beside=("gen-dialogues.failures.jsonl",),
        ),
    ] = PROCESSED / "dialogues.jsonl"
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N dialogues.")] = None
    per_user: Annotated[int | None, Field(ge=1), Opt("Only the first N queries of each user.")] = None
    max_turns: Annotated[
        int, Field(ge=1, le=20), Opt("Supporter turns at most; the user may end sooner.")
    ] = 6
    context: Annotated[
        Context,
        Opt("What the supporter sees besides the conversation, as for `respond --context`."),
    ] = "memory"
    rag_k: RagK = 3
    mismatch_seed: MismatchSeed = 0
    supporter_model: Annotated[
        str | None,
        Opt(
            "The model under test (default: --model; the simulator is always the LLM options' model).",
            env="PERSONAEMP_SUPPORTER_MODEL",
        ),
    ] = None
    supporter_base_url: Annotated[
        Names,
        Opt("The supporter's endpoint (default: the LLM options' endpoint; same key).",
            env="PERSONAEMP_SUPPORTER_BASE_URL", metavar="URL"),
    ] = []  # fmt: skip
    turn_attempts: Annotated[
        int,
        Field(ge=1, le=10),
        Opt("Replies asked per simulated turn that breaks a rule before the dialogue fails."),
    ] = 3
    character_check: Annotated[
        bool, Opt("Check each simulated turn with the LLM: in character, no invented facts.")
    ] = True
