"""The options of `personaemp extract-memories` (TOML `[extract]`), declared once: each field makes
its flag, TOML key, env var and docs row (personaemp/options.py). A module of their own beside
the stage's code, so that `personaemp --help` reads them without importing it (pydantic only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from personaemp.options import PROCESSED, RAW_INPUT, LogFormat, Names, Opt, Section, Shard, declare


@declare("extract")
class ExtractOptions(Section):
    """[extract]: extract-memories, the stage before `filter` when the input is a conversation log."""

    input: Annotated[
        str,
        Opt(
            "Conversation log: WildChat parquet/JSONL, OpenAI-messages JSONL, ShareGPT JSON/JSONL, a "
            "CSV/parquet table of turns, or an AlpsBench task1 folder (its dialogues only).",
            ("--input", "-i"),
            derive="paths.input",
            io="read",
        ),
    ] = RAW_INPUT
    format: Annotated[LogFormat, Opt("Log format (auto: detected from the file and its first record).")] = (
        "auto"
    )
    output: Annotated[
        Path,
        Opt(
            "Users with their extracted memories, in the AlpsBench raw-export shape `filter` reads; "
            "conversations.jsonl (the users as read) goes beside it.",
            ("--output", "-o"),
            derive="processed:memories.jsonl",
            io="write",
            beside=(
                "conversations.jsonl",
                "extract-memories.failures.jsonl",
                "gold_comparison.json",
                "alpsbench_predictions.jsonl",
            ),
        ),
    ] = PROCESSED / "memories.jsonl"
    user_field: Annotated[
        str | None,
        Opt(
            "Field holding the user id (messages, ShareGPT: default user_id or user; WildChat: "
            "hashed_ip). Without one, each conversation is its own user.",
            metavar="NAME",
        ),
    ] = None
    user_column: Annotated[str, Opt("Table: the column of user ids.", metavar="NAME")] = "user_id"
    session_column: Annotated[
        str | None, Opt("Table: the column of conversation ids (none: one session per user).", metavar="NAME")
    ] = "session_id"
    order_column: Annotated[
        str, Opt("Table: the column of turn numbers within a session.", metavar="NAME")
    ] = "turn"
    role_column: Annotated[str, Opt("Table: the column of roles (user, assistant).", metavar="NAME")] = "role"
    text_column: Annotated[str, Opt("Table: the column of turn texts.", metavar="NAME")] = "text"
    time_column: Annotated[str | None, Opt("Table: a column of timestamps (optional).", metavar="NAME")] = (
        None
    )
    time_format: Annotated[
        str | None,
        Opt(
            "strptime format of text timestamps (e.g. %m/%d/%Y %H:%M); without it, ISO 8601 or seconds "
            "(milliseconds from 1e11 up) since 1970. A time without a zone is UTC.",
            metavar="FORMAT",
        ),
    ] = None
    max_sessions: Annotated[int, Field(ge=1), Opt("Latest sessions kept per user.")] = 50
    max_turns: Annotated[
        int, Field(ge=1), Opt("Latest turns kept per user, all roles (AlpsBench's longest: 249).")
    ] = 249
    max_turn_chars: Annotated[
        int,
        Field(ge=200),
        Opt("Characters kept of a longer turn (its head and tail); code blocks cut first."),
    ] = 2000
    max_user_chars: Annotated[
        int, Field(ge=1000), Opt("Characters of the user's own messages per prompt (the latest kept).")
    ] = 24000
    on_error: Annotated[
        Literal["fail", "skip"],
        Opt("fail: stop at the first bad row, write nothing; skip: skip bad rows and count them."),
    ] = "fail"
    compare_gold: Annotated[
        Path | None,
        Opt(
            "AlpsBench reference_output.jsonl: write precision, recall and F1 of the extracted memories "
            "against it (gold_comparison.json beside the output).",
            metavar="FILE",
            io="read",
        ),
    ] = None
    match_threshold: Annotated[
        float, Field(gt=0, le=1), Opt("--compare-gold: the value overlap (token F1) a match needs.")
    ] = 0.3
    alpsbench_predictions: Annotated[
        bool,
        Opt(
            "Also write alpsbench_predictions.jsonl beside the output: the memories as AlpsBench's task1 "
            "scorer reads them (memory_items per session; with --compare-gold, the gold beside them)."
        ),
    ] = False
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N users.")] = None
    users: Annotated[
        Names | None,
        Field(min_length=1),
        Opt("Only these user ids (repeat or comma-separate).", metavar="ID"),
    ] = None
    shard: Shard = None
