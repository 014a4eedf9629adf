"""AlpsBench readers. `read_users` picks the reader for a path and yields `records.User`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy
from personaemp.sources.hf import PREFIX as HF_PREFIX
from personaemp.sources.hf import read_hf
from personaemp.sources.normalize import SourceUser
from personaemp.sources.raw import raw_files, read_raw
from personaemp.sources.task1 import INPUT_FILE, REFERENCE_FILE, is_task1_folder, read_task1
from personaemp.vocabulary import FORMATS  # the readers' names, declared once


def detect_format(source: str) -> str:
    """Guess the input format from the path and, for a file, its first record."""
    if source.startswith(HF_PREFIX):
        return "hf"
    path = Path(source)
    if not path.exists():
        raise InputError(f"{path}: no such file or folder", "check --input")
    if path.is_dir():
        if any((path / name).is_file() for name in (INPUT_FILE, REFERENCE_FILE)):
            return "task1"  # even with one file missing: the task1 reader names it
        if (path / "task1").is_dir() or (path / "benchmark_data").is_dir():
            return "task1"
        if any(p.is_dir() and is_task1_folder(p / "task1") for p in path.iterdir()):
            return "task1"
        raw_files(path)  # raises a clear error if the folder holds nothing readable
        return "raw"
    if path.name == INPUT_FILE:
        return "task1"
    if path.suffix not in (".json", ".jsonl"):
        raise InputError(f"{path}: cannot tell the format", "pass --format task1|raw|hf")
    return "raw"


def check_source(source: str, fmt: str = "auto") -> None:
    """A path that does not exist, said before anything is opened (an HF dataset id is not a path)."""
    if fmt != "hf" and not source.startswith(HF_PREFIX) and not Path(source).exists():
        raise InputError(f"{source}: no such file or folder", "check --input")


def read_users(
    source: str,
    policy: ErrorPolicy,
    fmt: str = "auto",
    split: str | None = None,
    hf_config: str | None = None,
) -> Iterator[SourceUser]:
    if fmt not in FORMATS:
        raise InputError(f"unknown --format {fmt!r}", f"use one of {', '.join(FORMATS)}")
    if fmt == "auto":
        fmt = detect_format(source)
    if fmt == "hf":
        spec = source if source.startswith(HF_PREFIX) else HF_PREFIX + source
        return _unique(read_hf(spec, policy, hf_config, split), policy)
    path = Path(source)
    if not path.exists():
        raise InputError(f"{path}: no such file or folder", "check --input")
    if fmt == "task1":
        folder = path.parent if path.is_file() else path
        return _unique(read_task1(folder, policy, split), policy)
    if split is not None:
        raise InputError(
            f"--benchmark-split {split}: a raw export has no splits", "leave out --benchmark-split"
        )
    return _unique(read_raw(path, policy), policy)


def _unique(users: Iterator[SourceUser], policy: ErrorPolicy) -> Iterator[SourceUser]:
    """Every format: a user id may appear once (long-term data is one row per user)."""
    seen: dict[str, str] = {}
    for user in users:
        first = seen.get(user.user_id)
        if first is not None:
            policy.handle(RowError(user.location, f"duplicate user id {user.user_id!r} (first at {first})"))
            continue
        seen[user.user_id] = user.location
        yield user
