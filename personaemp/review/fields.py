"""What a label may say, shared by the review page, its dialogues and Label Studio: the
fields' values and limits, and the error of a label about something its item does not have."""

from __future__ import annotations

from typing import Any

from personaemp.errors import InputError

VALUES = {
    "query": ("accept", "reject"),
    "check": ("agree", "disagree"),
    "trait": ("supported", "unsupported"),
}
TURN_VALUES = {"realism": ("realistic", "unrealistic"), "character": ("in", "out")}  # a dialogue's turns
PERM_SCORES = (1, 2, 3, 4, 5)  # a dialogue's supporter, per PERM dimension
NOTE_CHARS, NAME_CHARS = 5000, 60


class UnknownTarget(InputError):
    """A label about a trait or check this query does not have: refused and counted."""


def shown(value: Any, limit: int = 80) -> str:
    """A value from outside as one safe, short line: repr (control characters and terminal
    escapes spelled out), cut at `limit`."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
