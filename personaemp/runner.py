"""Run a stage's units concurrently, resumably: nothing finished is ever computed twice.

Each finished unit is appended to the stage's output file at once (a killed run loses at
most the units in flight); each unit that fails for good is appended to the failures
file with its reason. A re-run skips both, except failures the endpoint caused
(connection, 5xx, HTTP errors), which are simply tried again; `retry_failed` also
retries content failures (invalid, truncated, empty, ungrounded...). At the end both
files are rewritten atomically in input order, holding only units of the current input.

A unit counts as finished only if it was computed from the same input row and the same
stage fingerprint (model, prompts, sampling, ...): its `input_hash` must match.
One process writes an output at a time (a lock file beside it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonlines
import msgspec

from personaemp import locks
from personaemp.errors import PersonaempError, UnitError
from personaemp.io import atomic_output
from personaemp.secrets import redact

Work = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
# Failures that say nothing about the unit: the next run tries them again by itself.
ENDPOINT_KINDS = frozenset({"rate_limited", "timeout", "connection", "server_error", "http_error"})


@dataclass
class StageOutcome:
    units: int = 0
    done: int = 0  # finished in this run
    done_before: int = 0  # finished in an earlier run, skipped
    failed: int = 0  # failed for good in this run
    failed_before: int = 0  # failed in an earlier run, not retried (see retry_failed)
    pending: int = 0  # --estimate: stopped at a request the cache could not answer
    failures_by_kind: Counter = field(default_factory=Counter)

    @property
    def balanced(self) -> bool:
        finished = self.done + self.done_before + self.failed + self.failed_before
        return self.units == finished + self.pending


def unit_hash(row: dict[str, Any], fingerprint: str) -> str:
    encoded = msgspec.json.encode({"row": row, "fingerprint": fingerprint}, order="sorted")
    return hashlib.sha256(encoded).hexdigest()[:16]


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


def _scan(path: Path, key: str, field: str = "input_hash") -> dict[str, tuple[int, str]]:
    """unit id -> (byte offset, `field`) of the last row for it in a checkpoint file."""
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
            found[str(row[key])] = (offset, row.get(field, ""))
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
    selected: set[str] | None = None,
    retry_failed: bool = False,
    on_progress: Callable[[StageOutcome], None] | None = None,
    dry: bool = False,
) -> StageOutcome:
    """Run `work(unit)` for every unit not finished yet; return the balanced outcome.

    `units` is the stage's whole current input: it decides which rows the output keeps.
    `selected` (ids; --limit, --users) restricts what this run computes. `dry`
    (--estimate): nothing is written; a unit that reaches an uncached request is pending.
    """
    # An estimate writes nothing, not even a lock file (it reads a file another run may be writing).
    lock = contextlib.nullcontext() if dry else locks.exclusive(output)
    with lock:
        return await _run_locked(
            units, work, key, output, failures, fingerprint, window, selected, retry_failed, on_progress, dry
        )


async def _run_locked(
    units, work, key, output, failures, fingerprint, window, selected, retry_failed, on_progress, dry
) -> StageOutcome:
    hashes = {str(unit[key]): unit_hash(unit, fingerprint) for unit in units}
    chosen = [unit for unit in units if selected is None or str(unit[key]) in selected]
    outcome = StageOutcome(units=len(chosen))
    for path in (output, failures):
        if not dry:
            path.parent.mkdir(parents=True, exist_ok=True)
            _repair_tail(path)
    done = {uid for uid, pos in _scan(output, key).items() if hashes.get(uid) == pos[1]}
    failed_before = {
        uid for uid, pos in _scan(failures, key).items() if hashes.get(uid) == pos[1] and uid not in done
    }
    kinds = {uid: pos[1] for uid, pos in _scan(failures, key, "kind").items()}
    todo = []
    for unit in chosen:
        uid = str(unit[key])
        if uid in done:
            outcome.done_before += 1
        elif uid in failed_before and not retry_failed and kinds.get(uid) not in ENDPOINT_KINDS:
            outcome.failed_before += 1
        else:
            todo.append(unit)
    if on_progress:
        on_progress(outcome)

    from personaemp.llm.engine import Pending

    if dry:
        return await _run_dry(todo, work, window, outcome, on_progress)
    encode = msgspec.json.Encoder()
    stopped = True
    try:
        with (
            jsonlines.open(output, "a", dumps=lambda v: encode.encode(v).decode(), flush=True) as out,
            jsonlines.open(failures, "a", dumps=lambda v: encode.encode(v).decode(), flush=True) as bad,
        ):

            async def one(unit: dict[str, Any]) -> None:
                uid = str(unit[key])
                try:
                    row = await work(unit)
                except Pending:  # --batch: it waits for a request of the next round
                    outcome.pending += 1
                except UnitError as error:
                    bad.write(
                        {
                            key: unit[key],
                            "kind": error.kind,
                            "error": redact(str(error)),
                            "raw": redact(error.raw),
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
            stopped = False
    finally:
        # What finished is kept and nothing stale stays, also after a run-level stop. A run
        # stopped before any unit finished (a dead endpoint, a wrong key or model) learned
        # nothing: the files stay as they were, so a typo never costs an earlier run's rows.
        if not stopped or outcome.done or outcome.failed:
            _finish(output, failures, units, key, hashes)
    return outcome


async def _run_dry(todo, work, window: int, outcome: StageOutcome, on_progress) -> StageOutcome:
    """--estimate: each unit runs as far as the cache answers; nothing is written."""
    from personaemp.llm.engine import Pending

    async def one(unit: dict[str, Any]) -> None:
        try:
            await work(unit)
        except Pending:
            outcome.pending += 1
        except UnitError as error:  # what the cache holds already fails it: so would a real run
            outcome.failed += 1
            outcome.failures_by_kind[error.kind] += 1
        else:
            outcome.done += 1
        if on_progress:
            on_progress(outcome)

    await _run_window(todo, one, window)
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
                _raise_first(finished)
        while pending:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            _raise_first(finished)
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


def _raise_first(finished: set[asyncio.Task]) -> None:
    """A non-unit error (auth, a dead endpoint, a bug) stops the run. Every finished task's
    exception is retrieved, so asyncio prints no "never retrieved" traceback for the rest."""
    errors = [task.exception() for task in finished if not task.cancelled()]
    errors = [error for error in errors if error is not None]
    if errors:
        raise errors[0]


def _finish(output: Path, failures: Path, units, key: str, hashes) -> None:
    """Rewrite both files atomically: input order, one current row per unit of the current
    input, nothing stale (a unit no longer in the input, or whose input row changed)."""
    order = [str(unit[key]) for unit in units]
    found, found_failed = _scan(output, key), _scan(failures, key)
    rows = {uid: pos for uid, pos in found.items() if hashes.get(uid) == pos[1]}
    failed = {uid: pos for uid, pos in found_failed.items() if hashes.get(uid) == pos[1]}
    _rewrite(output, rows, [uid for uid in order if uid in rows])
    _rewrite(failures, failed, [uid for uid in order if uid in failed and uid not in rows])


def _rewrite(path: Path, rows: dict[str, tuple[int, str]], order: list[str]) -> None:
    with path.open("rb") as source, atomic_output(path) as target:
        for uid in order:
            source.seek(rows[uid][0])
            target.write(source.readline())
