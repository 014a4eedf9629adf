"""Progress for library callers: a callback instead of (or besides) a rich bar.

`pe.infer_personas(..., progress=callback)` sets the listener for the call; the stages
report to it as they report to their bars: `callback(stage, completed, total)`, where
`total` is None while it is not known yet (a stream of users still growing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

Listener = Callable[[str, int, "int | None"], object]

_LISTENER: ContextVar[Listener | None] = ContextVar("personaemp_progress", default=None)


def emit(stage: str, completed: int, total: int | None) -> None:
    listener = _LISTENER.get()
    if listener is not None:
        listener(stage, completed, total)


@contextlib.contextmanager
def listening(listener: Listener | None) -> Iterator[None]:
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)
