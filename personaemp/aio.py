"""Run a coroutine to its end from sync code, with or without an event loop running.

Every sync entry point of an LLM stage goes through `run_sync`. With no loop running in
this thread it is `asyncio.run`. Inside a running loop (a Jupyter cell, an `async def`
that calls the sync API) `asyncio.run` refuses to start, so the coroutine runs on a loop
of its own in a worker thread, which this thread joins. Not nest_asyncio: its repository
is archived, it cannot patch uvloop, and nbclient dropped it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import signal
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """The coroutine's result (or its exception), whether or not a loop runs here.

    In the worker thread, Ctrl-C (KeyboardInterrupt in this thread) cancels the coroutine
    through its loop, waits for it to unwind (files closed, partial output as a stopped
    run leaves it) and is raised again here."""
    if not loop_running():
        return run_interruptibly(coroutine)
    try:
        return _run_in_thread(coroutine)
    finally:
        _close_if_unstarted(coroutine)


def _run_in_thread(coroutine: Coroutine[Any, Any, T]) -> T:
    """run_sync's way inside a running loop: the coroutine on a loop of its own, in a thread."""
    started, finished = threading.Event(), threading.Event()
    state: dict[str, Any] = {}

    async def tracked() -> T:
        state["loop"], state["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        return await coroutine

    def target() -> None:
        try:
            state["value"] = asyncio.run(tracked())
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            state["error"] = error
        finally:
            started.set()  # also when it failed before starting
            finished.set()

    # The caller's context (e.g. a progress listener) goes with the coroutine.
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(target,), name="personaemp-run-sync", daemon=True)
    # Waited on with an Event, not Thread.join: on 3.11 a join interrupted by Ctrl-C marks
    # the thread as ended, and the second join would not wait for the unwinding.
    try:
        thread.start()
        _wait(finished)
    except KeyboardInterrupt:
        started.wait()
        if "task" in state:
            with contextlib.suppress(RuntimeError):  # the loop has just closed: nothing to cancel
                state["loop"].call_soon_threadsafe(state["task"].cancel)
        _wait(finished)
        raise
    thread.join()
    if "error" in state:
        raise state["error"]
    return state["value"]


def _close_if_unstarted(work: Coroutine[Any, Any, Any]) -> None:
    """Close `work` if Ctrl-C came before its first step: else Python prints "coroutine ... was
    never awaited" after the run's last line ("Interrupted — run it again to resume")."""
    if inspect.getcoroutinestate(work) == inspect.CORO_CREATED:
        work.close()


def _wait(event: threading.Event) -> None:
    """event.wait(), waking every 0.1 s: a SIGINT the kernel handed to another thread runs its
    Python handler only when this (main) thread runs bytecode, which an untimed wait never does."""
    while not event.wait(0.1):
        pass


def run_interruptibly(work: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(work), where Ctrl-C always ends in KeyboardInterrupt.

    asyncio's own handler cancels the work and raises KeyboardInterrupt only if the work
    then ends cancelled: work that ended anyway (the signal came as it finished) or with
    another error on the way out returned or raised that instead, and Ctrl-C was lost or
    misreported. Here the first SIGINT cancels the work (its cleanup keeps finished rows),
    a second raises at once, and either way the caller sees KeyboardInterrupt."""
    try:
        return _run_interruptibly(work)
    finally:
        _close_if_unstarted(work)  # Ctrl-C before its first step


def _run_interruptibly(work: Coroutine[Any, Any, T]) -> T:
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # SIGINT is someone else's
    ):
        return asyncio.run(work)
    interrupted = False
    task: asyncio.Task | None = None

    async def main() -> T:
        nonlocal task
        task = asyncio.current_task()
        if interrupted:  # Ctrl-C came while the loop was being made: the work never starts
            raise asyncio.CancelledError
        return await work

    def on_sigint(signum, frame) -> None:
        nonlocal interrupted
        if interrupted or (task is not None and task.done()):
            interrupted = True
            raise KeyboardInterrupt  # a second Ctrl-C, or one after the work: at once
        interrupted = True
        if task is None:
            # Not raised here: that would break off the loop's making half-way (its __del__
            # then prints a traceback); main() sees the flag as it starts.
            return
        task.cancel()
        task.get_loop().call_soon_threadsafe(lambda: None)  # wake the loop's select()

    previous = signal.signal(signal.SIGINT, on_sigint)
    wrapped = main()
    try:
        with asyncio.Runner() as runner:
            result = runner.run(wrapped)
    except BaseException:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
        _close_if_unstarted(wrapped)
    if interrupted:
        raise KeyboardInterrupt
    return result


def sync_twin(coroutine_function: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """The sync version of an `async def a<name>`: same arguments, run through run_sync."""

    @functools.wraps(coroutine_function)
    def sync(*args: Any, **kwargs: Any) -> T:
        return run_sync(coroutine_function(*args, **kwargs))

    name = coroutine_function.__name__.removeprefix("a")
    sync.__name__ = name
    sync.__qualname__ = name
    sync.__doc__ = (coroutine_function.__doc__ or "") + (
        f"\n\n    The sync twin of `{coroutine_function.__name__}` (works in a running loop too)."
    )
    return sync
