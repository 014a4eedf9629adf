"""personaemp: build personalized-empathy datasets from long-term user-AI interaction data.

    import personaemp as pe
    kept = pe.filter_users("data/raw/alpsbench_sample/task1")
    personas = pe.infer_personas(limit=3, base_url="http://127.0.0.1:8000/v1", model="...")

The names below are loaded on first use, so `personaemp --help` stays fast.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

__version__ = "0.1.0"

# public name -> the module it lives in
_EXPORTS = {
    **dict.fromkeys(
        (
            "filter_users", "infer_personas", "ainfer_personas", "generate_queries", "agenerate_queries",
            "split_users", "write_stats", "publish", "write_criteria", "awrite_criteria",
            "write_responses", "awrite_responses", "evaluate", "aevaluate", "run_pipeline",
            "write_table", "export_split", "measure_agreement", "serve_review", "extract_memories",
            "aextract_memories", "merge_shards", "generate_dialogues", "agenerate_dialogues",
        ),
        "personaemp.api",
    ),
    "StageResult": "personaemp.results",
    "LLMSettings": "personaemp.llm.settings",
    "run_sync": "personaemp.aio",
    **dict.fromkeys(
        ("PersonaempError", "InputError", "RowError", "UnitError"), "personaemp.errors"
    ),
    **dict.fromkeys(("EndpointError", "BudgetReached"), "personaemp.llm.engine"),
    "LLMError": "personaemp.llm.endpoints",
}  # fmt: skip

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None and not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is None:
        module = "personaemp.api"  # a stage just added to the catalogue: api.py makes its function
        if not hasattr(importlib.import_module(module), name):
            module = None
    if module is None:
        raise AttributeError(f"module 'personaemp' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
