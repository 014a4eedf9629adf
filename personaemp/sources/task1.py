"""AlpsBench public task1 layout: model_input.jsonl + reference_output.jsonl, joined on benchmark_id.

The reference file (memories only) is indexed first: benchmark_id -> byte offset. The
input file (long dialogues) is then streamed once and each row's gold memories are read
back by offset, so memory use does not grow with dialogue size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy, iter_jsonl, read_jsonl_at
from personaemp.language import normalize_language
from personaemp.records import Source
from personaemp.sources.normalize import (
    RawTurn,
    SourceUser,
    lazy_turns,
    memories_from_items,
)

INPUT_FILE = "model_input.jsonl"
REFERENCE_FILE = "reference_output.jsonl"


def is_task1_folder(path: Path) -> bool:
    return (path / INPUT_FILE).is_file() and (path / REFERENCE_FILE).is_file()


def resolve_task1_folder(path: Path, split: str | None) -> Path:
    """Accept a task1 folder, or the release root `benchmark_data/` with a split name."""
    # a split name that selects nothing must not pass unseen
    if split is not None and (is_task1_folder(path) or is_task1_folder(path / "task1")):
        raise InputError(
            f"--benchmark-split {split}: {path} is one task1 folder, not a benchmark_data/ root of splits",
            "leave out --benchmark-split, or point --input at the root that holds the splits",
        )
    if is_task1_folder(path):
        return path
    for present, missing in ((INPUT_FILE, REFERENCE_FILE), (REFERENCE_FILE, INPUT_FILE)):
        if (path / present).is_file():
            raise InputError(f"{path}: has {present} but no {missing}", "the task1 layout needs both files")
    if (path / "task1").is_dir() and is_task1_folder(path / "task1"):
        return path / "task1"
    root = path / "benchmark_data" if (path / "benchmark_data").is_dir() else path
    splits = sorted(p.name for p in root.iterdir() if is_task1_folder(p / "task1"))
    if not splits:
        raise InputError(f"{path}: no {INPUT_FILE} + {REFERENCE_FILE} found")
    if split is None:
        if len(splits) > 1:
            raise InputError(
                f"{root}: holds several splits ({', '.join(splits)})",
                f"pick one with --benchmark-split {'|'.join(splits)}",
            )
        split = splits[0]
    if split not in splits:
        raise InputError(f"{root}: no split {split!r}", f"choose from {', '.join(splits)}")
    return root / split / "task1"


def _benchmark_id(row: Any, location: str) -> str:
    if not isinstance(row, dict):
        raise RowError(location, f"expected a JSON object, got {type(row).__name__}")
    return _checked_id(row.get("benchmark_id"), location)


def _checked_id(value: Any, location: str) -> str:
    """A row's benchmark_id, a non-empty string; else a RowError naming the row."""
    if not isinstance(value, str) or not value:
        raise RowError(location, "missing required field 'benchmark_id'")
    return value


# The index packs a reference row's line number and byte offset into one int (a tuple of
# two ints costs three objects per user); the sign marks rows already joined.
_OFFSET_BITS = 40


def _pack(lineno: int, offset: int) -> int:
    return lineno << _OFFSET_BITS | offset


def _unpack(entry: int) -> tuple[int, int]:
    entry = entry if entry >= 0 else -entry - 1
    return entry >> _OFFSET_BITS, entry & ((1 << _OFFSET_BITS) - 1)


class _ReferenceId(msgspec.Struct):
    benchmark_id: Any = None


# The index needs each reference row's id alone: a typed decoder checks the whole row's
# syntax but builds nothing else (the row is decoded whole when its user is joined). Decoding
# every row whole here took an eighth of the filter's time.
_REFERENCE_ID = msgspec.json.Decoder(_ReferenceId)


def _index_reference(path: Path, policy: ErrorPolicy) -> dict[str, int]:
    index: dict[str, int] = {}
    for lineno, offset, row in iter_jsonl(path, policy, _REFERENCE_ID):
        location = f"{path}:{lineno}"
        try:
            benchmark_id = _checked_id(row.benchmark_id, location)
            if benchmark_id in index:
                first = _unpack(index[benchmark_id])[0]
                raise RowError(location, f"duplicate benchmark_id {benchmark_id!r} (first at line {first})")
        except RowError as error:
            policy.handle(error)
            continue
        index[benchmark_id] = _pack(lineno, offset)
    return index


def read_task1(path: Path, policy: ErrorPolicy, split: str | None = None) -> Iterator[SourceUser]:
    folder = resolve_task1_folder(path, split)
    input_path, reference_path = folder / INPUT_FILE, folder / REFERENCE_FILE
    index = _index_reference(reference_path, policy)
    with reference_path.open("rb") as references:
        yield from _join(input_path, reference_path, references, index, policy)
    for benchmark_id, entry in index.items():
        if entry >= 0:
            ref_line = _unpack(entry)[0]
            policy.handle(
                RowError(f"{reference_path}:{ref_line}", f"no row for {benchmark_id!r} in {INPUT_FILE}")
            )


class _InputFields(msgspec.Struct):
    user_id: Any = None
    line_index: Any = None
    sessions: msgspec.Raw = msgspec.Raw(b"null")  # msgspec allows no Raw | None
    dialogue: msgspec.Raw = msgspec.Raw(b"null")


class _InputRow(msgspec.Struct):
    """The parts of a model_input row the reader needs; the dialogues stay undecoded bytes
    (syntax-checked) until the filter keeps the user: about half the cost of decoding all."""

    benchmark_id: Any = None
    input: _InputFields | None = None
    language: Any = None


_INPUT_DECODER = msgspec.json.Decoder(_InputRow)


def _raw_list(raw: msgspec.Raw, name: str, location: str) -> msgspec.Raw | None:
    """None for a missing, null or empty field; a RowError unless it holds a JSON list."""
    view = memoryview(raw)
    if len(view) <= 16 and bytes(view).replace(b" ", b"") in (b"null", b"[]"):
        return None
    if view[:1] != b"[":
        kind = type(msgspec.json.decode(raw)).__name__
        raise RowError(location, f"{name} must be a list, got {kind}")
    return raw


class _TurnFields(msgspec.Struct):
    role: Any = None
    text: msgspec.Raw = msgspec.Raw(b"null")
    utterance_index: Any = None


class _SessionFields(msgspec.Struct):
    session_id: Any = None
    turns: list[_TurnFields] = []


_SESSIONS_DECODER = msgspec.json.Decoder(list[_SessionFields])


def _fast_session_turns(sessions: msgspec.Raw) -> list[RawTurn] | None:
    """Turns with their texts left undecoded; None when the shape needs the checked path."""
    try:
        decoded = _SESSIONS_DECODER.decode(sessions)
    except msgspec.ValidationError:
        return None  # the generic path names the problem
    turns = []
    for session in decoded:
        session_id = str(session.session_id) if session.session_id is not None else None
        for position, turn in enumerate(session.turns):
            index = turn.utterance_index
            index = position if index is None else index if type(index) is int else None
            if type(turn.role) is not str or memoryview(turn.text)[:1] != b'"':
                return None
            turns.append((turn.role, turn.text, session_id, index))
    return turns


def _lazy_raw_turns(fields: _InputFields, location: str) -> Callable[[], list[RawTurn]]:
    sessions = _raw_list(fields.sessions, "sessions", location)
    dialogue = _raw_list(fields.dialogue, "dialogue", location)
    if sessions is None and dialogue is None:
        raise RowError(location, "missing required field 'input.sessions' (or 'input.dialogue')")

    def load() -> list[RawTurn]:
        if sessions is not None:
            turns = _fast_session_turns(sessions)
            if turns is not None:
                return turns
        try:
            decoded = [None if raw is None else msgspec.json.decode(raw) for raw in (sessions, dialogue)]
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise RowError(location, f"dialogue text is not valid UTF-8 ({exc})") from None
        return lazy_turns(*decoded, location)()

    return load


def _join(input_path, reference_path, references, index, policy) -> Iterator[SourceUser]:
    orphans: set[str] = set()  # input ids with no reference row (errors: few)
    for lineno, _, row in iter_jsonl(input_path, policy, _INPUT_DECODER):
        location = f"{input_path}:{lineno}"
        try:
            benchmark_id = _checked_id(row.benchmark_id, location)
            entry = index.get(benchmark_id)
            if (entry is not None and entry < 0) or benchmark_id in orphans:
                raise RowError(location, f"duplicate benchmark_id {benchmark_id!r}")
            if entry is None:
                orphans.add(benchmark_id)
                raise RowError(location, f"no row for {benchmark_id!r} in {REFERENCE_FILE}")
            index[benchmark_id] = -entry - 1
            ref_line, offset = _unpack(entry)
            reference = read_jsonl_at(references, offset)
            if row.input is None:
                raise RowError(location, "missing required field 'input'")
            user = _make_user(
                benchmark_id,
                row.input.user_id,
                row.input.line_index,
                row.language,
                _lazy_raw_turns(row.input, location),
                reference,
                location,
                f"{reference_path}:{ref_line}",
                str(input_path),
            )
        except RowError as error:
            policy.handle(error)
            continue
        yield user


def _make_user(
    benchmark_id: str,
    user_id: Any,
    line_index: Any,
    language: Any,
    load_turns: Callable[[], list[RawTurn]],
    reference: Any,
    location: str,
    ref_location: str,
    origin: str,
) -> SourceUser:
    gold = reference.get("gold") if isinstance(reference, dict) else None
    if not isinstance(gold, dict) or "memory_items" not in gold:
        raise RowError(ref_location, "missing required field 'gold.memory_items'")
    memories = memories_from_items(gold["memory_items"], ref_location)
    source = Source(
        format="task1",
        path=origin,
        benchmark_id=benchmark_id,
        line_index=line_index if isinstance(line_index, int) else None,
    )
    return SourceUser(
        user_id=user_id or benchmark_id,
        location=location,
        source=source,
        load_turns=load_turns,
        memories=memories,
        intents=[],
        language=normalize_language(language),
    )


def user_from_joined_row(row: dict, location: str, origin: str) -> SourceUser:
    """A task1 row that already carries its `gold` (e.g. a Hub dataset that merged both files)."""
    benchmark_id = _benchmark_id(row, location)
    data = row.get("input")
    if not isinstance(data, dict):
        raise RowError(location, "missing required field 'input'")
    load_turns = lazy_turns(data.get("sessions"), data.get("dialogue"), location)
    return _make_user(
        benchmark_id,
        data.get("user_id"),
        data.get("line_index"),
        row.get("language"),
        load_turns,
        row,
        location,
        location,
        origin,
    )
