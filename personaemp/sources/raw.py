"""AlpsBench raw export: records with `sessions`, `memory_items` and `intents_ranked` at top level.

Accepts a JSON file (`{"data": [...]}` or a list), a JSONL file, or a folder of them
(e.g. `split_part*.json`), read in name order and streamed record by record.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy, iter_json_array, iter_jsonl
from personaemp.language import normalize_language
from personaemp.records import Source
from personaemp.sources.normalize import (
    SourceUser,
    intents_from_ranked,
    lazy_turns,
    memories_from_items,
)

SUFFIXES = (".json", ".jsonl")


def _natural(path: Path) -> list:
    """split_part2.json before split_part10.json."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", path.name)]


def raw_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted((p for p in path.iterdir() if p.is_file() and p.suffix in SUFFIXES), key=_natural)
    if not files:
        raise InputError(f"{path}: no .json or .jsonl files in this folder")
    return files


def iter_records(path: Path, policy: ErrorPolicy) -> Iterator[tuple[str, Any]]:
    """(location, record) for every record of one JSON or JSONL file."""
    if path.suffix == ".jsonl":
        for lineno, _, row in iter_jsonl(path, policy):
            yield f"{path}:{lineno}", row
    else:
        yield from iter_json_array(path, policy)


def read_raw(path: Path, policy: ErrorPolicy) -> Iterator[SourceUser]:
    for file in raw_files(path):
        for number, (location, record) in enumerate(iter_records(file, policy)):
            try:
                yield user_from_raw(record, location, str(file), number)
            except RowError as error:
                policy.handle(error)


def user_from_raw(record: Any, location: str, origin: str, number: int) -> SourceUser:
    if not isinstance(record, dict):
        raise RowError(location, f"expected a JSON object, got {type(record).__name__}")
    if "memory_items" not in record:
        raise RowError(location, "missing required field 'memory_items'")
    load_turns = lazy_turns(record.get("sessions"), record.get("dialogue"), location)
    benchmark_id = record.get("benchmark_id")
    user_id = record.get("user_id") or benchmark_id or f"{Path(origin).stem}#{number}"
    line_index = record.get("line_index")
    return SourceUser(
        user_id=user_id,
        location=location,
        source=Source(
            format="raw",
            path=origin,
            benchmark_id=benchmark_id if isinstance(benchmark_id, str) else None,
            line_index=line_index if isinstance(line_index, int) else number,
        ),
        load_turns=load_turns,
        memories=memories_from_items(record["memory_items"], location),
        intents=intents_from_ranked(record.get("intents_ranked"), location),
        language=normalize_language(record.get("language")),
    )
