"""Label Studio import at scale: a synthetic build of --tasks queries (one a task), an export
in Label Studio 1.x's JSON shape with one annotation per task (accept/reject, the four judge
checks, a trait, every tenth a note), then `import_export` timed: parse, validation,
de-duplication against the labels file and the batched writes (one fsync per batch).

    .venv/bin/python bench/review/label_studio_bench.py [--tasks 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from personaemp.review.label_studio import import_export  # noqa: E402
from personaemp.review.page import LLM_CHECKS, read_label_events  # noqa: E402


def build(folder: Path, tasks: int) -> tuple[Path, Path]:
    """queries.jsonl (five queries a user) and the export of one annotation per query."""
    queries, export = folder / "queries.jsonl", []
    with queries.open("w", encoding="utf-8") as handle:
        for user in range(0, tasks, 5):
            made = []
            for n in range(min(5, tasks - user)):
                query_id = f"u{user}-q{n}"
                made.append({"query_id": query_id, "category": "ES", "query": "How do I tell her?",
                             "situation": {"topic": "t", "text": "s", "memory_ids": ["m1"]},
                             "memory_ids": ["m1"], "checks": dict.fromkeys(LLM_CHECKS, True)})  # fmt: skip
                results = [{"from_name": "query", "value": {"choices": ["accept" if n % 3 else "reject"]}}]
                results += [{"from_name": f"check_{c}", "value": {"choices": ["agree"]}} for c in LLM_CHECKS]
                results.append({"from_name": "trait_0", "value": {"choices": ["supported"]}})
                if n == 0 and user % 10 == 0:
                    results.append({"from_name": "note", "value": {"text": ["reads like a template"]}})
                export.append({"id": user + n, "data": {"query_id": query_id}, "annotations": [
                    {"id": 1, "completed_by": {"id": 7, "email": "ana@example.org"}, "was_cancelled": False,
                     "updated_at": "2026-11-23T10:02:00.123456Z", "result": results}]})  # fmt: skip
            row = {"user_id": f"u{user}", "memories": [{"memory_id": "m1", "label": "L", "value": "v"}],
                   "traits": [{"aspect": "a", "statement": "Worries", "evidence": ["m1"]}],
                   "big_five": {}, "queries": made, "rejected_queries": []}  # fmt: skip
            handle.write(json.dumps(row) + "\n")
    path = folder / "export.json"
    path.write_text(json.dumps(export), encoding="utf-8")
    return queries, path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as temp:
        folder = Path(temp)
        queries, export = build(folder, args.tasks)
        labels = folder / "labels.jsonl"
        started = time.perf_counter()
        found = import_export(export, queries, labels)
        added, refused = found["added"], found["refused"]
        seconds = time.perf_counter() - started
        again = time.perf_counter()
        second = import_export(export, queries, labels)["added"]
        repeat = time.perf_counter() - again
        events = len(read_label_events(labels))
        size = export.stat().st_size / 1e6
    print(f"Label Studio import: {args.tasks:,} tasks ({size:.0f} MB export) -> {added:,} labels "
          f"in {seconds:.1f} s ({added / seconds:,.0f} labels/s); refused {refused}")  # fmt: skip
    print(f"the same export again: {second} labels added in {repeat:.1f} s; the file holds {events:,} events")


if __name__ == "__main__":
    main()
