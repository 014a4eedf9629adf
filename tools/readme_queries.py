"""Put three queries the demo wrote into the README (between its demo-queries markers).

    make demo && .venv/bin/python tools/readme_queries.py

One accepted query per category where the demo accepted one (ES, HEQ, SS, in that order),
each with its user's language and the memories it rests on, so the README shows what
`make demo` really makes. Exit 1 when the demo's queries file is missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jsonlines

from personaemp.dataset.card import cell
from personaemp.io import rewrite_generated
from personaemp.records import CATEGORIES

ROOT = Path(__file__).resolve().parent.parent
QUERIES = ROOT / "data" / "processed" / "queries.jsonl"
BEGIN, END = "<!-- demo-queries: begin (tools/readme_queries.py) -->", "<!-- demo-queries: end -->"


def picked(path: Path, wanted: int = 3) -> list[tuple[dict, dict]]:
    """(user row, query) pairs: one per category first, in file order, then any others."""
    with jsonlines.open(path) as rows:
        pairs = [(row, query) for row in rows for query in row.get("queries", [])]
    chosen, seen = [], set()
    for row, query in pairs:
        if query["category"] not in seen:
            seen.add(query["category"])
            chosen.append((row, query))
    chosen += [pair for pair in pairs if pair not in chosen]
    return sorted(chosen[:wanted], key=lambda pair: CATEGORIES.index(pair[1]["category"]))


def block(pairs: list[tuple[dict, dict]]) -> str:
    lines = ["| category | language | query | memories it rests on |", "|---|---|---|---|"]
    for row, query in pairs:
        values = {m["memory_id"]: m["value"] for m in row["memories"]}
        rests = "; ".join(values.get(i, i) for i in query["memory_ids"])
        cells = [query["category"], row.get("language") or "?", query["query"], rests]
        lines.append("| " + " | ".join(cell(value) for value in cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    if not QUERIES.is_file():
        print(f"{QUERIES} is missing: run `make demo` first", file=sys.stderr)
        return 1
    changed = rewrite_generated(ROOT / "README.md", BEGIN, END, block(picked(QUERIES)))
    print("README.md: updated" if changed else "README.md: up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
