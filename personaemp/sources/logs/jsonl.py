"""Conversation logs as JSON lines (WildChat, OpenAI messages, ShareGPT): indexed first
(user -> line offsets), then read back user by user, so memory holds the index."""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from personaemp.errors import RowError
from personaemp.io import ErrorPolicy, iter_json_array, iter_jsonl, read_jsonl_at
from personaemp.sources.logs.conversations import (
    CONVERSATION_FIELDS,
    USER_FIELDS,
    LogSession,
    LogUser,
    _field,
    _instant_at,
    _session,
    iso_instant,
)

# --- JSON lines: one conversation per line, grouped by user -------------------------------------


@dataclass
class _Conversation:
    """What a reader takes from one line: its user, its session and its turns."""

    user: Any  # as the data has it (a number, a string); None: no user id
    session_id: str
    timestamp: Any  # as the data has it (`read_instant` reads it)
    turns: list[tuple[Any, Any]]


_ID_KINDS = {bool: "a boolean", dict: "an object", list: "a list"}


def _identifier(value: Any, what: str, location: str) -> Any:
    """An id as the data has it, text or a number: str() of a boolean, an object or a list
    would make one up ('True', "{'id': 1}") and merge users who never met."""
    if type(value) in _ID_KINDS:
        raise RowError(location, f"{what} must be text or a number, not {_ID_KINDS[type(value)]}")
    return value


def _wildchat(row: dict, location: str, options: dict) -> _Conversation:
    user = row.get(options.get("user_field") or "hashed_ip")
    if user in (None, ""):
        raise RowError(location, "no 'hashed_ip' (the WildChat user)")
    turns = _turns(row, location, "conversation", "role", "content", "turns")
    session = row.get("conversation_hash") or row.get("conversation_id") or location
    user = _identifier(user, "a user id", location)
    session = _identifier(session, "a conversation id", location)
    return _Conversation(user, str(session), row.get("timestamp"), turns)


def _turns(row: dict, location: str, field: str, role: str, text: str, shape: str) -> list[tuple[Any, Any]]:
    """(role, text) of each turn of the list `row[field]` (a turn that is not an object:
    (None, None)); `shape` names a turn's keys in the error."""
    items = row.get(field)
    if not isinstance(items, list):
        raise RowError(location, f"'{field}' must be a list of {shape}")
    return [(t.get(role), t.get(text)) if isinstance(t, dict) else (None, None) for t in items]


def _messages(row: dict, location: str, options: dict) -> _Conversation:
    turns = _turns(row, location, "messages", "role", "content", "{role, content}")
    return _with_ids(row, location, options, turns)


def _sharegpt(row: dict, location: str, options: dict) -> _Conversation:
    turns = _turns(row, location, "conversations", "from", "value", "{from, value}")
    return _with_ids(row, location, options, turns)


def _with_ids(row: dict, location: str, options: dict, turns) -> _Conversation:
    named = options.get("user_field")
    user = row.get(named) if named else _field(row, USER_FIELDS)
    if named and user in (None, ""):
        raise RowError(location, f"no {named!r} (the user id --user-field names)")
    session = _identifier(_field(row, CONVERSATION_FIELDS) or location, "a conversation id", location)
    timestamp = _field(row, ("timestamp", "created_at", "time"))
    user = None if user in (None, "") else _identifier(user, "a user id", location)
    return _Conversation(user, str(session), timestamp, turns)


_PARSERS = {"wildchat": _wildchat, "messages": _messages, "sharegpt": _sharegpt}


def _lines(path: Path, policy: ErrorPolicy, spool: Path) -> Iterator[tuple[str, int, Path, Any]]:
    """(location, offset, file, row) of every conversation; a JSON array is spooled to lines
    first, so every file is read back by offset."""
    if path.suffix != ".json":
        for lineno, offset, row in iter_jsonl(path, policy):
            yield f"{path}:{lineno}", offset, path, row
        return
    offset = 0
    with spool.open("wb") as out:
        for number, (_, row) in enumerate(iter_json_array(path, policy), 1):
            line = msgspec.json.encode(row) + b"\n"
            out.write(line)
            yield f"{path}:{number}", offset, spool, row
            offset += len(line)


def read_jsonl_log(path: Path, fmt: str, policy: ErrorPolicy, options: dict) -> Iterator[LogUser]:
    """Users of a JSON-lines (or JSON array) log, in order of first appearance."""
    parse = _PARSERS[fmt]
    time_format = options.get("time_format")
    # user -> [(when, offset, location)]; when: (0, 0) without a time (first), else (1, instant)
    index: dict[str, list[tuple[tuple[int, int], int, str]]] = {}
    kinds: dict[str, str] = {}  # user -> the JSON type its id first came as
    merged: set[str] = set()  # users whose id came as a number and as a string (1 and "1")
    given = True
    with tempfile.TemporaryDirectory(prefix="personaemp-log-") as folder:
        spool = Path(folder) / "spool.jsonl"
        source = path
        for location, offset, file, row in _lines(path, policy, spool):
            source = file
            try:
                if not isinstance(row, dict):
                    raise RowError(location, f"expected a JSON object, got {type(row).__name__}")
                conversation = parse(row, location, options)
                when = _instant_at(conversation.timestamp, time_format, location)
            except RowError as error:
                policy.handle(error)
                continue
            if conversation.user is None:
                given, user = False, f"{Path(path).stem}:{location.rsplit(':', 1)[-1]}"
            else:
                user, kind = str(conversation.user), type(conversation.user).__name__
                if kinds.setdefault(user, kind) != kind:
                    merged.add(user)
            key = (0, 0) if when is None else (1, when)
            index.setdefault(user, []).append((key, offset, location))
        with source.open("rb") as handle:
            for user, entries in index.items():
                per_user: dict[str, int] = {"user_ids_merged": 1} if user in merged else {}
                read = []
                for (timed, when), offset, location in sorted(entries, key=lambda entry: entry[0]):
                    conversation = parse(read_jsonl_at(handle, offset), location, options)
                    stamp = iso_instant(when) if timed else None
                    read.append((conversation.session_id, conversation.turns, stamp, location))
                sessions = _distinct(read, per_user, policy)
                if sessions:
                    yield LogUser(user, entries[0][2], fmt, str(path), sessions, given, per_user)


def _distinct(conversations: list[tuple], counts: dict[str, int], policy: ErrorPolicy) -> list[LogSession]:
    """One user's sessions from (session id, turns, timestamp, location) in time order: a
    conversation whose id and turns came before is left out; one whose id came before with
    other turns gets the id `<id>#2` (#3, ...); each counted."""
    seen: dict[str, set[bytes]] = {}  # session id -> digests of its turns
    taken = {conversation[0] for conversation in conversations}
    sessions = []
    for session_id, turns, stamp, location in conversations:
        digest = hashlib.sha256(msgspec.json.encode(turns)).digest()
        if session_id in seen:
            if digest in seen[session_id]:
                counts["duplicate_conversations"] = counts.get("duplicate_conversations", 0) + 1
                continue
            seen[session_id].add(digest)
            counts["session_ids_repeated"] = counts.get("session_ids_repeated", 0) + 1
            number = 2
            while f"{session_id}#{number}" in taken:
                number += 1
            session_id = f"{session_id}#{number}"
            taken.add(session_id)
        else:
            seen[session_id] = {digest}
        try:
            session = _session(session_id, stamp, turns, location, counts)
        except RowError as error:
            policy.handle(error)
            continue
        if session is not None:
            sessions.append(session)
            if stamp is None:
                counts["sessions_without_time"] = counts.get("sessions_without_time", 0) + 1
    return sessions
