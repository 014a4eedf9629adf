"""A conversation log's users, sessions and turns (what every reader yields), the bounds
`bound_user` puts on a history, and the time fields every reader parses."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from personaemp.errors import RowError

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
