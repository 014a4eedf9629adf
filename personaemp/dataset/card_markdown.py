"""The Markdown pieces the dataset card's sections share (personaemp.dataset.card and its
section modules): a table cell, a table, a figure link, a list of counts."""

from __future__ import annotations

from typing import Any

from personaemp.dataset.stats import FIGURE_DIR


def cell(value: Any) -> str:
    """A value as one Markdown table cell: a `|` would end the cell (also inside code), a
    line break the row."""
    return " ".join(str(value).replace("|", "\\|").split())


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(cell(name) for name in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def count(value: Any) -> int:
    return value if isinstance(value, int) else 0


def counts(value: Any) -> str:
    items = value.items() if isinstance(value, dict) else ()
    return ", ".join(f"{name} {count}" for name, count in items)


def image(name: str, text: str, figures: list[str]) -> list[str]:
    """A relative Markdown image link (the Hub shows it from the repository), if drawn."""
    path = f"{FIGURE_DIR}/{name}"
    return [f"![{text}]({path})", ""] if path in figures else []
