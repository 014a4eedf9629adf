"""Exceptions the library raises; cli.py turns them into one line on stderr and an exit code."""

import contextlib
import contextvars
import os


class PersonaempError(Exception):
    """A run failed for a reason the user can act on (exit code 1)."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} — {self.hint}" if self.hint else self.message

    def __reduce__(self):
        # Pickled whole (run's forked filter sends its error to the parent): the default
        # rebuilds from args alone, which loses the hint and breaks RowError(location, message).
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type, args: tuple, state: dict) -> PersonaempError:
    error = Exception.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class InputError(PersonaempError):
    """The input data, rules or options are wrong (exit code 2)."""

    exit_code = 2


class RowError(InputError):
    """One input row is bad; `--on-error skip` may skip it instead of stopping."""

    def __init__(self, location: str, message: str):
        super().__init__(f"{location}: {message}", "fix the row or pass --on-error skip")
        self.location = location
        self.reason = message


class StageFailedError(PersonaempError):
    """A stage had units and finished none of them (each one failed): exit code 1, as a failed run."""


class UnitError(PersonaempError):
    """One unit (a user, a query) failed for good: it is written to the stage's failures file
    with `kind` and the last raw reply, and the run goes on."""

    def __init__(self, kind: str, message: str, raw: str | None = None, attempts: int = 0):
        super().__init__(message)
        self.kind, self.raw, self.attempts = kind, raw, attempts
        self.fields: dict[str, str] = {}  # the stage's own columns of the failures row


SHOWN_NAMES = 10  # ids an error names before "and N more"


def some(names, limit: int = SHOWN_NAMES) -> str:
    """`names` as an error line shows them: the first `limit`, then how many more (10,000
    unknown ids were one line of 80K characters)."""
    names = [str(name) for name in names]
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit:,} more" if len(names) > limit else "")


def first_problem(exc) -> str:
    """'field.path: message' of a pydantic ValidationError's first error, for one-line errors."""
    problem = exc.errors()[0]
    where = ".".join(str(part) for part in problem["loc"])
    return f"{where}: {problem['msg']}" if where else problem["msg"]


# errno -> (what happened, what to do, exit code): 2 when the path the user gave is wrong, 1
# when the machine is (a full disk, a failing device).
_OS_ERRORS = {
    "ENOSPC": ("no space left on the device", "free some space and run it again: finished rows are kept", 1),
    "EDQUOT": ("the disk quota is used up", "free some space and run it again: finished rows are kept", 1),
    "EROFS": ("the file system is read-only", "choose a folder on a writable disk", 2),
    "EACCES": ("permission denied", "choose a folder you may write to, or fix its permissions", 2),
    "EPERM": ("operation not permitted", "choose another path, or fix its permissions", 2),
    "EISDIR": ("is a folder, not a file", "give a file's path", 2),
    "ENOTDIR": ("a part of this path is a file, not a folder", "check the path", 2),
    "ENOENT": ("no such file or folder", "check the path", 2),
    "ENAMETOOLONG": ("the name is too long", "choose a shorter path", 2),
    "EEXIST": ("already exists", "choose another path", 2),
    "EMFILE": ("too many open files", "raise the limit (ulimit -n) or lower --concurrency", 1),
    "EIO": ("the device failed to read or write", "check the disk", 1),
}


def os_error(exc: OSError) -> PersonaempError:
    """An OSError as one line: the path, what happened in words, and what to do."""
    import errno

    name = errno.errorcode.get(exc.errno or 0, "")
    what, hint, code = _OS_ERRORS.get(name, (exc.strerror or str(exc), None, 1))
    paths = [str(p) for p in (exc.filename, exc.filename2) if p not in (None, "")]
    if name == "EEXIST" and paths and os.path.isfile(paths[0]):  # mkdir where a file is
        what, hint = "is a file, not a folder", "give a folder's path"
    # os.replace(tmp, target) names the temp file first: the user knows the target
    where = paths[-1] if len(paths) == 2 and name in ("EISDIR", "ENOTDIR") else (paths[0] if paths else "")
    error = (InputError if code == 2 else PersonaempError)(f"{where}: {what}" if where else what, hint)
    return error


class Pending(Exception):
    """--estimate, --batch: the cache cannot answer this request; it was handed on, not sent."""


# Who is calling: the command line ("cli", the default) or Python (`pe.*`, the reward), so
# that an error names what the caller wrote: a flag, or an argument.
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("personaemp_caller", default="cli")


def spoken(cli: str, python: str) -> str:
    """`cli` on the command line, `python` to a Python caller."""
    return python if CALLER.get() == "python" else cli


@contextlib.contextmanager
def python_caller():
    """Errors raised inside speak Python (arguments, not flags)."""
    token = CALLER.set("python")
    try:
        yield
    finally:
        CALLER.reset(token)
