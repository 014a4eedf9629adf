"""Exceptions the library raises; cli.py turns them into one line on stderr and an exit code."""


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


class UnitError(PersonaempError):
    """One unit (a user, a query) failed for good: it is written to the stage's failures file
    with `kind` and the last raw reply, and the run goes on."""

    def __init__(self, kind: str, message: str, raw: str | None = None, attempts: int = 0):
        super().__init__(message)
        self.kind, self.raw, self.attempts = kind, raw, attempts


def first_problem(exc) -> str:
    """'field.path: message' of a pydantic ValidationError's first error, for one-line errors."""
    problem = exc.errors()[0]
    where = ".".join(str(part) for part in problem["loc"])
    return f"{where}: {problem['msg']}" if where else problem["msg"]
