"""AlpsBench public task1 layout: model_input.jsonl + reference_output.jsonl, joined on benchmark_id.

The reference file (memories only) is indexed first: benchmark_id -> byte offset. The
input file (long dialogues) is then streamed once and each row's gold memories are read
back by offset, so memory use does not grow with dialogue size.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy, iter_jsonl, read_jsonl_at
from personaemp.language import normalize_language
from personaemp.records import Source
from personaemp.sources.normalize import (
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
                f"pick one with --split {'|'.join(splits)}",
            )
        split = splits[0]
    if split not in splits:
        raise InputError(f"{root}: no split {split!r}", f"choose from {', '.join(splits)}")
    return root / split / "task1"


def _benchmark_id(row: Any, location: str) -> str:
    if not isinstance(row, dict):
        raise RowError(location, f"expected a JSON object, got {type(row).__name__}")
    value = row.get("benchmark_id")
    if not isinstance(value, str) or not value:
        raise RowError(location, "missing required field 'benchmark_id'")
    return value


def _index_reference(path: Path, policy: ErrorPolicy) -> dict[str, tuple[int, int]]:
    index: dict[str, tuple[int, int]] = {}
    for lineno, offset, row in iter_jsonl(path, policy):
        location = f"{path}:{lineno}"
        try:
            benchmark_id = _benchmark_id(row, location)
            if benchmark_id in index:
                first = index[benchmark_id][0]
                raise RowError(location, f"duplicate benchmark_id {benchmark_id!r} (first at line {first})")
        except RowError as error:
            policy.handle(error)
            continue
        index[benchmark_id] = (lineno, offset)
    return index


def read_task1(path: Path, policy: ErrorPolicy, split: str | None = None) -> Iterator[SourceUser]:
    folder = resolve_task1_folder(path, split)
    input_path, reference_path = folder / INPUT_FILE, folder / REFERENCE_FILE
    index = _index_reference(reference_path, policy)
    seen: set[str] = set()
    with reference_path.open("rb") as references:
        yield from _join(input_path, reference_path, references, index, seen, policy)
    for benchmark_id, (ref_line, _) in index.items():
        if benchmark_id not in seen:
            policy.handle(
                RowError(f"{reference_path}:{ref_line}", f"no row for {benchmark_id!r} in {INPUT_FILE}")
            )


def _join(input_path, reference_path, references, index, seen, policy) -> Iterator[SourceUser]:
    for lineno, _, row in iter_jsonl(input_path, policy):
        location = f"{input_path}:{lineno}"
        try:
            benchmark_id = _benchmark_id(row, location)
            if benchmark_id in seen:
                raise RowError(location, f"duplicate benchmark_id {benchmark_id!r}")
            seen.add(benchmark_id)
            if benchmark_id not in index:
                raise RowError(location, f"no row for {benchmark_id!r} in {REFERENCE_FILE}")
            ref_line, offset = index[benchmark_id]
            reference = read_jsonl_at(references, offset)
            ref_location = f"{reference_path}:{ref_line}"
            user = _user_from_rows(row, reference, location, ref_location, str(input_path))
        except RowError as error:
            policy.handle(error)
            continue
        yield user


def _user_from_rows(row: dict, reference: Any, location: str, ref_location: str, origin: str) -> SourceUser:
    data = row.get("input")
    if not isinstance(data, dict):
        raise RowError(location, "missing required field 'input'")
    load_turns = lazy_turns(data.get("sessions"), data.get("dialogue"), location)
    gold = reference.get("gold") if isinstance(reference, dict) else None
    if not isinstance(gold, dict) or "memory_items" not in gold:
        raise RowError(ref_location, "missing required field 'gold.memory_items'")
    memories = memories_from_items(gold["memory_items"], ref_location)
    line_index = data.get("line_index")
    source = Source(
        format="task1",
        path=origin,
        benchmark_id=row.get("benchmark_id"),
        line_index=line_index if isinstance(line_index, int) else None,
    )
    return SourceUser(
        user_id=data.get("user_id") or row["benchmark_id"],
        location=location,
        source=source,
        load_turns=load_turns,
        memories=memories,
        intents=[],
        language=normalize_language(row.get("language")),
    )


def user_from_joined_row(row: dict, location: str, origin: str) -> SourceUser:
    """A task1 row that already carries its `gold` (e.g. a Hub dataset that merged both files)."""
    return _user_from_rows(row, row, location, location, origin)
