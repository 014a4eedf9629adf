"""Old import paths kept for one release: a package whose modules moved stays importable
under its old name, each module the same object as at its new path, with a
DeprecationWarning that names the new path."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable


class Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`<package>.<x>` is the module `new_name(x)` (None: not a moved name)."""

    def __init__(self, package: str, new_name: Callable[[str], str | None]):
        self.package, self.new_name = package, new_name

    def find_spec(self, name, path=None, target=None):
        prefix, _, short = name.rpartition(".")
        if prefix == self.package and self.new_name(short):
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        new = self.new_name(spec.name.rpartition(".")[2])
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module) -> None:
        pass  # the module at its new path ran already


def keep_old_path(package: str, new_name: Callable[[str], str | None]) -> None:
    """Install the finder for `package` once per process."""
    if not any(isinstance(f, Moved) and f.package == package for f in sys.meta_path):
        sys.meta_path.insert(0, Moved(package, new_name))
