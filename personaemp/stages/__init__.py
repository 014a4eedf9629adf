"""Where the stage modules stood before the product folders: `personaemp.stages.<x>` still
imports, with a DeprecationWarning naming the new module, until the next release."""

from __future__ import annotations

from personaemp.moved import keep_old_path

MOVED = {
    "filter": "personaemp.dataset.filter", "persona": "personaemp.dataset.persona",
    "queries": "personaemp.dataset.queries", "split": "personaemp.dataset.split",
    "stats": "personaemp.dataset.stats", "dataset_card": "personaemp.dataset.card",
    "publish": "personaemp.dataset.publish", "merge": "personaemp.dataset.merge",
    "criteria": "personaemp.evaluation.criteria", "respond": "personaemp.evaluation.respond",
    "evaluate": "personaemp.evaluation.evaluate", "table": "personaemp.evaluation.table",
    "review": "personaemp.review.page", "agreement": "personaemp.review.agreement",
    "label_studio": "personaemp.review.label_studio", "export": "personaemp.training.export",
}  # fmt: skip


keep_old_path(__name__, MOVED.get)
