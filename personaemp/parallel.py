"""map() over the cores, for CPU-bound work that is cheap to hand to a forked worker."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
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
    _PARENT[:] = [os.getpid(), _prctl()]
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        pool = multiprocessing.get_context("fork").Pool(workers, initializer=_leave_sigint_to_the_parent)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    with pool:
        return pool.map(function, items, chunksize=1)


_PARENT: list[Any] = [0, None]  # the pid that forks the workers, and prctl (Linux), for their start


def _prctl():
    """libc's prctl, resolved before the fork (loading a library in a forked child can hang)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _leave_sigint_to_the_parent() -> None:
    """A Ctrl-C reaches the workers too (one process group): each printed its traceback. The
    parent's KeyboardInterrupt ends the pool (terminate) and is reported once, by the parent.
    Linux: a worker dies with the parent (a `kill -9` of it alone left them waiting for ever
    on the task queue, whose pipe they hold open themselves)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent, prctl = _PARENT
    if prctl is not None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it died before that took effect
            os._exit(1)
