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

import hashlib
import math
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy, iter_json_array, iter_jsonl, read_jsonl_at
from personaemp.vocabulary import LOG_READERS as LOG_FORMATS  # the readers here, declared once

TABLE_SUFFIXES = (".csv", ".tsv", ".parquet")
USER_FIELDS = ("user_id", "user")  # the messages format's user id, unless --user-field names one
CONVERSATION_FIELDS = ("conversation_id", "id")
ROLES = {
    "user": "user", "human": "user", "prompter": "user",
    "assistant": "assistant", "gpt": "assistant", "bot": "assistant", "chatgpt": "assistant",
    "model": "assistant", "bard": "assistant",
}  # fmt: skip  # other roles (system, tool, function) are not the person's words: left out


@dataclass
class LogTurn:
    index: int  # position in its conversation, all roles counted (AlpsBench utterance_index)
    role: str  # user | assistant
    text: str


@dataclass
class LogSession:
    session_id: str
    timestamp: str | None  # ISO 8601, UTC
    turns: list[LogTurn]


@dataclass
class LogUser:
    user_id: str
    location: str  # file:line of the user's first conversation
    format: str
    path: str
    sessions: list[LogSession]
    id_given: bool = True  # False: no user id in the data, one conversation = one user
    counts: dict[str, int] = field(default_factory=dict)  # what reading and bounding dropped

    def as_row(self) -> dict[str, Any]:
        """The user as a line of conversations.jsonl (the unit extract-memories works on)."""
        line = self.location.rsplit(":", 1)[-1]
        return {
            "user_id": self.user_id,
            "source": {
                "format": self.format,
                "path": self.path,
                "benchmark_id": self.user_id if self.format == "task1" else None,
                "line_index": int(line) if line.isdigit() else None,
            },
            "user_id_given": self.id_given,
            "sessions": [
                {
                    "session_id": s.session_id,
                    "timestamp": s.timestamp,
                    "turns": [{"utterance_index": t.index, "role": t.role, "text": t.text} for t in s.turns],
                }
                for s in self.sessions
            ],
            "bounds": self.counts,
        }


# --- bounds ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """How much of a history reaches the prompt. AlpsBench kept sequences of 6 to 249 turns."""

    max_sessions: int = 50  # the latest sessions
    max_turns: int = 249  # the latest turns over those sessions, all roles
    max_turn_chars: int = 2000  # a longer turn keeps its head and tail
    code_block_chars: int = 300  # a fenced code block keeps this much
    max_user_chars: int = 24000  # the user's own words in all (about 6,000 tokens): the latest kept

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


_FENCE = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def trim_text(text: str, bounds: Bounds) -> tuple[str, int]:
    """The text with long code blocks and then its middle cut; (text, characters removed)."""
    size = len(text)

    def cut_code(match: re.Match) -> str:
        body = match.group(1)
        if len(body) <= bounds.code_block_chars:
            return match.group(0)
        head = match.group(0)[: match.start(1) - match.start(0)]
        return f"{head}{body[: bounds.code_block_chars]}\n[… {len(body) - bounds.code_block_chars} characters of code trimmed …]\n```"  # noqa: E501

    text = _FENCE.sub(cut_code, text)
    limit = bounds.max_turn_chars
    if len(text) > limit:
        head, tail = text[: limit * 2 // 3], text[-(limit // 3) :]
        text = f"{head}\n[… {len(text) - len(head) - len(tail)} characters trimmed …]\n{tail}"
    return text, max(0, size - len(text))


def bound_user(user: LogUser, bounds: Bounds) -> LogUser:
    """The latest sessions and turns within `bounds`, long texts trimmed; counts updated."""
    counts = user.counts
    sessions = user.sessions
    if len(sessions) > bounds.max_sessions:
        counts["sessions_dropped"] = counts.get("sessions_dropped", 0) + len(sessions) - bounds.max_sessions
        sessions = sessions[-bounds.max_sessions :]
    budget, kept = bounds.max_turns, []
    for session in reversed(sessions):
        turns = session.turns[-budget:] if budget > 0 else []
        dropped = len(session.turns) - len(turns)
        counts["turns_dropped"] = counts.get("turns_dropped", 0) + dropped
        budget -= len(turns)
        if turns:
            kept.append(LogSession(session.session_id, session.timestamp, turns))
        else:
            counts["sessions_dropped"] = counts.get("sessions_dropped", 0) + 1
    for session in kept:
        for turn in session.turns:
            turn.text, removed = trim_text(turn.text, bounds)
            if removed:
                counts["turns_trimmed"] = counts.get("turns_trimmed", 0) + 1
                counts["chars_trimmed"] = counts.get("chars_trimmed", 0) + removed
    budget, cut, some = bounds.max_user_chars, False, False  # some: a user turn is kept
    for session in kept:  # newest first
        if cut:
            counts["turns_dropped"] = counts.get("turns_dropped", 0) + len(session.turns)
            session.turns = []
            continue
        for position in range(len(session.turns) - 1, -1, -1):
            turn = session.turns[position]
            if turn.role == "user":
                budget -= len(turn.text)
                if budget < 0 and some:
                    cut = True
                    counts["turns_dropped"] = counts.get("turns_dropped", 0) + position + 1
                    session.turns = session.turns[position + 1 :]
                    break
                some = True
    kept = [session for session in kept if session.turns]
    user.sessions = list(reversed(kept))
    return user


# --- shared pieces -----------------------------------------------------------------------------


def _text(value: Any, location: str) -> str | None:
    """A turn's text: a string, or OpenAI content parts (their text parts joined)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [p.get("text") for p in value if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "\n".join(parts)
    raise RowError(location, f"a turn's text must be a string, got {type(value).__name__}")


def _session(session_id: str, timestamp: str | None, turns: list[tuple[Any, Any]], location: str, counts):
    """A session from (role, text) pairs in order; None when no user or assistant turn has text."""
    kept = []
    for index, (role, text) in enumerate(turns):
        if not isinstance(role, str):
            raise RowError(location, f"turn {index}: a turn needs a string role")
        role = ROLES.get(role.strip().lower())
        text = _text(text, location)
        if role is None or not text or not text.strip():
            counts["turns_left_out"] = counts.get("turns_left_out", 0) + 1
            continue
        kept.append(LogTurn(index, role, text))
    if not any(turn.role == "user" for turn in kept):
        counts["empty_conversations"] = counts.get("empty_conversations", 0) + 1
        return None
    return LogSession(session_id, timestamp, kept)


# --- time ------------------------------------------------------------------------------------------

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# An epoch number this large is milliseconds: as seconds it would be the year 5138, as
# milliseconds it is March 1973 (no chat log is older).
MILLISECONDS_FROM = 100_000_000_000
_NUMBER = re.compile(r"[+-]?\d+(\.\d*)?")
_TIME_HINT = "name its format with --time-format (e.g. %m/%d/%Y)"


def read_instant(value: Any, time_format: str | None = None) -> int | None:
    """Microseconds since 1970 UTC of a timestamp; None when there is none (null, blank).

    A number is seconds since 1970, or milliseconds from MILLISECONDS_FROM up; text is read
    with `time_format` (strptime) when given, else as ISO 8601 or as such a number; a time
    without a zone is UTC. ValueError, saying why, for anything else."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise ValueError(f"time {value!r} is not a time")
    if isinstance(value, int | float):
        return _epoch(value)
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if isinstance(value, str):
        text = value.strip()
        if time_format:
            try:
                value = datetime.strptime(text, time_format)
            except ValueError:
                raise ValueError(f"time {text!r} does not match --time-format {time_format!r}") from None
        else:
            try:
                value = datetime.fromisoformat(text)
            except ValueError:
                if not _NUMBER.fullmatch(text):
                    raise ValueError(
                        f"time {text!r} is neither ISO 8601 nor seconds since 1970: {_TIME_HINT}"
                    ) from None
                return _epoch(float(text) if "." in text else int(text))
    if not isinstance(value, datetime):
        raise ValueError(f"time {value!r} is not a time (a {type(value).__name__})")
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - EPOCH) // timedelta(microseconds=1)


def _epoch(number: int | float) -> int:
    if not math.isfinite(number):
        raise ValueError(f"time {number!r} is not a time")
    scale = 1_000 if abs(number) >= MILLISECONDS_FROM else 1_000_000
    micros = number * scale if isinstance(number, int) else round(number * scale)
    try:
        EPOCH + timedelta(microseconds=micros)
    except OverflowError:
        raise ValueError(f"time {number!r} is out of range for seconds or milliseconds since 1970") from None
    return micros


def iso_instant(micros: int | None) -> str | None:
    """What `read_instant` gives, as ISO 8601 in UTC (what conversations.jsonl holds)."""
    return None if micros is None else (EPOCH + timedelta(microseconds=micros)).isoformat()


def _instant_at(value: Any, time_format: str | None, location: str) -> int | None:
    try:
        return read_instant(value, time_format)
    except ValueError as exc:
        raise RowError(location, str(exc)) from None


def _field(row: dict, names: tuple[str, ...]) -> Any:
    for name in names:
        value = row.get(name)
        if value not in (None, ""):
            return value
    return None


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


# --- tables and WildChat parquet: polars ---------------------------------------------------------

TABLE_COLUMNS = ("user", "session", "order", "role", "text")
# The column names a table is read with unless mapped (options.ExtractOptions repeats them).
DEFAULT_COLUMNS = {
    "user": "user_id",
    "session": "session_id",
    "order": "turn",
    "role": "role",
    "text": "text",
}
BATCH_ROWS = 4096


def _polars_error(path: Path, exc: Exception) -> InputError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "utf-8" in text.lower() or "utf8" in text.lower():
        line = _first_bad_line(path)
        where = f"{path}:{line}" if line else str(path)
        return InputError(f"{where}: not valid UTF-8", "re-encode the file as UTF-8 (iconv -t UTF-8)")
    return InputError(f"{path}: cannot read the table ({text})", "check the file and the column options")


def _first_bad_line(path: Path) -> int | None:
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return lineno
    return None


def _scan(path: Path):
    import polars as pl

    if path.suffix == ".parquet":
        return pl.scan_parquet(path)
    separator = "\t" if path.suffix == ".tsv" else ","
    return pl.scan_csv(path, infer_schema=False, separator=separator, encoding="utf8")


def _refuse_ragged_rows(path: Path) -> None:
    """A CSV row with more fields than the header (an unquoted comma in a message): polars
    reads only the columns asked for, and would cut that text at the comma without a word."""
    import csv

    import polars as pl

    if path.suffix == ".parquet":
        return
    try:  # every column read, in one streamed pass: polars stops at a ragged row
        _scan(path).select(pl.all().null_count()).collect(engine="streaming")
    except pl.exceptions.ComputeError as error:
        if "more fields" not in str(error):
            return  # (bad UTF-8...: the read that follows names it)
        separator = "\t" if path.suffix == ".tsv" else ","
        with path.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(handle, delimiter=separator)
            width = len(next(reader))
            line = next((reader.line_num for row in reader if len(row) > width), None)
        where = f"{path}:{line}" if line else str(path)
        raise InputError(
            f"{where}: more fields than the header's {width} (a separator inside a text?)",
            'quote the fields that hold one ("I feel bad, really")',
        ) from None


def table_columns(path: Path) -> list[str]:
    import polars as pl

    try:
        return list(_scan(path).collect_schema().names())
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise _polars_error(path, exc) from None


def _instants(column, time_format: str | None):
    """The polars expression of `read_instant` over a column (null where it cannot be read: the
    reader names those rows)."""
    import polars as pl

    def read(values):
        found: dict[Any, int | None] = {}  # the rows of a session mostly share their time
        for value in values.to_list():
            if value not in found:
                try:
                    found[value] = read_instant(value, time_format)
                except ValueError:
                    found[value] = None
        return pl.Series([found[value] for value in values.to_list()], dtype=pl.Int64)

    return column.map_batches(read, return_dtype=pl.Int64, is_elementwise=True)


def _time_problem(row: dict, time_format: str | None) -> str | None:
    """Why a row's time cannot be read; None when it has none or it was read."""
    if row["instant"] is not None or row["time"] is None or not row["time"].strip():
        return None
    try:
        read_instant(row["time"], time_format)
    except ValueError as exc:
        return str(exc)
    return f"time {row['time']!r} cannot be read: {_TIME_HINT}"


def read_table(
    path: Path, policy: ErrorPolicy, columns: dict[str, str | None], time_format: str | None = None
) -> Iterator[LogUser]:
    """A table of turns: `columns` maps user, session, order, role, text (and time, optional)
    to the file's column names. One row per turn; users in order of first row, sessions in
    time order (`read_instant` of their earliest row; those without a time first, in file order).
    A row that repeats an earlier one of its session (order, role and text) is left out."""
    import polars as pl

    present = table_columns(path)
    columns = {**DEFAULT_COLUMNS, **columns}
    wanted = {name: columns.get(name) for name in (*TABLE_COLUMNS, "time")}
    for name, column in wanted.items():
        if column is not None and column not in present:
            flag = f"--{name}-column"
            raise InputError(f"{path}: no column {column!r} ({flag})", f"the file has {', '.join(present)}")
    for name in ("user", "order", "role", "text"):
        if wanted[name] is None:
            raise InputError(f"{path}: a table needs a {name} column", f"name it with --{name}-column")
    _refuse_ragged_rows(path)
    line_offset = 2 if path.suffix != ".parquet" else 1  # CSV: the header is line 1
    lf = _scan(path).with_row_index("_row")
    session = pl.col(wanted["session"]).cast(pl.String) if wanted["session"] else pl.lit("s1")
    time = pl.col(wanted["time"]) if wanted["time"] else pl.lit(None, pl.String)
    lf = lf.select(
        pl.col(wanted["user"]).cast(pl.String).alias("user"),
        session.alias("session"),
        pl.col(wanted["order"]).cast(pl.Float64, strict=False).alias("order"),
        pl.col(wanted["order"]).cast(pl.String).alias("order_text"),
        pl.col(wanted["role"]).cast(pl.String).alias("role"),
        pl.col(wanted["text"]).cast(pl.String).alias("text"),
        time.cast(pl.String).alias("time"),
        _instants(time, time_format).alias("instant"),
        pl.col("_row"),
    )
    lf = lf.with_columns(
        pl.col("_row").min().over("user").alias("_u"),
        pl.col("instant").min().over("user", "session").alias("_t"),  # sessions in time order
        pl.col("_row").min().over("user", "session").alias("_s"),  # ... or in file order
    ).sort(["_u", "_t", "_s", "order", "_row"], nulls_last=[False, False, False, True, False])

    def turns(batch) -> Iterator[tuple]:
        for row in batch:
            location = f"{path}:{row['_row'] + line_offset}"
            if row["user"] in (None, ""):
                policy.handle(RowError(location, f"no user id in column {wanted['user']!r}"))
                continue
            if row["order"] is None:
                policy.handle(
                    RowError(
                        location, f"turn order {row['order_text']!r} is not a number ({wanted['order']})"
                    )
                )
                continue
            problem = _time_problem(row, time_format)
            if problem:
                policy.handle(RowError(location, problem))
                continue
            yield (
                row["user"], row["session"], iso_instant(row["_t"]), row["role"], row["text"], location,
                None, (row["order"], row["role"], row["text"]),
            )  # fmt: skip

    yield from _grouped(path, "table", lf, turns, policy)


def read_wildchat_parquet(path: Path, policy: ErrorPolicy, options: dict) -> Iterator[LogUser]:
    """WildChat's parquet files: one conversation per row, users by `hashed_ip`, in time order."""
    import polars as pl

    present = table_columns(path)
    user = options.get("user_field") or "hashed_ip"
    time_format = options.get("time_format")
    missing = [c for c in (user, "conversation", "conversation_hash") if c not in present]
    if missing:
        raise InputError(f"{path}: no column {missing[0]!r}", "pass --format table for a table of turns")
    time = pl.col("timestamp") if "timestamp" in present else pl.lit(None, pl.String)
    lf = (
        _scan(path)
        .with_row_index("_row")
        .select(
            pl.col(user).cast(pl.String).alias("user"),
            pl.col("conversation_hash").cast(pl.String).alias("session"),
            time.cast(pl.String).alias("time"),
            _instants(time, time_format).alias("instant"),
            pl.col("conversation")
            .list.eval(pl.struct(pl.element().struct.field("role"), pl.element().struct.field("content")))
            .alias("conversation"),
            pl.col("_row"),
        )
        .with_columns(pl.col("_row").min().over("user").alias("_u"))
        .sort(["_u", "instant", "_row"], nulls_last=[False, False, False])
    )

    def turns(batch) -> Iterator[tuple]:
        for row in batch:
            location = f"{path}:{row['_row'] + 1}"
            if row["user"] in (None, ""):
                policy.handle(RowError(location, f"no {user!r} (the WildChat user)"))
                continue
            problem = _time_problem(row, time_format)
            if problem:
                policy.handle(RowError(location, problem))
                continue
            head = (row["user"], row["session"], iso_instant(row["instant"]))
            for turn in row["conversation"] or [{"role": None, "content": None}]:
                yield *head, turn["role"], turn["content"], location, row["_row"], None

    yield from _grouped(path, "wildchat", lf, turns, policy)


def _grouped(path: Path, fmt: str, lf, turns, policy: ErrorPolicy) -> Iterator[LogUser]:
    """Sink the sorted frame to a temporary parquet file, stream it back in batches and
    group consecutive rows into users and sessions."""
    import polars as pl

    with tempfile.TemporaryDirectory(prefix="personaemp-log-") as folder:
        sorted_path = Path(folder) / "sorted.parquet"
        try:
            lf.sink_parquet(sorted_path)
        except (pl.exceptions.PolarsError, OSError) as exc:
            raise _polars_error(path, exc) from None
        current: str | None = None
        user_rows: list[tuple] = []
        for batch in pl.scan_parquet(sorted_path).collect_batches(chunk_size=BATCH_ROWS):
            for item in turns(batch.iter_rows(named=True)):
                if current is not None and item[0] != current:
                    found = _table_user(fmt, path, user_rows, policy)
                    if found is not None:
                        yield found
                    user_rows = []
                current = item[0]
                user_rows.append(item)
        if user_rows:
            found = _table_user(fmt, path, user_rows, policy)
            if found is not None:
                yield found


def _table_user(fmt: str, path: Path, rows: list[tuple], policy: ErrorPolicy) -> LogUser | None:
    """One user from its rows (user, session, timestamp, role, text, location, conversation,
    turn key), in order: a conversation is a session's rows (a table), or one source row
    (WildChat: `conversation` is its row number); a turn key seen before in its session is a
    repeated row, left out."""
    counts: dict[str, int] = {}
    conversations: dict[tuple, tuple[str, str | None, str, list]] = {}
    seen: set[tuple] = set()
    for _, session, stamp, role, text, location, part, turn_key in rows:
        if turn_key is not None:
            if (session, turn_key) in seen:
                counts["duplicate_rows"] = counts.get("duplicate_rows", 0) + 1
                continue
            seen.add((session, turn_key))
        if (session, part) not in conversations:
            conversations[(session, part)] = (session, stamp, location, [])
        if role is not None or text is not None:
            conversations[(session, part)][3].append((role, text))
    read = [(session, pairs, stamp, location) for session, stamp, location, pairs in conversations.values()]
    built = _distinct(read, counts, policy)
    if not built:
        return None
    return LogUser(rows[0][0], rows[0][5], fmt, str(path), built, True, counts)


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
