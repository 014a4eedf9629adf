"""Shards of an LLM stage (`--shard I/N`): which users a shard takes, where its files go.
Every LLM stage runs on a shard the same way; `personaemp merge` joins them."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from personaemp.errors import InputError
from personaemp.io import pick_units

SHARD = re.compile(r"^(\d+)/(\d+)$")


def parse_shard(text: str) -> tuple[int, int]:
    """'2/3' -> (2, 3); an InputError unless 1 <= I <= N."""
    match = SHARD.match(text.strip())
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise InputError(f"--shard {text!r}: expected I/N with 1 <= I <= N, e.g. 2/3")
    return int(match[1]), int(match[2])


def shard_of(user_id: str, count: int) -> int:
    """The part (1..count) a user belongs to: a hash, so every machine agrees."""
    return int(hashlib.sha256(user_id.encode()).hexdigest()[:12], 16) % count + 1


def shard_name(stage: str, shard: tuple[int, int]) -> str:
    """The part's name in reports and manifests ('infer-persona shard 2/3')."""
    return f"{stage} shard {shard[0]}/{shard[1]}"


def shard_path(path: Path, shard: tuple[int, int]) -> Path:
    """personas.jsonl -> personas.shard-2-of-3.jsonl"""
    return path.with_name(f"{path.stem}.shard-{shard[0]}-of-{shard[1]}{path.suffix}")


def failures_path(output: Path, stage: str) -> Path:
    """The failures file beside an output (a shard's has the shard in its name)."""
    match = re.search(r"\.(shard-\d+-of-\d+)$", output.stem)
    return output.with_name(f"{stage}.{match[1]}.failures.jsonl" if match else f"{stage}.failures.jsonl")


def sharded(stage: str, output: Path, rows, shard: str | None):
    """(name, output, rows) of a stage's run on one shard; unchanged without one."""
    if shard is None:
        return stage, output, rows
    part = parse_shard(shard)
    return (
        shard_name(stage, part),
        shard_path(output, part),
        rows.part(lambda uid: shard_of(uid, part[1]) == part[0]),
    )


def sharded_pick(stage: str, output: Path, rows, shard: str | None, path: Path, *, limit=None, users=None,
                 label: str = "user"):  # fmt: skip
    """(name, output, rows, selected) of a stage's run on one shard. A quick look picks its
    units from the whole input first (`--users`, then the first `--limit`: N units in all, as
    one run picks them), and each shard then works on the picked units the hash gives it."""
    selected = pick_units(rows.ids, path, limit=limit, users=users, label=label)
    name, output, part = sharded(stage, output, rows, shard)
    if selected is not None and shard is not None:
        selected &= set(part.ids)
    return name, output, part, selected
