"""Conversation logs without memories: WildChat, OpenAI-messages JSONL, ShareGPT, tables.

Each reader yields `LogUser`s: one person's conversations as sessions in time order, every
turn with its position in its conversation (AlpsBench's `utterance_index`). Users are grouped
as the data says (WildChat: `hashed_ip`; messages and ShareGPT: a user field; tables: a user
column). JSON lines are indexed first (user -> line offsets) and read back user by user, so
memory holds the index, not the dialogues; tables are read with polars, lazily, sorted into
a temporary parquet file and streamed back in batches.

Sessions are ordered by the instant of their timestamp (`read_instant`): ISO 8601 (a time
without a zone is UTC), a number of seconds since 1970 (milliseconds from MILLISECONDS_FROM
up), or text in the strptime format `time_format` names; a value none of these reads is a
bad row.
Sessions without a timestamp come first, in file order (they cannot be shown to be recent);
the timestamps are written out as ISO 8601 in UTC. A conversation that comes again for the
same user with the same id and the same turns is kept once (`duplicate_conversations`); with
other turns it is kept under the id `<id>#2`, `#3`, ... (`session_ids_repeated`).

`bound_user` then bounds a history as AlpsBench's own sequences are bounded (6 to 249 turns):
the latest sessions and turns are kept, pasted code and essays trimmed. What it cut is
counted per user (`Bounds.counts`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy, iter_json_array, iter_jsonl
from personaemp.sources.logs.conversations import (
    TABLE_SUFFIXES,
    Bounds,
    LogSession,
    LogTurn,
    LogUser,
    _session,
    bound_user,
    iso_instant,
    read_instant,
    trim_text,
)
from personaemp.sources.logs.jsonl import _PARSERS, read_jsonl_log
from personaemp.sources.logs.tables import DEFAULT_COLUMNS, read_table, read_wildchat_parquet, table_columns
from personaemp.vocabulary import LOG_READERS as LOG_FORMATS  # the readers here, declared once

__all__ = [
    "DEFAULT_COLUMNS", "LOG_FORMATS", "TABLE_SUFFIXES", "Bounds", "LogSession", "LogTurn", "LogUser",
    "bound_user", "detect_log_format", "is_conversation_log", "iso_instant", "read_instant", "read_jsonl_log",
    "read_log", "read_table", "read_task1_dialogues", "read_wildchat_parquet", "table_columns", "trim_text",
]  # fmt: skip

# --- AlpsBench task1 dialogues (no gold read) ---------------------------------------------------


def read_task1_dialogues(path: Path, policy: ErrorPolicy) -> Iterator[LogUser]:
    """model_input.jsonl alone: one user per benchmark_id, its sessions as given."""
    from personaemp.sources.task1 import INPUT_FILE

    file = path / INPUT_FILE if path.is_dir() else path
    if not file.is_file():
        raise InputError(f"{path}: no {INPUT_FILE}", "point --input at an AlpsBench task1 folder")
    for lineno, _, row in iter_jsonl(file, policy):
        location = f"{file}:{lineno}"
        try:
            if not isinstance(row, dict) or not isinstance(row.get("benchmark_id"), str):
                raise RowError(location, "missing required field 'benchmark_id'")
            data = row.get("input")
            sessions_in = data.get("sessions") if isinstance(data, dict) else None
            if not isinstance(sessions_in, list):
                raise RowError(location, "missing required field 'input.sessions'")
            counts: dict[str, int] = {}
            sessions = []
            for position, session in enumerate(sessions_in):
                if not isinstance(session, dict) or not isinstance(session.get("turns"), list):
                    raise RowError(location, "each session needs a 'turns' list")
                turns = session["turns"]
                made = _session(
                    str(session.get("session_id") or position), None,
                    [(t.get("role"), t.get("text")) if isinstance(t, dict) else (None, None) for t in turns],
                    location, counts,
                )  # fmt: skip
                if made is not None:  # AlpsBench numbers turns itself: keep its indices
                    for turn in made.turns:
                        given = turns[turn.index].get("utterance_index")
                        turn.index = given if isinstance(given, int) else turn.index
                    sessions.append(made)
        except RowError as error:
            policy.handle(error)
            continue
        if sessions:
            yield LogUser(row["benchmark_id"], location, "task1", str(file), sessions, True, counts)


# --- entry point ---------------------------------------------------------------------------------


def detect_log_format(path: Path) -> str:
    """wildchat, messages, sharegpt, table or task1, from the path and its first record."""
    from personaemp.sources.task1 import INPUT_FILE

    if not path.exists():
        raise InputError(f"{path}: no such file or folder", "check --input")
    if path.is_dir():
        if (path / INPUT_FILE).is_file():
            return "task1"
        raise InputError(
            f"{path}: a folder without {INPUT_FILE}", "give a log file, or an AlpsBench task1 folder"
        )
    if path.name == INPUT_FILE:
        return "task1"
    if path.suffix in (".csv", ".tsv"):
        return "table"
    if path.suffix == ".parquet":
        columns = table_columns(path)
        return "wildchat" if {"conversation", "hashed_ip"} <= set(columns) else "table"
    if path.suffix not in (".json", ".jsonl"):
        raise InputError(f"{path}: cannot tell the format", f"pass --format {'|'.join(LOG_FORMATS)}")
    first = _first_record(path)
    if isinstance(first, dict):
        if isinstance(first.get("conversation"), list):
            return "wildchat"
        if isinstance(first.get("messages"), list):
            return "messages"
        if isinstance(first.get("conversations"), list):
            return "sharegpt"
    raise InputError(
        f"{path}: cannot tell the format from its first record",
        "expected 'conversation' (WildChat), 'messages' or 'conversations' (ShareGPT); or pass --format",
    )


def _first_record(path: Path) -> Any:
    policy = ErrorPolicy("fail")
    records = iter_json_array(path, policy) if path.suffix == ".json" else iter_jsonl(path, policy)
    for record in records:
        return record[-1]
    raise InputError(f"{path}: no records", "check the file")


def read_log(path: Path, policy: ErrorPolicy, fmt: str = "auto", **options: Any) -> Iterator[LogUser]:
    """The users of a conversation log (unbounded; `bound_user` bounds them)."""
    fmt = detect_log_format(path) if fmt == "auto" else fmt
    if fmt == "task1":
        return read_task1_dialogues(path, policy)
    if not path.is_file():
        raise InputError(f"{path}: no such file", "check --input")
    if fmt == "table":
        if path.suffix not in TABLE_SUFFIXES:
            raise InputError(f"{path}: a table is a .csv, .tsv or .parquet file")
        return read_table(path, policy, options.get("columns") or {}, options.get("time_format"))
    if fmt == "wildchat" and path.suffix == ".parquet":
        return read_wildchat_parquet(path, policy, options)
    if fmt not in _PARSERS:
        raise InputError(f"unknown --format {fmt!r}", f"use auto, task1 or one of {', '.join(LOG_FORMATS)}")
    return read_jsonl_log(path, fmt, policy, options)


def is_conversation_log(source: str) -> bool:
    """Whether `run` should start with extract-memories: `source` is a log without memories
    (a table, WildChat parquet, or JSON whose first record is a conversation), not AlpsBench
    (a task1 folder, a raw export with memory_items, an hf: dataset)."""
    path = Path(source)
    if source.startswith("hf:") or not path.is_file():
        return False
    if path.suffix in TABLE_SUFFIXES:
        return True
    if path.suffix not in (".json", ".jsonl"):
        return False
    try:
        first = _first_record(path)
    except (InputError, ValueError):
        return False  # the AlpsBench readers name the problem
    if not isinstance(first, dict) or "memory_items" in first:
        return False
    return any(isinstance(first.get(name), list) for name in ("conversation", "messages", "conversations"))
