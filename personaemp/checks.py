"""Deterministic checks on generated queries (the LLM judge's checks are in stages/queries.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from personaemp.language import detect_language

MIN_CHARS, MAX_CHARS = 15, 1000
DUPLICATE_SIMILARITY = 0.7  # Jaccard similarity of character 3-grams


def memory_ids_valid(cited: Sequence[str], known: set[str]) -> tuple[bool, str]:
    unknown = [i for i in cited if i not in known]
    if not cited:
        return False, "cites no memory"
    if unknown:
        return False, f"cites unknown memories {', '.join(unknown)}"
    return True, ""


def category_match(judged: str | None, intended: str) -> tuple[bool, str]:
    if judged == intended:
        return True, ""
    return False, f"written for {intended} but reads as {judged}"


def length_ok(text: str) -> tuple[bool, str]:
    size = len(text.strip())
    if size < MIN_CHARS:
        return False, f"{size} characters, fewer than {MIN_CHARS}"
    if size > MAX_CHARS:
        return False, f"{size} characters, more than {MAX_CHARS}"
    return True, ""


def language_match(text: str, user_language: str | None) -> tuple[bool, str]:
    """The query is in the user's language (unknown user language: nothing to compare)."""
    if not user_language:
        return True, ""
    found = detect_language(text)
    if found is None or found == user_language:
        return True, ""
    return False, f"written in {found}, the user writes {user_language}"


def _shingles(text: str) -> set[str]:
    text = re.sub(r"\W+", " ", text.lower()).strip()
    return {text[i : i + 3] for i in range(max(1, len(text) - 2))}


def similarity(a: str, b: str) -> float:
    left, right = _shingles(a), _shingles(b)
    return len(left & right) / len(left | right) if left | right else 1.0


def duplicates(texts: Sequence[str]) -> dict[int, int]:
    """index -> index of an earlier text it nearly repeats (character 3-gram Jaccard)."""
    found = {}
    for later in range(len(texts)):
        for earlier in range(later):
            if earlier not in found and similarity(texts[earlier], texts[later]) >= DUPLICATE_SIMILARITY:
                found[later] = earlier
                break
    return found
