"""Where the stage modules stood before the product folders: `personaemp.stages.<x>` still
imports, with a DeprecationWarning naming the new module, until the next release."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "filter": "personaemp.build.filter", "persona": "personaemp.build.persona",
    "queries": "personaemp.build.queries", "split": "personaemp.build.split",
    "stats": "personaemp.build.stats", "dataset_card": "personaemp.build.card",
    "publish": "personaemp.build.publish", "merge": "personaemp.build.merge",
    "criteria": "personaemp.evaluation.criteria", "respond": "personaemp.evaluation.respond",
    "evaluate": "personaemp.evaluation.evaluate", "table": "personaemp.evaluation.table",
    "review": "personaemp.review.page", "agreement": "personaemp.review.agreement",
    "label_studio": "personaemp.review.label_studio", "export": "personaemp.training.export",
}  # fmt: skip


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`personaemp.stages.<x>` is the module at its new path (the same object)."""

    def find_spec(self, name, path=None, target=None):
        prefix, _, short = name.rpartition(".")
        if prefix == __name__ and short in MOVED:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        new = MOVED[spec.name.rpartition(".")[2]]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module) -> None:
        pass  # the module at its new path ran already


if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Moved())
