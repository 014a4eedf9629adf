"""Extracted memories against AlpsBench's gold (`extract-memories --compare-gold`).

Matching rule: an extracted memory matches a gold memory of the same user when
  1. they cite the same message: the gold evidence's (session_id, utterance_index) — one of
     them when it lists several — or, when the gold has no index, the gold quote is part of
     the message the extracted memory cites;
  2. their label families agree: the first part of the label path (Social_Relationships,
     Preferences, ...); an UNMAPPED memory's family is the one its label_suggestion starts
     with when that is a family of the taxonomy, else UNMAPPED;
  3. their values overlap: the F1 of their word tokens (each CJK character one token) is at
     least `threshold` (default 0.3).
Pairs are matched one to one, the highest overlap first. Gold memories that annotators
flagged as false ([ERROR: ...] in the value, the filter's rule) are left out of the gold.
Precision = matched / extracted, recall = matched / gold, F1 their harmonic mean; overall and
per label family. `any_label` gives the same figures with rule 2 left out.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from personaemp.dataset.taxonomy import label_family
from personaemp.errors import InputError
from personaemp.io import ErrorPolicy, atomic_output, iter_jsonl, write_json_atomic

_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]|[^\W_]+", re.UNICODE)


def tokens(text: str) -> Counter:
    return Counter(_TOKEN.findall((text or "").casefold()))


def value_overlap(a: str, b: str) -> float:
    """Token F1 of two values (1.0 for equal values)."""
    left, right = tokens(a), tokens(b)
    common = sum((left & right).values())
    if not common:
        return 0.0
    precision, recall = common / sum(left.values()), common / sum(right.values())
    return 2 * precision * recall / (precision + recall)


def _squash(text: Any) -> str:
    if isinstance(text, list):
        text = " ".join(str(part) for part in text)
    return " ".join(str(text or "").split()).casefold()


def _refs(evidence: Any) -> set[tuple[str, int]]:
    if not isinstance(evidence, dict):
        return set()
    index = evidence.get("utterance_index")
    indices = index if isinstance(index, list) else [index]
    session = str(evidence.get("session_id"))
    return {(session, i) for i in indices if isinstance(i, int)}


def _same_message(extracted: dict, gold: dict, turn_text: str) -> bool:
    gold_refs = _refs(gold.get("evidence"))
    if gold_refs:
        return bool(gold_refs & _refs(extracted.get("evidence")))
    evidence = gold.get("evidence")
    quote = _squash(evidence.get("text") if isinstance(evidence, dict) else evidence)
    return bool(quote) and quote in (turn_text or _squash((extracted.get("evidence") or {}).get("text")))


def _family(memory: dict) -> str:
    return label_family(memory.get("label"), memory.get("label_suggestion"))


def match_memories(
    extracted: list[dict], gold: list[dict], turns: dict[tuple[str, int], str], threshold: float, labels: bool
) -> list[tuple[int, int]]:
    """(extracted index, gold index) pairs, one to one, the highest value overlap first."""
    candidates = []
    for i, mine in enumerate(extracted):
        refs = sorted(_refs(mine.get("evidence")))
        turn_text = _squash(turns.get(refs[0], "")) if refs else ""
        for j, theirs in enumerate(gold):
            if labels and _family(mine) != _family(theirs):
                continue
            if not _same_message(mine, theirs, turn_text):
                continue
            score = value_overlap(mine.get("value") or "", theirs.get("value") or "")
            if score >= threshold:
                candidates.append((-score, i, j))
    pairs, used_mine, used_gold = [], set(), set()
    for _, i, j in sorted(candidates):
        if i not in used_mine and j not in used_gold:
            pairs.append((i, j))
            used_mine.add(i)
            used_gold.add(j)
    return pairs


def _figures(matched: int, extracted: int, gold: int) -> dict[str, float | int]:
    precision = matched / extracted if extracted else 0.0
    recall = matched / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "extracted": extracted, "gold": gold, "matched": matched,
        "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4),
    }  # fmt: skip


def read_gold(path: Path) -> dict[str, list[dict]]:
    """benchmark_id -> its gold memory items (reference_output.jsonl)."""
    if path.is_dir():
        path = path / "reference_output.jsonl"
    gold = {}
    for lineno, _, row in iter_jsonl(path, ErrorPolicy("fail")):
        items = (row.get("gold") or {}).get("memory_items") if isinstance(row, dict) else None
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("benchmark_id"), str)
            or not isinstance(items, list)
        ):
            raise InputError(
                f"{path}:{lineno}: not a reference_output row (benchmark_id, gold.memory_items)",
                "give --compare-gold AlpsBench's task1 reference_output.jsonl",
            )
        gold[row["benchmark_id"]] = [item for item in items if isinstance(item, dict)]
    return gold


def compare_with_gold(
    output: Path, gold_path: Path, threshold: float = 0.3, wanted: set[str] | None = None
) -> dict[str, Any]:
    """The comparison's figures (see the module's rule) over the users of `output` that the
    gold has; users of the gold without a row are counted, their memories not."""
    from personaemp.rules import load_rules

    flagged = re.compile(load_rules().memories.flagged_value_pattern)
    gold = read_gold(gold_path)
    totals = {True: Counter(), False: Counter()}
    by_family: dict[str, Counter] = {}
    users = flagged_out = 0
    seen = set()
    for _, _, row in iter_jsonl(output, ErrorPolicy("fail")):
        key = row.get("benchmark_id") or row.get("user_id")
        if key not in gold or (wanted is not None and str(row.get("user_id")) not in wanted):
            continue
        seen.add(key)
        users += 1
        truth = [m for m in gold[key] if not flagged.search(str(m.get("value") or ""))]
        flagged_out += len(gold[key]) - len(truth)
        extracted = row.get("memory_items") or []
        turns = {
            (str(session.get("session_id")), turn.get("utterance_index")): turn.get("text") or ""
            for session in row.get("sessions") or []
            for turn in session.get("turns") or []
        }
        for labels in (True, False):
            pairs = match_memories(extracted, truth, turns, threshold, labels)
            totals[labels].update(matched=len(pairs), extracted=len(extracted), gold=len(truth))
            if labels:
                for memory in extracted:
                    by_family.setdefault(_family(memory), Counter())["extracted"] += 1
                for memory in truth:
                    by_family.setdefault(_family(memory), Counter())["gold"] += 1
                for _, j in pairs:
                    by_family[_family(truth[j])]["matched"] += 1
    if not users:
        raise InputError(
            f"{gold_path}: no benchmark_id in common with {output}",
            "compare the output of extract-memories on the same AlpsBench task1 folder",
        )
    return {
        "rule": {
            "same_message": True,
            "same_label_family": True,
            "value_overlap": "token F1",
            "threshold": threshold,
            "flagged_gold_excluded": True,
        },  # fmt: skip
        "users_compared": users,
        "gold_users_without_a_row": len(gold) - len(seen),
        "flagged_gold_memories_excluded": flagged_out,
        "overall": _figures(totals[True]["matched"], totals[True]["extracted"], totals[True]["gold"]),
        "any_label": _figures(totals[False]["matched"], totals[False]["extracted"], totals[False]["gold"]),
        "by_family": {
            family: _figures(counts["matched"], counts["extracted"], counts["gold"])
            for family, counts in sorted(by_family.items())
        },
    }


def write_comparison(figures: dict[str, Any], path: Path) -> None:
    write_json_atomic(path, figures)


def write_predictions(output: Path, path: Path, gold_path: Path | None = None) -> int:
    """The extracted memories as AlpsBench's task1 scorer for memory systems reads them: one
    record per session with `memory_items` (and `ground_truth_memories` when the gold is
    given). Returns the records written."""
    import msgspec

    gold = read_gold(gold_path) if gold_path is not None else {}
    written = 0
    with atomic_output(path) as out:
        for _, _, row in iter_jsonl(output, ErrorPolicy("fail")):
            key = row.get("benchmark_id") or row.get("user_id")
            record = {
                "benchmark_id": key,
                "session_id": next((s.get("session_id") for s in row.get("sessions") or []), None),
                "memory_items": [
                    {
                        "memory_id": m["memory_id"],
                        "type": m.get("type"),
                        "label": m.get("label"),
                        "label_suggestion": m.get("label_suggestion"),
                        "value": m.get("value"),
                        "confidence": m.get("confidence"),
                        "evidence": m.get("evidence"),
                        "evidence_text": (m.get("evidence") or {}).get("text"),
                    }  # fmt: skip
                    for m in row.get("memory_items") or []
                ],
            }
            if key in gold:
                record["ground_truth_memories"] = gold[key]
            out.write(msgspec.json.encode(record) + b"\n")
            written += 1
    return written
