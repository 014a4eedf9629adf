"""The agreement figures shared by `personaemp agreement`'s two reports (queries and
dialogues): the 2x2 confusion of two answers, Cohen's kappa, the Rogan-Gladen correction,
bootstrap intervals over clusters (queries or dialogues), and what a labels file held."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from personaemp.review.page import LABEL_STUDIO_REVIEWER


def confusion(pairs: Sequence[tuple[bool, bool]]) -> list[int]:
    """[both pass, first passes only, second passes only, both fail] of (first, second) pairs."""
    cells = [0, 0, 0, 0]
    for first, second in pairs:
        cells[(0 if second else 1) if first else (2 if second else 3)] += 1
    return cells


def kappa_of(cells: Sequence[float]) -> float | None:
    """Cohen's kappa of a 2x2 confusion; None when chance agreement is total (one answer only)."""
    a, b, c, d = cells
    n = a + b + c + d
    if not n:
        return None
    observed = (a + d) / n
    chance = ((a + b) * (a + c) + (c + d) * (b + d)) / (n * n)
    return None if chance >= 1 else (observed - chance) / (1 - chance)


def rogan_gladen(apparent: float, sensitivity: float, specificity: float) -> float | None:
    """The true share from an apparent one and the test's error rates (clipped to [0, 1]);
    None when the judge does no better than chance (Se + Sp <= 1)."""
    youden = sensitivity + specificity - 1
    if youden <= 0:
        return None
    return min(1.0, max(0.0, (apparent + specificity - 1) / youden))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


class Bootstrap:
    """Percentile intervals from resampling clusters (queries) with replacement."""

    def __init__(self, resamples: int, seed: int):
        import numpy as np

        self.np, self.resamples, self.rng = np, resamples, np.random.default_rng(seed)

    def cells(self, clusters: Sequence[Sequence[int]]):
        """(resamples, 4) confusion counts of resampled clusters, each a confusion of its own."""
        counts = self.np.asarray(clusters, dtype=float).reshape(-1, 4)
        picks = self.rng.integers(0, len(counts), size=(self.resamples, len(counts)))
        return counts[picks].sum(axis=1)

    def interval(self, values) -> list[float] | None:
        values = self.np.asarray(values, dtype=float)
        values = values[~self.np.isnan(values)]
        if len(values) < self.resamples / 2:  # mostly undefined: no honest interval
            return None
        low, high = self.np.percentile(values, [2.5, 97.5])
        return [round(float(low), 4), round(float(high), 4)]

    def kappa(self, cells):
        np = self.np
        a, b, c, d = cells.T
        n = a + b + c + d
        with np.errstate(divide="ignore", invalid="ignore"):
            observed = (a + d) / n
            chance = ((a + b) * (a + c) + (c + d) * (b + d)) / (n * n)
            return np.where(chance < 1, (observed - chance) / (1 - chance), np.nan)


def agreement_figures(clusters: dict[str, list[int]], boot: Bootstrap) -> dict[str, Any]:
    """Kappa (with interval), raw agreement and a constant answer's score, of the pairs
    grouped per query (`clusters`: query -> confusion). Pairs: (reference, other)."""
    cells = [sum(column) for column in zip(*clusters.values(), strict=True)] if clusters else [0, 0, 0, 0]
    n = sum(cells)
    passes = cells[0] + cells[2]  # the second's pass answers
    figures: dict[str, Any] = {"pairs": n, "queries": len(clusters), "confusion": cells}
    if not n:
        return {**figures, "kappa": None, "kappa_ci": None, "agreement": None, "constant": None}
    figures["kappa"] = _round(kappa_of(cells))
    # resampled in query order: the figures follow from the seed alone, never from hash order
    figures["kappa_ci"] = boot.interval(boot.kappa(boot.cells([clusters[q] for q in sorted(clusters)])))
    figures["agreement"] = round((cells[0] + cells[3]) / n, 4)
    # always answering what the second (people) says most often
    figures["constant"] = round(max(passes, n - passes) / n, 4)
    return figures


def labels_held(events, state: dict, not_scored, items: str) -> dict[str, Any]:
    """What the labels file held, for a report: its events, reviewers and `items` labelled
    (queries or dialogues), the reviewers who came from Label Studio, what was not scored."""
    return {
        "events": len(events),
        "reviewers": sorted(state),
        f"{items}_labelled": len({key for labelled in state.values() for key in labelled}),
        "label_studio_reviewers": sum(name.startswith(LABEL_STUDIO_REVIEWER) for name in state),
        "not_scored": not_scored,
    }


def write_and_show(report: dict[str, Any], out: Path, name: str, lines: Sequence[str], console) -> None:
    """A report's JSON written as `out/name` (atomically), its lines printed, then where it went."""
    from rich.markup import escape

    from personaemp.io import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / name, report)
    for line in lines:
        console.print(escape(line))
    console.print(f"wrote {escape(str(out / name))}")
