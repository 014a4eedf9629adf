"""Deterministic checks on generated queries and personas (the LLM judge's checks are in
instruments/query_check.py)."""

from __future__ import annotations

import functools
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


def length_ok(text: str, least: int = MIN_CHARS, most: int = MAX_CHARS) -> tuple[bool, str]:
    size = len(text.strip())
    if size < least:
        return False, f"{size} characters, fewer than {least}"
    if size > most:
        return False, f"{size} characters, more than {most}"
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
# words is a copy. Chosen on the shipped sample: bench/dataset/copy_bench.py prints the distribution
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


@functools.lru_cache(maxsize=2048)
def _source_grams(source: str, size: int) -> frozenset[tuple[str, ...]]:
    # a source recurs (the simulator's prompt text, a dialogue's earlier turns on every turn)
    return frozenset(_grams(tokens(source), size))


def longest_shared(text: str, sources: Sequence[str], floor: int = 1) -> tuple[str, ...]:
    """The longest run of `text`'s tokens found, in order and contiguous, in one of `sources`
    (empty when none is `floor` tokens long: one pass over the sources settles most queries)."""
    query = tokens(text)
    owned = [source for source in sources if source]

    def shared(size: int) -> tuple[str, ...] | None:
        wanted = _grams(query, size)
        for source in owned:
            found = wanted & _source_grams(source, size)
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


# --- no_scaffolding: no text of our own prompts in what a user would send ---------------------

# A placeholder left unfilled ({name}, {…}) or a template slot ($name).
_PLACEHOLDER = re.compile(r"\{\s*(?:[A-Za-z_]\w*|…|\.\.\.)?\s*\}|\$[a-z_]+\b")


def scaffolding(text: str, markers: Sequence[str], labels: Sequence[str] = ()) -> tuple[bool, str]:
    """The text holds none of `markers` (anywhere, any case), no `labels` line (a label our
    prompts put above a block, at the start of a line) and no unfilled placeholder."""
    lowered = " ".join(text.split()).lower()
    found = [marker for marker in markers if " ".join(marker.split()).lower() in lowered]
    found += [label for label in labels if re.search(rf"^\s*{re.escape(label)}", text, re.MULTILINE)]
    if not found and (placeholder := _PLACEHOLDER.search(text)):
        found = [placeholder.group()]
    if found:
        return False, f"holds the text of our prompts: {found[0]!r}"
    return True, ""


# --- no_internal_ids: no id of ours in text a user sees ---------------------------------------

# A run of 12+ lowercase hex digits with letters and digits in it: a block key
# (`profile-964dce135dad7fe3`), a session (`sess_0016d4107292`), a hash. All-digit runs
# (phone numbers, dates) and words are not ids.
_HEX_ID = re.compile(
    r"(?<![0-9A-Za-z])[\w-]*?(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{12,}(?![0-9A-Za-z])"
)
_ASCII_WORD = "0-9A-Za-z_"


def _known_id(identifier: str) -> re.Pattern[str] | None:
    """A pattern finding one of the user's own ids (a memory id `m12`, the user id, a session)
    as a word of its own; ids without both a letter and a digit (`alice`, `92129`) are left
    out: they are names and numbers too."""
    if not (re.search(r"[A-Za-z]", identifier) and re.search(r"\d", identifier)):
        return None
    # "45 m2", "3 m3": a number before a short id makes it a unit
    unit = r"(?<!\d)(?<!\d )" if len(identifier) <= 4 else ""
    return re.compile(rf"(?<![{_ASCII_WORD}]){unit}{re.escape(identifier)}(?![{_ASCII_WORD}])")


def internal_ids(text: str, known: Sequence[str] = ()) -> tuple[bool, str]:
    """The text names no internal id: none of `known` (the user's memory, session and user
    ids) and no hex id of 12+ digits (block keys, hashes)."""
    found = _HEX_ID.search(text)
    if found:
        return False, f"names an internal id: {found.group()!r}"
    for identifier in dict.fromkeys(known):
        pattern = _known_id(identifier)
        if pattern and pattern.search(text):
            return False, f"names an internal id: {identifier!r}"
    return True, ""


# --- level_matches_rationale: a Big Five rationale states no other level for its trait ---------

# How a rationale names a trait (its noun, its adjective; English and Chinese, the languages
# the sample's users write) and a level. Only a level word tied to the trait's own name
# counts: "high standards" or "high neuroticism" in the openness rationale say nothing of it.
_TRAIT_WORDS = {
    "openness": ("openness", "open", "开放性"),
    "conscientiousness": ("conscientiousness", "conscientious", "尽责性", "责任心", "严谨性"),
    "extraversion": ("extraversion", "extroversion", "extraverted", "extroverted", "外向性"),
    "agreeableness": ("agreeableness", "agreeable", "宜人性", "亲和性"),
    "neuroticism": ("neuroticism", "neurotic", "神经质"),
}
_LEVEL_WORDS = {
    "low": ("low", "lowly"),
    "medium": ("medium", "moderate", "moderately", "average", "middling", "mid"),
    "high": ("high", "highly"),
}
_ZH_LEVEL_WORDS = {"low": ("低",), "medium": ("中等", "适中", "一般"), "high": ("高",)}
# "medium-high", "low to moderate", "moderate-to-high": between two levels, so neither.
_NOT_BETWEEN_BEFORE = r"(?<![-–/])(?<!\bto )"
_NOT_BETWEEN_AFTER = r"(?!\s*(?:[-–/]|to\b))"
_NEGATED = re.compile(r"\b(?:not|never|neither|nor|isn't|wasn't|no)\s+(?:\w+\s+)?$", re.IGNORECASE)


def _words(items: Sequence[str]) -> str:
    return "|".join(re.escape(item) for item in sorted(items, key=len, reverse=True))


def _level_patterns(trait: str) -> list[tuple[re.Pattern[str], dict[str, str]]]:
    """Patterns whose `level` group is a level word said of `trait`, with the level each word
    stands for."""
    english = [w for w in _TRAIT_WORDS[trait] if w.isascii()]
    chinese = [w for w in _TRAIT_WORDS[trait] if not w.isascii()]
    level = rf"{_NOT_BETWEEN_BEFORE}\b(?P<level>{_words(w for ws in _LEVEL_WORDS.values() for w in ws)})\b"
    level += _NOT_BETWEEN_AFTER
    name = rf"\b(?:{_words(english)})\b"
    hedge = r"(?:(?:quite|fairly|rather|relatively|likely|probably|very|somewhat|generally)\s+)?"
    english_forms = [
        # "a high level of openness", "low in agreeableness", "highly open", "high openness"
        rf"{level}\s+(?:(?:level|degree|score|amount)s?\s+(?:of|in|on)\s+|(?:in|on)\s+)?{name}",
        # "openness is high", "Openness: moderate", "neuroticism appears low", "openness level is medium"
        rf"{name}(?:\s+(?:level|score))?\s*(?:is|was|seems|appears|looks|remains|stays|rated|:|=|—|-)\s*"
        rf"(?:(?:at|as)\s+)?(?:an?\s+)?{hedge}{level}",
    ]
    zh_level = _words(w for ws in _ZH_LEVEL_WORDS.values() for w in ws)
    zh_name = _words(chinese)
    chinese_forms = [
        # 开放性较高, 神经质水平中等, 宜人性属于低
        rf"(?:{zh_name})(?:水平|程度|得分)?(?:是|为|属于|处于|偏|较|很|比较|相对)*(?P<level>{zh_level})",
        # 高开放性, 较低的宜人性 (not 提高开放性: raising it)
        rf"(?<![提升降])(?P<level>{zh_level})(?:的)?(?:{zh_name})",
    ]
    english_meaning = {w: lv for lv, ws in _LEVEL_WORDS.items() for w in ws}
    chinese_meaning = {w: lv for lv, ws in _ZH_LEVEL_WORDS.items() for w in ws}
    return [(re.compile(form, re.IGNORECASE), english_meaning) for form in english_forms] + [
        (re.compile(form), chinese_meaning) for form in chinese_forms if chinese
    ]


_PATTERNS = {trait: _level_patterns(trait) for trait in _TRAIT_WORDS}


def stated_levels(trait: str, rationale: str) -> list[tuple[str, str]]:
    """(level, the words that state it) for each level the rationale states for `trait`."""
    found = []
    for pattern, meaning in _PATTERNS[trait]:
        for match in pattern.finditer(rationale):
            if not _NEGATED.search(rationale[: match.start()]):
                found.append((meaning[match.group("level").lower()], match.group().strip()))
    return found


def level_matches_rationale(trait: str, level: str, rationale: str) -> tuple[bool, str]:
    """The rationale states no level for its trait other than `level` ("medium" beside "a
    high level of openness" fails; a rationale naming no level passes)."""
    for stated, words in stated_levels(trait, rationale):
        if stated != level:
            return False, f"the rationale says {words!r}, the level is {level}"
    return True, ""


def user_ids(user) -> list[str]:
    """The ids a `User` row carries (its own, its sessions', its memories'): none may reach
    text a user sees."""
    ids = [user.user_id, user.source.benchmark_id, *(turn.session_id for turn in user.turns)]
    ids += [memory.memory_id for memory in user.memories]
    return [i for i in dict.fromkeys(ids) if i]
