"""The reward's accounting: a step's result, steps' lines (the reward log, JSONL) added up,
and how far two instruments agree on the same rollouts."""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from personaemp.errors import InputError
from personaemp.records import DIMENSIONS


@dataclasses.dataclass
class StepResult:
    rewards: list[float]
    rows: list[dict]  # per rollout: status, scores, samples, bystander, harmonic, reward, fallbacks
    record: dict  # the step's accounting line


def summarise(records: Iterable[dict]) -> dict:
    """Steps' accounting lines added up: totals, and calls and tokens per judged rollout."""
    records = list(records)
    total: dict[str, Any] = {"steps": len(records)}
    summed = ("rollouts", "distinct", "judged", "empty", "cut_in_reasoning", "calls", "requests",
              "cache_hits", "reasks", "prompt_tokens", "completion_tokens", "unparsed_samples")  # fmt: skip
    for key in summed:
        total[key] = sum(record.get(key, 0) for record in records)
    cached = [record.get("cached_tokens") for record in records]
    total["cached_tokens"] = sum(cached) if cached and all(c is not None for c in cached) else None
    total["seconds"] = round(sum(record.get("seconds", 0.0) for record in records), 3)
    for key in ("failures", "fallbacks"):
        counter: Counter = Counter()
        for record in records:
            counter.update(record.get(key, {}))
        total[key] = dict(counter)
    judged = total["judged"]
    total["calls_per_rollout"] = round(total["calls"] / judged, 3) if judged else 0.0
    total["requests_per_rollout"] = round(total["requests"] / judged, 3) if judged else 0.0
    tokens = total["prompt_tokens"] + total["completion_tokens"]
    total["tokens_per_rollout"] = round(tokens / judged, 1) if judged else 0.0
    if records:
        total["mode"] = records[-1].get("mode")
        total["authors_calls_per_rollout"] = records[-1].get("authors_calls_per_rollout")
    return total


def agreement(first: StepResult, second: StepResult) -> dict:
    """How far two instruments agree on the same rollouts (e.g. per-dimension vs joint):
    per dimension, on H and on the reward, the rank correlation (Spearman) and the mean
    absolute difference, over the rollouts both judged."""
    from personaemp.instruments.judges import spearman

    if len(first.rows) != len(second.rows):
        raise InputError(f"{len(first.rows)} rollouts against {len(second.rows)}: not the same batch")
    pairs = [
        (a, b) for a, b in zip(first.rows, second.rows, strict=True) if a["status"] == b["status"] == "judged"
    ]
    pick = {d: (lambda row, d=d: row["scores"][d]) for d in DIMENSIONS}
    pick["harmonic"] = lambda row: row["harmonic"]
    pick["reward"] = lambda row: row["reward"]
    found: dict[str, Any] = {"rollouts": len(pairs)}
    for name, value in pick.items():
        a, b = [value(x) for x, _ in pairs], [value(y) for _, y in pairs]
        rho = spearman(a, b)
        found[name] = {
            "spearman": None if rho is None else round(rho, 4),
            "mean_abs_diff": round(statistics.fmean(abs(x - y) for x, y in zip(a, b, strict=True)), 4)
            if pairs
            else None,
        }
    return found


def summarise_log(path: Path | str) -> dict:
    """`summarise` over a reward log (JSONL, one line per step)."""
    path = Path(path)
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(
            f"{path}: cannot read the reward log ({exc.strerror or type(exc).__name__})"
        ) from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as exc:
            raise InputError(f"{path}:{number}: not a JSON line ({exc})") from None
    return summarise(records)
