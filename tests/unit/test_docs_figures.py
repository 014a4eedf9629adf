"""The docs' figures are the bench's: docs/training.md's table of calls and tokens per rollout
is what `bench/training/grpo_bench.py --write-docs` wrote from its run (bench/results/grpo_bench.json).
A hand edit of the table, or figures from another run pasted in, fails here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_training_pages_table_is_the_benchs_last_run():
    sys.path.insert(0, str(ROOT / "bench" / "training"))
    try:
        import grpo_bench
    finally:
        sys.path.remove(str(ROOT / "bench" / "training"))
    result = json.loads(grpo_bench.RESULTS.read_text(encoding="utf-8"))
    page = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    assert grpo_bench.docs_table(result) in page, (
        "regenerate: python bench/training/grpo_bench.py --write-docs"
    )
    assert page.count(grpo_bench.BEGIN) == 1
    assert {row["mode"] for row in result["modes"]} == {"per-dimension", "joint"}
