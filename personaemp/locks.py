"""One writer per output: an advisory lock file beside it, holding the writer's PID.

`flock` locks die with their process, so a lock left by a killed run is simply taken
over; the file itself may stay behind and means nothing on its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from personaemp.errors import InputError


def lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def exclusive(path: Path, *, wait: bool = False, hint: str = "") -> Iterator[None]:
    """Hold the lock of `path` for the block. `wait=False`: if another process holds it,
    raise InputError naming its PID at once; `wait=True`: wait for it (short sections)."""
    target = lock_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            raise InputError(
                f"{path} is being written by process {holder}",
                hint or "wait for it to finish, or write to another --output",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
