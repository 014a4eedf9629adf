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
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonlines
import msgspec

from personaemp import locks
from personaemp.errors import Pending, PersonaempError, UnitError
from personaemp.io import atomic_output, cut_back, cut_torn_tail, named, read_jsonl_at
from personaemp.secrets import redact

Work = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
# Failures that say nothing about the unit: the next run tries them again by itself.
ENDPOINT_KINDS = frozenset({"rate_limited", "timeout", "connection", "server_error", "http_error"})
RAW_EXCERPT = 2000  # characters of a bad reply kept at each end in a failures file


def excerpt(raw: str | None) -> str | None:
    """A bad reply as a failures file keeps it: its start and end, enough to see what went
    wrong; a runaway reply would otherwise make the file as large as the replies."""
    if raw is None or len(raw) <= 2 * RAW_EXCERPT:
        return raw
    cut = len(raw) - 2 * RAW_EXCERPT
    return f"{raw[:RAW_EXCERPT]}\n[... {cut} characters cut ...]\n{raw[-RAW_EXCERPT:]}"


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


UNIT_AGAIN = "the unit it held is done again"


def _repair_tail(path: Path) -> None:
    """Cut a line torn by a kill or a full disk, so appends start on a new line."""
    cut_torn_tail(path, UNIT_AGAIN)


def _lines(path: Path) -> int:
    """Lines of a file (a last one without its newline counted)."""
    count, last = 0, b"\n"
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            count, last = count + block.count(b"\n"), block[-1:]
    return count + (last != b"\n")


def _scan(path: Path, key: str, field: str = "input_hash", repair: bool = True) -> dict[str, tuple[int, str]]:
    """unit id -> (byte offset, `field`) of the last row for it in a checkpoint file. A last
    line that is not whole JSON (torn by a crash or a full disk) is left out and, with
    `repair`, cut off with a notice."""
    found: dict[str, tuple[int, str]] = {}
    if not path.exists():
        return found
    decoder = msgspec.json.Decoder()
    offset, size = 0, path.stat().st_size
    with path.open("rb") as handle:
        for lineno, line in enumerate(handle, 1):
            try:
                row = decoder.decode(line)
            except msgspec.DecodeError:
                if offset + len(line) < size:
                    raise PersonaempError(
                        f"{path}:{lineno}: damaged checkpoint line (not JSON)",
                        "remove that line: the rows around it are kept and the stage does its unit again",
                    ) from None
                if repair:  # the last line: torn, not damaged
                    with path.open("rb+") as writable:
                        cut_back(writable, path, offset, size, UNIT_AGAIN)
                break
            found[str(row[key])] = (offset, row.get(field, ""))
            offset += len(line)
    return found


class StageRun:
    """One stage's bookkeeping over its output and failures files, unit by unit.

    `admit(unit)` says whether a unit is to be worked on (and counts the others); `do`
    runs one and appends its row or failure at once; `finish` rewrites both files. Units
    can be admitted while others run: `run` feeds gen-queries the personas as they are
    written (see run_chain). Only ids and hashes are held, never the rows.
    """

    def __init__(self, *, key, output, failures, fingerprint, selected=None, retry_failed=False, dry=False):
        self.key, self.output, self.failures, self.fingerprint = key, output, failures, fingerprint
        self.selected, self.retry_failed, self.dry = selected, retry_failed, dry
        self.outcome = StageOutcome()
        self.hashes: dict[str, str] = {}  # every unit admitted: the current input, in order
        for path in (output, failures):
            if not dry:
                path.parent.mkdir(parents=True, exist_ok=True)
                _repair_tail(path)
        self._done = _scan(output, key, repair=not dry)
        self._failed = _scan(failures, key, repair=not dry)
        self._kinds = {uid: pos[1] for uid, pos in _scan(failures, key, "kind", repair=False).items()}
        self._out = self._bad = self._reading = None
        self._encode = msgspec.json.Encoder()

    def admit(self, unit: dict[str, Any]) -> bool:
        """Record the unit as part of the current input; True if this run must work on it."""
        uid = str(unit[self.key])
        digest = self.hashes[uid] = unit_hash(unit, self.fingerprint)
        if self.selected is not None and uid not in self.selected:
            return False
        self.outcome.units += 1
        if self._done.get(uid, (0, None))[1] == digest:
            self.outcome.done_before += 1
            return False
        failed_before = self._failed.get(uid, (0, None))[1] == digest
        if failed_before and not self.retry_failed and self._kinds.get(uid) not in ENDPOINT_KINDS:
            self.outcome.failed_before += 1
            return False
        return True

    def done_row(self, uid: str) -> dict[str, Any] | None:
        """The row already in the output for an admitted unit, if any (as a later stage reads it)."""
        offset, digest = self._done.get(uid, (0, None))
        if digest is None or self.hashes.get(uid) != digest:
            return None
        if self._reading is None:
            self._reading = self.output.open("rb")
        return read_jsonl_at(self._reading, offset)

    def __enter__(self) -> StageRun:
        if not self.dry:
            dumps = lambda value: self._encode.encode(value).decode()  # noqa: E731
            self._out = jsonlines.open(self.output, "a", dumps=dumps, flush=True)
            self._bad = jsonlines.open(self.failures, "a", dumps=dumps, flush=True)
        return self

    def __exit__(self, *exc_info) -> None:
        handles = ((self._out, self.output), (self._bad, self.failures), (self._reading, self.output))
        for handle, path in handles:
            if handle is not None:
                try:
                    handle.close()  # flushes what a full disk refused: the same error again
                except OSError as exc:
                    named(exc, path)
                    raise

    async def do(self, unit: dict[str, Any], work: Work) -> dict[str, Any] | None:
        """Run one unit; return the row written (None if it failed or is pending)."""

        uid = str(unit[self.key])
        try:
            row = await work(unit)
        except Pending:  # --estimate, --batch: it waits for a request not sent
            self.outcome.pending += 1
            return None
        except UnitError as error:
            self.outcome.failed += 1
            self.outcome.failures_by_kind[error.kind] += 1
            if self._bad is not None:
                self._append(
                    self._bad,
                    self.failures,
                    {
                        self.key: unit[self.key],
                        **getattr(error, "fields", {}),
                        "kind": error.kind,
                        "error": redact(str(error)),
                        "raw": excerpt(redact(error.raw)),
                        "attempts": error.attempts,
                        "input_hash": self.hashes[uid],
                    },
                )
            return None
        self.outcome.done += 1
        if self._out is None:
            return None
        row = {**row, "input_hash": self.hashes[uid]}
        self._append(self._out, self.output, row)
        return row

    @staticmethod
    def _append(writer, path: Path, row: dict[str, Any]) -> None:
        try:
            writer.write(row)
        except OSError as exc:
            named(exc, path)
            raise

    def finish(self, stopped: bool, hashes: dict[str, str] | None = None, partial: bool = False) -> None:
        """Rewrite both files (see _finish). A run stopped before any unit finished (a dead
        endpoint, a wrong key or model) learned nothing: the files stay as they were, so a
        typo never costs an earlier run's rows. `hashes`: the final input, when it was
        not all admitted (run_chain). `partial`: stopped before all was admitted, the files
        stay as appended (the next run finishes them)."""
        if self.dry or (stopped and (partial or not (self.outcome.done or self.outcome.failed))):
            return
        _finish(self.output, self.failures, self.key, hashes if hashes is not None else self.hashes)


async def run_units(
    units: Iterable[dict[str, Any]],
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

    `units` is the stage's whole current input (re-iterable: it is read twice, and may be
    a file read lazily, see io.StageRows): it decides which rows the output keeps.
    `selected` (ids; --limit, --users) restricts what this run computes. `dry`
    (--estimate): nothing is written; a unit that reaches an uncached request is pending.
    """
    # An estimate writes nothing, not even a lock file (it reads a file another run may be writing).
    lock = contextlib.nullcontext() if dry else locks.exclusive(output)
    with lock:
        run = StageRun(
            key=key, output=output, failures=failures, fingerprint=fingerprint,
            selected=selected, retry_failed=retry_failed, dry=dry,
        )  # fmt: skip
        todo = {str(unit[key]) for unit in units if run.admit(unit)}
        if on_progress:
            on_progress(run.outcome)

        async def one(unit: dict[str, Any]) -> None:
            await run.do(unit, work)
            if on_progress:
                on_progress(run.outcome)

        stopped = True
        try:
            with run:
                await _run_window((unit for unit in units if str(unit[key]) in todo), one, window)
            stopped = False
        finally:
            run.finish(stopped)
        return run.outcome


@dataclass
class Link:
    """One stage of a chain (run_chain): its bookkeeping, work and input."""

    run: StageRun
    work: Work
    on_progress: Callable[[StageOutcome], None] | None = None


async def run_chain(
    first: Link,
    units: Iterable[dict[str, Any]] | AsyncIterator[dict[str, Any]],
    second: Link,
    handoff: Callable[[dict[str, Any]], dict[str, Any] | None],
    final_input: Callable[[], Iterable[dict[str, Any]]],
    window: int,
) -> None:
    """Two stages with no barrier: each row the first writes (or wrote before) goes to the
    second at once, as `handoff(row)` makes it (None: not a unit of the second). One window
    holds the units of both, the second's first (they end users, the first's start them).
    `units`, the first's input, is read as the window has room: a file, or an async stream
    still being written (`run`'s filter, streaming.py). At the end each stage's files are
    rewritten as if it had run alone; `final_input()` reads the second's whole input again
    (the first's output, rewritten) for that."""
    await Chain(first, units, second, handoff, final_input).run(window)


class Chain:
    """run_chain's scheduler: which job the window starts next, and when the first stage is
    done. Its state, named:
    - `ready`: the second's units waiting for a place in the window (they go first);
    - `arrived`: the first's units read from a stream, waiting for a place;
    - `ended`: the first's input is all read; `reading`: a read of the stream is under way;
    - `first_running`: the first's units in flight (counted from when a job is made);
    - `finishing`: the first's finish, begun in a thread once its last unit is done."""

    def __init__(self, first: Link, units, second: Link, handoff, final_input) -> None:
        self.first, self.second = first, second
        self.handoff, self.final_input = handoff, final_input
        self.streamed = hasattr(units, "__anext__")
        self.source = units if self.streamed else iter(units)
        self.ready: deque[dict[str, Any]] = deque()
        self.arrived: deque[dict[str, Any]] = deque()
        self.ended = False
        self.reading = False
        self.first_running = 0
        self.finishing: asyncio.Future | None = None

    async def run(self, window: int) -> None:
        """Both stages through one window of `window` jobs, then each one's files finished."""
        first, second = self.first.run, self.second.run
        stopped = True
        try:
            with first, second:
                await _run_feed(self.next_job, window)
            stopped = False
        finally:
            if (
                self.finishing is not None
            ):  # the first was done: its finish runs (or ran) in the thread, whole
                hashes = await asyncio.shield(self.finishing)
            else:
                # Stopped before its whole input was read, the first keeps its files as appended
                # too: a rewrite from the units seen so far would drop the rows of the others.
                first.finish(stopped, partial=not self.ended)
                hashes = None
        # Stopped, the second saw only part of its input: its files stay as appended (the next
        # run finishes them), since a rewrite now would drop the rows of units it never saw.
        second.finish(False, hashes if hashes is not None else self.second_hashes())

    def next_job(self) -> Awaitable[None] | None:
        """The window's next job: a unit of the second, else of the first (read now, or
        arrived from the stream), else a read of the stream; None when there is none now."""
        while True:
            if self.ready:
                return self.one_second(self.ready.popleft())
            if self.arrived:
                return self.start_first(self.arrived.popleft())
            if self.ended or self.reading:
                return None
            if self.streamed:
                self.reading = True
                return self.read_one()
            unit = next(self.source, None)
            if unit is None:
                self.input_ended()
            elif self.take(unit) is not None:
                return self.start_first(unit)

    async def read_one(self) -> None:
        """A job of its own: the stream's next unit, so the window never waits on the stream."""
        try:
            unit = await anext(self.source)
        except StopAsyncIteration:
            self.input_ended()
        else:
            if self.take(unit) is not None:
                self.arrived.append(unit)
        finally:
            self.reading = False

    def take(self, unit: dict[str, Any]) -> dict[str, Any] | None:
        """Admit one unit of the first: returned if it is to be worked on; one finished
        before goes straight on to the second."""
        run = self.first.run
        work = run.admit(unit)
        if not work:
            self.pass_on(run.done_row(str(unit[run.key])))
        self._progress(self.first)
        return unit if work else None

    def pass_on(self, row: dict[str, Any] | None) -> None:
        """A row the first wrote: to the second, as its unit (if it is one)."""
        unit = self.handoff(row) if row is not None else None
        if unit is not None and self.second.run.admit(unit):
            self.ready.append(unit)
        self._progress(self.second)

    def start_first(self, unit: dict[str, Any]) -> Awaitable[None]:
        self.first_running += 1  # counted from now: the task starts later
        return self.one_first(unit)

    async def one_first(self, unit: dict[str, Any]) -> None:
        try:
            self.pass_on(await self.first.run.do(unit, self.first.work))
        finally:
            self.first_running -= 1
        self._progress(self.first)
        self.first_may_be_done()

    async def one_second(self, unit: dict[str, Any]) -> None:
        await self.second.run.do(unit, self.second.work)
        self._progress(self.second)

    def input_ended(self) -> None:
        self.ended = True
        self.first_may_be_done()

    def first_may_be_done(self) -> None:
        """Once the first's input is read and its last unit done: its finish, in a thread."""
        if self.finishing is None and self.ended and not self.arrived and not self.first_running:
            self.finishing = asyncio.get_running_loop().run_in_executor(None, self.finish_first)

    def finish_first(self) -> dict[str, str]:
        """The first's files rewritten, then the second's whole input hashed for its own
        finish. Done in a thread while the second's last units run: the CPU is idle then."""
        self.first.run.finish(False)
        return self.second_hashes()

    def second_hashes(self) -> dict[str, str]:
        second = self.second.run
        return {str(u[second.key]): unit_hash(u, second.fingerprint) for u in self.final_input()}

    @staticmethod
    def _progress(link: Link) -> None:
        if link.on_progress:
            link.on_progress(link.run.outcome)


async def _run_window(units: Iterable[dict[str, Any]], one, window: int) -> None:
    """Keep up to `window` units in flight; start the next as soon as any one ends."""
    queue = iter(units)
    await _run_feed(lambda: one(unit) if (unit := next(queue, None)) is not None else None, window)


async def _run_feed(next_job: Callable[[], Awaitable[None] | None], window: int) -> None:
    """Keep up to `window` jobs in flight. `next_job()` gives the next one, or None when
    there is none now; a job that ends may make more (run_chain), so it is asked again."""
    pending: set[asyncio.Task] = set()
    try:
        while True:
            while len(pending) < window and (job := next_job()) is not None:
                pending.add(asyncio.ensure_future(job))
            if not pending:
                return
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


def _finish(output: Path, failures: Path, key: str, hashes: dict[str, str]) -> None:
    """Rewrite both files atomically: input order (`hashes`' order), one current row per
    unit of the current input, nothing stale (a unit no longer in the input, or whose
    input row changed)."""
    order = list(hashes)
    found, found_failed = _scan(output, key), _scan(failures, key)
    rows = {uid: pos for uid, pos in found.items() if hashes.get(uid) == pos[1]}
    failed = {uid: pos for uid, pos in found_failed.items() if hashes.get(uid) == pos[1]}
    _rewrite(output, rows, [uid for uid in order if uid in rows])
    _rewrite(failures, failed, [uid for uid in order if uid in failed and uid not in rows])


def _rewrite(path: Path, rows: dict[str, tuple[int, str]], order: list[str]) -> None:
    offsets = [rows[uid][0] for uid in order]
    if offsets == sorted(offsets) and _lines(path) == len(offsets):
        return  # already these rows in this order: left as is, so its time says it is unchanged
    with path.open("rb") as source, atomic_output(path) as target:
        for uid in order:
            source.seek(rows[uid][0])
            target.write(source.readline())
