"""map() over the cores, for CPU-bound work that is cheap to hand to a forked worker."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
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
    try:
        pool = multiprocessing.get_context("fork").Pool(workers, initializer=_leave_sigint_to_the_parent)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    with pool:
        return pool.map(function, items, chunksize=1)


def _leave_sigint_to_the_parent() -> None:
    """A Ctrl-C reaches the workers too (one process group): each printed its traceback. The
    parent's KeyboardInterrupt ends the pool (terminate) and is reported once, by the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
