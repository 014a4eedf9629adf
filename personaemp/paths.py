"""What a command reads and writes, from the options' `Opt(io=...)` declarations, checked
before anything is written: a command never writes over, or into, what it reads.

An option declares `io="read"` (a file or folder the command reads), `io="write"` (a file it
writes; `beside` names the files written next to it, e.g. `{stem}.scores.jsonl`) or
`io="update"` (a file it reads and adds to) or `io="folder"` (a folder it writes; `beside`
names the entries it writes inside, else the whole folder is its own). `check_paths` takes
the sections a command uses and refuses, with one line naming both, an output that is an
input, lies inside an input folder, or holds an input inside a folder it writes.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from personaemp.errors import InputError


@dataclass(frozen=True)
class Touched:
    """One path a command reads or writes, and the option it comes from."""

    label: str  # how the user named it: a flag, or a TOML key
    path: Path  # absolute, symlinks resolved
    whole: bool = False  # a folder written as a whole: nothing read may lie inside it
    beside: bool = False  # a file written next to the option's own (a report, failures)

    def holds(self, path: Path) -> bool:
        """Whether `path` is this file (a `*` in the name: any it matches, e.g. per judge)."""
        if "*" in self.path.name:
            return path.parent == self.path.parent and fnmatch.fnmatchcase(path.name, self.path.name)
        return _same(self.path, path)

    @property
    def shown(self) -> str:
        return f"{self.label} {self.path}"


def _absolute(path: Path | str) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _inside(child: Path, folder: Path) -> bool:
    return child != folder and child.is_relative_to(folder)


def _same(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:  # hard links, bind mounts: the same file under two names
        return os.path.samefile(a, b)
    except OSError:
        return False


def _values(section: Any, name: str) -> list[Any]:
    # An option whose default is computed (respond's output) exposes it as `<name>_path`.
    value = getattr(section, f"{name}_path", None) or getattr(section, name)
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def touched(
    sections: Iterable[tuple[str, Any]], label: Callable[[str, str, str], str] | None = None
) -> tuple[list[Touched], list[Touched]]:
    """(read, written) paths of resolved option sections, given as (section name, model)."""
    from personaemp.options import specs

    label = label or (lambda section, name, flag: flag)
    reads, writes = [], []
    for section_name, section in sections:
        for option in specs(section_name):
            io = option.opt.io
            if io is None:
                continue
            shown = label(section_name, option.name, option.flag)
            for value in _values(section, option.name):
                if isinstance(value, str) and value.startswith("hf:"):
                    continue  # a Hub dataset id, not a path
                path = _absolute(value)
                if io == "read":
                    reads.append(Touched(shown, path))
                elif io in ("write", "update"):
                    writes.append(Touched(shown, path))
                    fields = {"stem": path.stem, "name": path.name}
                    writes.extend(
                        Touched(shown, path.with_name(pattern.format(**fields)), beside=True)
                        for pattern in option.opt.beside
                    )
                elif option.opt.beside:  # a folder of which the command writes these entries
                    writes.extend(Touched(shown, path / entry, whole=True) for entry in option.opt.beside)
                else:
                    writes.append(Touched(shown, path, whole=True))
    return reads, writes


def conflict(reads: list[Touched], writes: list[Touched]) -> str | None:
    """The first output that would write over or into an input, in words; None if none."""
    for read in reads:
        for write in writes:
            if write.holds(read.path):
                name = read.path.name if "*" in write.path.name else write.path.name
                what = f"{write.label}'s {name} (beside it)" if write.beside else write.label
                return f"{what} would write over {read.shown}, which this command reads"
            if _inside(write.path, read.path):
                return f"{write.label} would write {write.path} inside {read.shown}, which this command reads"
            if write.whole and _inside(read.path, write.path):
                return f"{read.shown} lies inside {write.shown}, which this command writes"
    return None


def check_paths(
    sections: Iterable[tuple[str, Any]], label: Callable[[str, str, str], str] | None = None
) -> None:
    """Stop (InputError, exit 2) before a command writes over or into what it reads."""
    problem = conflict(*touched(sections, label))
    if problem:
        raise InputError(problem, "give the output another path: a command never writes over its input")


def check_command(command: str, section: Callable[[str], Any], *, toml: bool = False) -> None:
    """`check_paths` over the sections of a stage command (personaemp.catalogue.COMMANDS);
    `section(name)` gives a resolved section. Options are named by flag, or by TOML key."""
    from personaemp.catalogue import COMMANDS

    label = (lambda name, key, flag: f"{name}.{key}") if toml else None
    check_paths(((name, section(name)) for name in COMMANDS[command]), label)
