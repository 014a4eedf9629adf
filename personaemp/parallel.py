"""Work beside the main process: map() over the cores for CPU-bound work that is cheap to
hand to a forked worker, `python -c` children (run's streamed filter, the filter's
language worker), and imports on a thread while an endpoint works."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def fork_map(function: Callable[[Any], Any], items: list, *, worth_it: bool = True) -> list:
    """[function(item) for item in items], spread over forked workers when `worth_it` and
    there are several items and cores. Forked workers start with what the parent has
    imported (kmodes, matplotlib: no second import); results come back in order."""
    workers = min(len(items), os.cpu_count() or 1)
    if not worth_it or workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [function(item) for item in items]
    # Ctrl-C held while the workers are forked: raised in Pool() it left them to multiprocessing's
    # exit handler (a second's wait), raised in an after-fork hook it was lost (cli.py).
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    # The parent's objects frozen while forking: a worker's garbage collections then leave them
    # alone, so their pages stay shared instead of copied into every worker (CPython's advice).
    gc.freeze()
    try:
        pool = multiprocessing.get_context("fork").Pool(workers, initializer=_leave_sigint_to_the_parent)
    finally:
        gc.unfreeze()
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    with pool:
        return pool.map(function, items, chunksize=1)


def _leave_sigint_to_the_parent() -> None:
    """A Ctrl-C reaches the workers too (one process group): each printed its traceback. The
    parent's KeyboardInterrupt ends the pool (terminate) and is reported once, by the parent.
    The pool ends its workers with SIGTERM: a handler the parent holds (Ray's, after `--executor
    ray`: a C++ stack dump, then sys.exit) must not run there, where it printed a stack per
    worker and once left a worker waiting on a lock for ever."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def python_child(code: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -c code` with this package importable (a checkout on PYTHONPATH included),
    pipes on its stdin and stdout, in a process group of its own: a terminal's Ctrl-C
    reaches only the parent, which stops the child itself."""
    root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env={**os.environ, **(env or {}), "PYTHONPATH": path}, process_group=0,
    )  # fmt: skip


def die_with_parent() -> None:
    """Linux: SIGTERM to this process when its parent dies (PR_SET_PDEATHSIG), where the
    kernel honours it; a child must not count on it alone (its pipes closing say it too)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


class BackgroundImports:
    """Load what later work needs (callables, or module names to import) on a thread, from
    `start()` to the end of the `with` block. Start it once the process waits (requests
    out): begun before, the thread slowed the work's own imports and setup, as they share
    the GIL and module locks (by about 2 s in `run`)."""

    def __init__(self, *loads: Callable[[], object] | str) -> None:
        self.loads, self.thread = loads, None

    def start(self) -> None:
        import threading

        self.thread = threading.Thread(target=self._load, name="personaemp-imports", daemon=True)
        self.thread.start()

    def _load(self) -> None:
        import importlib

        for load in self.loads:
            try:
                load() if callable(load) else importlib.import_module(load)
            except Exception:  # noqa: BLE001 - the work that needs it reports it properly
                return

    def __enter__(self) -> BackgroundImports:
        return self

    def __exit__(self, exc_type, *exc_info) -> None:
        # Joined even when the work stops: a thread still importing holds module locks, and a
        # process forked then (split's or the plots' workers, later in the same process)
        # waits on them for ever (a test after a failed `run` hung so). Not after Ctrl-C:
        # nothing is forked after it, and the join held the exit up to 6 s (datasets' import).
        if self.thread is not None and not (exc_type and issubclass(exc_type, KeyboardInterrupt)):
            self.thread.join()
