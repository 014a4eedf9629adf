"""`personaemp.build` is now `personaemp.dataset` (renamed 2026-11-28: tools and the standard
Python .gitignore read a `build/` folder as build output). `personaemp.build.<x>` still
imports, with a DeprecationWarning, until the release after 0.1.0."""

from __future__ import annotations

import importlib.util

from personaemp.moved import keep_old_path

__path__: list[str] = []  # a package to the import system: its modules come from the finder


def _new_name(short: str) -> str | None:
    name = f"personaemp.dataset.{short}"
    return name if importlib.util.find_spec(name) else None


keep_old_path(__name__, _new_name)
