"""Run a stage's units concurrently, resumably: nothing finished is ever computed twice.

Each finished unit is appended to the stage's output file at once (a killed run loses at
most the units in flight); each unit that fails for good is appended to the failures
file with its reason. A re-run skips both (or, with `retry_failed`, retries only the
failures). At the end the output is rewritten atomically in input order, so a finished
stage's file does not depend on completion order.

A unit counts as finished only if it was computed from the same input row and the same
stage fingerprint (model, prompts, ...): its `input_hash` must match.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonlines
import msgspec

from personaemp.errors import PersonaempError, UnitError
from personaemp.io import atomic_output

Work = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass
class StageOutcome:
    units: int = 0
    done: int = 0  # finished in this run
    done_before: int = 0  # finished in an earlier run, skipped
    failed: int = 0  # failed for good in this run
    failed_before: int = 0  # failed in an earlier run, not retried (see retry_failed)
    failures_by_kind: Counter = field(default_factory=Counter)

    @property
    def balanced(self) -> bool:
        return self.units == self.done + self.done_before + self.failed + self.failed_before


def unit_hash(row: dict[str, Any], fingerprint: str) -> str:
    encoded = msgspec.json.encode({"row": row, "fingerprint": fingerprint}, order="sorted")
    return hashlib.sha256(encoded).hexdigest()[:16]


def redact(text: str | None, secrets: Sequence[str]) -> str | None:
    if text is None:
        return None
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return text


def _repair_tail(path: Path) -> None:
    """Cut a line torn by a kill in the middle of a write, so appends start on a new line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        size = handle.seek(0, os.SEEK_END)
        position = max(0, size - (1 << 16))
        while True:
            handle.seek(position)
            chunk = handle.read(size - position)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                handle.truncate(position + cut + 1)
                return
            if position == 0:
                handle.truncate(0)
                return
            position = max(0, position - (1 << 16))


def _scan(path: Path, key: str) -> dict[str, tuple[int, str]]:
    """unit id -> (byte offset, input_hash) of the last row for it in a checkpoint file."""
    found: dict[str, tuple[int, str]] = {}
    if not path.exists():
        return found
    decoder = msgspec.json.Decoder()
    offset = 0
    with path.open("rb") as handle:
        for lineno, line in enumerate(handle, 1):
            try:
                row = decoder.decode(line)
            except msgspec.DecodeError:
                raise PersonaempError(
                    f"{path}:{lineno}: corrupt checkpoint line", "delete the file to start this stage over"
                ) from None
            found[str(row[key])] = (offset, row.get("input_hash", ""))
            offset += len(line)
    return found


async def run_units(
    units: Sequence[dict[str, Any]],
    work: Work,
    *,
    key: str,
    output: Path,
    failures: Path,
    fingerprint: str,
    window: int,
    retry_failed: bool = False,
    keep_others: bool = False,
    secrets: Sequence[str] = (),
    on_progress: Callable[[StageOutcome], None] | None = None,
) -> StageOutcome:
    """Run `work(unit)` for every unit not finished yet; return the balanced outcome.

    `keep_others`: `units` is a subset of the stage's input (--limit, --users), so rows of
    other units already in the output stay; otherwise they are stale and go.
    """
    outcome = StageOutcome(units=len(units))
    hashes = {str(unit[key]): unit_hash(unit, fingerprint) for unit in units}
    for path in (output, failures):
        path.parent.mkdir(parents=True, exist_ok=True)
        _repair_tail(path)
    previous = _scan(output, key)  # its order is kept for other units with keep_others
    done = {uid: pos for uid, pos in previous.items() if hashes.get(uid) == pos[1]}
    failed_before = {uid for uid, pos in _scan(failures, key).items() if hashes.get(uid) == pos[1]}
    failed_before -= done.keys()
    todo = []
    for unit in units:
        uid = str(unit[key])
        if uid in done:
            outcome.done_before += 1
        elif uid in failed_before and not retry_failed:
            outcome.failed_before += 1
        else:
            todo.append(unit)
    if on_progress:
        on_progress(outcome)

    encode = msgspec.json.Encoder()
    with (
        jsonlines.open(output, "a", dumps=lambda v: encode.encode(v).decode(), flush=True) as out,
        jsonlines.open(failures, "a", dumps=lambda v: encode.encode(v).decode(), flush=True) as bad,
    ):

        async def one(unit: dict[str, Any]) -> None:
            uid = str(unit[key])
            try:
                row = await work(unit)
            except UnitError as error:
                bad.write(
                    {
                        key: unit[key],
                        "kind": error.kind,
                        "error": redact(str(error), secrets),
                        "raw": redact(error.raw, secrets),
                        "attempts": error.attempts,
                        "input_hash": hashes[uid],
                    }
                )
                outcome.failed += 1
                outcome.failures_by_kind[error.kind] += 1
            else:
                out.write({**row, "input_hash": hashes[uid]})
                outcome.done += 1
            if on_progress:
                on_progress(outcome)

        await _run_window(todo, one, window)
    _finish(output, failures, units, key, hashes, list(previous) if keep_others else None)
    return outcome


async def _run_window(units: Sequence[dict[str, Any]], one, window: int) -> None:
    """Keep up to `window` units in flight; start the next as soon as any one ends."""
    pending: set[asyncio.Task] = set()
    queue = iter(units)
    try:
        for unit in queue:
            pending.add(asyncio.create_task(one(unit)))
            if len(pending) >= window:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    task.result()  # a non-unit error (auth, bug) stops the run
        while pending:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                task.result()
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


def _finish(output: Path, failures: Path, units, key: str, hashes, previous: list[str] | None) -> None:
    """Rewrite both files atomically: input order, one current row per unit, nothing stale.

    With `previous` (the output's unit order before this run), rows of other units stay,
    in that order, and units new to the file follow in input order."""
    order = [str(unit[key]) for unit in units]
    found, found_failed = _scan(output, key), _scan(failures, key)
    rows = {uid: pos for uid, pos in found.items() if hashes.get(uid) == pos[1]}
    failed = {uid: pos for uid, pos in found_failed.items() if hashes.get(uid) == pos[1]}
    rows_order = [uid for uid in order if uid in rows]
    failed_order = [uid for uid in order if uid in failed and uid not in rows]
    if previous is not None:
        rows.update((uid, pos) for uid, pos in found.items() if uid not in hashes)
        failed.update((uid, pos) for uid, pos in found_failed.items() if uid not in hashes)
        known = set(previous)
        rows_order = [uid for uid in previous if uid in rows] + [u for u in rows_order if u not in known]
        failed_order += [uid for uid in found_failed if uid not in hashes and uid not in rows]
    _rewrite(output, rows, rows_order)
    _rewrite(failures, failed, failed_order)


def _rewrite(path: Path, rows: dict[str, tuple[int, str]], order: list[str]) -> None:
    with path.open("rb") as source, atomic_output(path) as target:
        for uid in order:
            source.seek(rows[uid][0])
            target.write(source.readline())
