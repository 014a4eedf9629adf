"""`run`'s filter in a child process, handing its kept users to infer-persona as it writes them.

The filter is CPU work and the LLM stages mostly wait on the endpoint: side by side, on two
cores, the first requests go out while the filter still reads (2 s sooner on 3,600 users).
The child runs stages.filter.filter_users exactly as `personaemp filter` does (same file,
lock, report and manifest entry) and writes each kept row to its stdout. The parent reads a
row only when infer-persona has room for a unit, so the pipe's buffer paces the child and
neither holds more than a few rows. The last frame is the child's outcome: its report, or
the error it stopped on, raised in the parent as if the filter had run there.

A fresh interpreter, not a fork: a process forked after polars, pyarrow or BLAS started
their thread pools can hang in them (polars did, in a test that had used it before).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import struct
import subprocess
import sys
from typing import Any

import msgspec

from personaemp.errors import PersonaempError
from personaemp.parallel import die_with_parent, python_child

_HEADER = struct.Struct(">cQ")  # frame kind, payload length
_ROW, _END = b"r", b"e"
# The child is in a process group of its own, so a Ctrl-C in the terminal reaches only the
# parent, which stops the child itself (SIGTERM, raised in the child as KeyboardInterrupt: its
# partial output is removed). Both the parent and the child stopping at once raced: a child
# dead before its last frame read as "the filter ended without a result", its traceback on
# the terminal. SIGTERM before the handler is set kills it silently (it has written nothing).
# Then the language model first (its half second is the child's longest step), then the rest.
_CHILD = (
    "import os, signal\n"
    "def stop(signum, frame): raise KeyboardInterrupt\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "try:\n"
    "    from personaemp.dataset.streaming import filter_child, tie_to_parent\n"
    "    tie_to_parent()\n"
    "    from personaemp.language import load_in_background\n"
    "    load_in_background()\n"
    "    filter_child()\n"
    "except KeyboardInterrupt:\n"
    "    os._exit(1)\n"
)
_PARENT_PID = "PERSONAEMP_FILTER_PARENT"


def can_stream() -> bool:
    """Where the parent can read a pipe on its event loop (not on Windows)."""
    return os.name == "posix"


class FilterFeed:
    """The filter's kept rows as an async iterator (infer-persona's units in `run`).

    `with FilterFeed(args):` starts the filter (and stops it, if still running, on the
    way out); `async with feed:` opens the pipe on the running event loop. After the last
    row, `report` is the filter's FilterReport and `ids` the kept users in order."""

    def __init__(self, filter_args: dict[str, Any]) -> None:
        self.filter_args = filter_args
        self.ids: list[str] = []
        self.report = None
        self._process: subprocess.Popen | None = None
        self._reader = self._transport = None
        self._decode = msgspec.json.Decoder().decode

    def __enter__(self) -> FilterFeed:
        from personaemp.sources import check_source

        # said here, before infer-persona and gen-queries open their outputs: a missing input
        # left empty personas.jsonl, queries.jsonl, their locks and the cache in a fresh folder
        check_source(str(self.filter_args["source"]), self.filter_args.get("fmt", "auto"))
        self._process = python_child(_CHILD, {_PARENT_PID: str(os.getpid())})
        try:
            self._process.stdin.write(pickle.dumps(self.filter_args))
            self._process.stdin.close()
        except BrokenPipeError:  # the child died at once: reading its output says so
            pass
        except BaseException:  # Ctrl-C right now: no __exit__ will stop it
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        process = self._process
        try:
            if self._transport is None:  # never read on a loop
                process.stdout.close()
            if self.report is not None:  # it has finished: let it end by itself
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(5)
            self._stop()
        finally:
            if process.poll() is None:  # a second Ctrl-C cut the above short: no child outlives run
                process.kill()
            process.wait()

    def _stop(self) -> None:
        """A stopped run: the child stops at once (its partial output is removed)."""
        process = self._process
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()

    @property
    def growing(self) -> bool:
        """More users may still come (the filter has not sent its result yet)."""
        return self.report is None

    async def __aenter__(self) -> FilterFeed:
        loop = asyncio.get_running_loop()
        self._reader = asyncio.StreamReader()
        self._transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(self._reader), self._process.stdout
        )
        return self

    async def __aexit__(self, *exc_info) -> None:
        # Stopped before the end: the child first, its pipe after. A pipe closed first broke
        # the child's write, and SIGTERM then landed while it removed its partial output
        # (a `.filtered.jsonl.*.tmp` was left, once in a loaded CI run).
        if self.report is None:
            self._stop()
        self._transport.close()

    def __aiter__(self) -> FilterFeed:
        return self

    async def __anext__(self) -> dict[str, Any]:
        try:
            kind, size = _HEADER.unpack(await self._reader.readexactly(_HEADER.size))
            payload = await self._reader.readexactly(size)
        except asyncio.IncompleteReadError:
            raise PersonaempError(
                f"the filter process ended without a result (exit code {self._process.wait()})",
                "run `personaemp filter` alone to see why",
            ) from None
        if kind == _ROW:
            row = self._decode(payload)
            self.ids.append(str(row["user_id"]))
            return row
        ok, outcome = pickle.loads(payload)
        if not ok:
            raise outcome
        self.report = outcome
        raise StopAsyncIteration


def tie_to_parent() -> None:
    """Linux: SIGTERM (a clean stop) to the child when `run` dies without stopping it
    (kill -9); the child is in its own process group, so a kill of `run`'s misses it."""
    parent = int(os.environ.get(_PARENT_PID, "0"))
    die_with_parent()
    if parent and os.getppid() != parent:  # it died before that took effect
        os._exit(1)


def filter_child() -> None:
    """The child: filter_users with the pickled arguments on stdin; each kept row, then the
    outcome, as frames on stdout."""
    from rich.console import Console

    from personaemp.dataset.filter import filter_users

    filter_args = pickle.load(sys.stdin.buffer)
    out = sys.stdout.buffer

    def send(kind: bytes, payload: bytes) -> None:
        out.write(_HEADER.pack(kind, len(payload)) + payload)
        out.flush()

    quiet = Console(quiet=True)
    try:
        kept = filter_users(**filter_args, console=quiet, on_kept=lambda row: send(_ROW, row))
        outcome = (True, kept.report)  # the parent makes its StageResult (pipeline.py)
    except BaseException as error:  # noqa: BLE001 - every stop is the parent's to report
        outcome = (False, error)
    try:
        payload = pickle.dumps(outcome)
    except Exception:  # noqa: BLE001 - an error that does not pickle, as text
        text = f"the filter failed: {type(outcome[1]).__name__}: {outcome[1]}"
        payload = pickle.dumps((False, PersonaempError(text)))
    try:
        send(_END, payload)
    except OSError:  # the parent stopped reading: it has its own error to report
        os._exit(1)  # not a normal exit, whose flush of stdout would print a broken pipe
