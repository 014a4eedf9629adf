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


# --- not_copied: the query is not the user's own words ---------------------------------------

# A query may share names and short phrases with what the user wrote; a stretch of this many
# words is a copy. Chosen on the shipped sample: bench/copy_bench.py prints the distribution
# of honest and planted queries, docs/not_copied.md explains the choice.
COPY_WORDS = 8
# ... and a short query that is mostly a stretch of theirs (at least COPY_SHORT words and
# COPY_SHARE of the query) is one too: "thanks, that helps a lot" copied whole is 5 words.
COPY_SHORT, COPY_SHARE = 4, 0.6
# Scripts written without spaces are cut into single characters; a Chinese word is about
# two of them, so a character counts as half a word.
_UNSPACED = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u0e00-\u0e7f"
_TOKEN = re.compile(f"[{_UNSPACED}]|[^\\W_{_UNSPACED}]+")
_CHARACTER = re.compile(f"[{_UNSPACED}]")


def tokens(text: str) -> list[str]:
    """Lower-cased words; a CJK, kana or Thai character is a token of its own."""
    return _TOKEN.findall(text.lower())


def words(items: Sequence[str]) -> float:
    """How many words `items` (tokens) make: a character of an unspaced script is half a word."""
    return sum(0.5 if _CHARACTER.fullmatch(item) else 1 for item in items)


def _grams(items: Sequence[str], size: int) -> set[tuple[str, ...]]:
    return {tuple(items[i : i + size]) for i in range(len(items) - size + 1)}


def longest_shared(text: str, sources: Sequence[str], floor: int = 1) -> tuple[str, ...]:
    """The longest run of `text`'s tokens found, in order and contiguous, in one of `sources`
    (empty when none is `floor` tokens long: one pass over the sources settles most queries)."""
    query = tokens(text)
    owned = [items for items in (tokens(source) for source in sources) if items]

    def shared(size: int) -> tuple[str, ...] | None:
        wanted = _grams(query, size)
        for items in owned:
            found = wanted & _grams(items, size)
            if found:
                return min(found)
        return None

    # if a run of n tokens is shared, so is every shorter one: binary search on n
    if floor > 1 and not shared(floor):
        return ()
    low, high, best = 0, len(query), ()
    while low < high:
        middle = (low + high + 1) // 2
        run = shared(middle)
        if run:
            low, best = middle, run
        else:
            high = middle - 1
    return best


def copied(shared: float, length: float) -> bool:
    """A stretch of `shared` words in a query of `length` words makes it a copy."""
    return shared >= COPY_WORDS or (shared >= COPY_SHORT and shared >= COPY_SHARE * length)


def not_copied(text: str, sources: Sequence[str]) -> tuple[bool, str]:
    """The query repeats no long stretch of the user's own turns or memories (`copied`)."""
    run = longest_shared(text, sources, floor=COPY_SHORT)  # fewer tokens are fewer words
    size = words(run)
    if copied(size, words(tokens(text))):
        shown = " ".join(run)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return False, f"repeats {size:g} words of the user's own text: {shown!r}"
    return True, ""
