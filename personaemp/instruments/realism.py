"""How a message is written, measured without a model: the one place where each style metric's
rule is declared (`METRICS`), for `personaemp fidelity` (a simulated next message against the
real one, docs/fidelity.md) and for the realism of a dialogues file's simulated users (its
card and `table`).

A metric reads one message and gives a value (a number, a bool, a language code) or None
when the rule cannot be applied: no token in the message (a script the tokenizer does not
split, emoji only), no marker list for its language, no letter with a case. Two messages are
compared per metric by `agreement`: 1 - |a - b| for a bool (1 when both or neither), |a - b|
for a number (a distance: 0 is the same), equality for a language. None on either side: the
pair is not counted (each figure carries its own n).

Figures over many messages: `mean_ci` (the mean with a 95% percentile bootstrap interval,
BOOTSTRAP resamples, seeded), `wasserstein` (Wasserstein-1 distance between two samples'
empirical distributions: for a bool, the difference of the two shares), `wilson` (a
proportion's 95% Wilson score interval) and `variation` (the coefficient of variation).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from personaemp import checks

MATTR_WINDOW = 25  # tokens per window of the moving-average type-token ratio
BOOTSTRAP = 1000  # resamples of a bootstrap interval
SEED = 0

# Marker lists per language (lower case; a CJK marker matches as a substring, the others as
# whole words). A language without a list gives None for these metrics (counted, not guessed).
POLITE = {
    "en": ("please", "pls", "plz", "could you", "would you", "can you please", "kindly", "sorry"),
    "zh": ("请", "麻烦", "能不能", "可以帮", "拜托", "不好意思", "劳驾"),
    "ru": ("пожалуйста", "будьте добры", "не могли бы", "извините", "прошу"),
    "es": ("por favor", "podrías", "podria", "podría", "disculpa", "perdón"),
    "de": ("bitte", "könnten sie", "könntest du", "entschuldigung"),
    "fr": ("s'il vous plaît", "s'il te plaît", "svp", "pourriez-vous", "pourrais-tu", "excusez"),
}
GRATITUDE = {
    "en": ("thanks", "thank you", "thx", "ty", "appreciate", "grateful", "cheers"),
    "zh": ("谢谢", "感谢", "多谢", "谢了", "谢啦"),
    "ru": ("спасибо", "благодарю", "благодарен", "благодарна", "спс"),
    "es": ("gracias", "agradezco", "agradecido", "agradecida"),
    "de": ("danke", "dankeschön", "vielen dank"),
    "fr": ("merci", "remercie"),
}
FIRST_PERSON = {
    "en": ("i", "me", "my", "mine", "myself", "im", "i'm", "i've", "i'd", "i'll", "we", "us", "our"),
    "zh": ("我", "咱"),
    "ru": ("я", "меня", "мне", "мной", "мой", "моя", "моё", "мои", "моего", "моей", "мы", "нас", "нам"),
    "es": ("yo", "me", "mi", "mis", "mío", "mía", "conmigo", "nosotros", "nos", "nuestro"),
    "de": ("ich", "mich", "mir", "mein", "meine", "meinen", "wir", "uns", "unser"),
    "fr": ("je", "j", "moi", "me", "m", "mon", "ma", "mes", "nous", "notre", "nos"),
}
_QUESTION = re.compile(r"[?？¿؟]")
_MARKDOWN = re.compile(
    r"```|`[^`\n]+`|^\s{0,3}#{1,6}\s|^\s*[-*+]\s+\S|^\s*\d+[.)]\s+\S|\*\*[^*\n]+\*\*|^\s*>\s|\|.*\|.*\|",
    re.MULTILINE,
)
_CODE = re.compile(
    r"[{};]\s*$|^\s*(?:def|class|import|from|public|function|return|#include)\b|=>|==|!=|\w\(\)", re.MULTILINE
)
_FINAL = re.compile(r"[.!?。！？…؟]$")
_CASED = re.compile(r"[^\W\d_]")


def _words_of(text: str) -> list[str]:
    return checks.tokens(text)


def word_count(text: str) -> float | None:
    """Words (a CJK, kana or Thai character counts half, as everywhere in the toolkit)."""
    items = _words_of(text)
    return checks.words(items) if items else None


def log_length(text: str) -> float | None:
    """ln(1 + words): compared as a distance, it is the log-length distance."""
    words = word_count(text)
    return math.log1p(words) if words is not None else None


def mattr(text: str, window: int = MATTR_WINDOW) -> float | None:
    """Moving-average type-token ratio over windows of `window` tokens (a shorter message: its
    type-token ratio)."""
    items = _words_of(text)
    if not items:
        return None
    if len(items) <= window:
        return len(set(items)) / len(items)
    ratios = [len(set(items[i : i + window])) / window for i in range(len(items) - window + 1)]
    return sum(ratios) / len(ratios)


def _has_marker(text: str, language: str | None, markers: dict[str, tuple[str, ...]]) -> bool | None:
    words = markers.get(language or "")
    if words is None:
        return None
    lowered = " ".join(text.lower().split())
    for marker in words:
        if re.search(r"[\u3400-\u9fff]", marker):
            if marker in lowered:
                return True
        elif re.search(rf"(?<!\w){re.escape(marker)}(?!\w)", lowered):
            return True
    return False


def first_person_rate(text: str, language: str | None) -> float | None:
    """First-person pronouns per token (the language's list)."""
    words = FIRST_PERSON.get(language or "")
    items = _words_of(text)
    if words is None or not items:
        return None
    return sum(item in words for item in items) / len(items)


def lower_start(text: str) -> bool | None:
    """The first letter is lower case (None: no letter with a case)."""
    first = next((c for c in text if _CASED.match(c) and c.lower() != c.upper()), None)
    return None if first is None else first.islower()


def final_punctuation(text: str) -> bool | None:
    stripped = text.rstrip()
    return bool(_FINAL.search(stripped)) if stripped else None


def code_or_markdown(text: str) -> bool:
    return bool(_MARKDOWN.search(text) or _CODE.search(text))


def message_language(text: str) -> str | None:
    from personaemp.language import detect_language  # (loads its model when first asked)

    return detect_language(text)


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # "number" (compared as |a - b|, lower is closer), "bool" (match share), "label" (equal)
    rule: str  # the rule, as docs/fidelity.md states it
    read: Callable[[str, str | None], Any]  # (message, the user's language) -> value or None


METRICS: tuple[Metric, ...] = (
    Metric("log_length", "number", "ln(1 + words), a CJK character half a word; distance |a - b|",
           lambda text, language: log_length(text)),
    Metric("language", "label", "the detected language of the message; match: the same code",
           lambda text, language: message_language(text)),
    Metric("mattr", "number", f"moving-average type-token ratio, windows of {MATTR_WINDOW} tokens",
           lambda text, language: mattr(text)),
    Metric("question", "bool", "holds a question mark (? ？ ¿ ؟)",
           lambda text, language: bool(_QUESTION.search(text))),
    Metric("code_markdown", "bool", "holds code or markdown (fences, inline code, headings, lists, bold, "
           "tables, code-like lines)", lambda text, language: code_or_markdown(text)),
    Metric("politeness", "bool", "holds a politeness marker of its language's list (please, 请, пожалуйста…)",
           lambda text, language: _has_marker(text, language, POLITE)),
    Metric("gratitude", "bool", "holds a gratitude marker of its language's list (thanks, 谢谢, спасибо…)",
           lambda text, language: _has_marker(text, language, GRATITUDE)),
    Metric("first_person", "number", "first-person pronouns per token (its language's list)",
           first_person_rate),
    Metric("lower_start", "bool", "its first cased letter is lower case",
           lambda text, language: lower_start(text)),
    Metric("final_punctuation", "bool", "ends with . ! ? 。！？… or ؟",
           lambda text, language: final_punctuation(text)),
)  # fmt: skip
BY_NAME = {metric.name: metric for metric in METRICS}
ENDING = "ending"  # the real user's stop (their last message of the session) against the simulator's `end`


def features(text: str, language: str | None) -> dict[str, Any]:
    """Every metric of one message."""
    return {metric.name: metric.read(text, language) for metric in METRICS}


def agreement(kind: str, a: Any, b: Any) -> float | None:
    """How two values of one metric compare (see the module's docstring); None: not comparable."""
    if a is None or b is None:
        return None
    if kind == "number":
        return abs(float(a) - float(b))
    return 1.0 if a == b else 0.0


def compare(real: dict[str, Any], other: dict[str, Any]) -> dict[str, float | None]:
    return {
        metric.name: agreement(metric.kind, real.get(metric.name), other.get(metric.name))
        for metric in METRICS
    }


# --- figures over many ------------------------------------------------------------------------------


def mean_ci(values: Sequence[float], resamples: int = BOOTSTRAP, seed: int = SEED) -> dict[str, Any]:
    """{mean, low, high, n}: the mean and its 95% percentile bootstrap interval (None when empty)."""
    values = [float(v) for v in values if v is not None]
    n = len(values)
    if not n:
        return {"mean": None, "low": None, "high": None, "n": 0}
    mean = sum(values) / n
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    low, high = means[int(0.025 * resamples)], means[min(resamples - 1, int(0.975 * resamples))]
    return {"mean": mean, "low": low, "high": high, "n": n}


def wasserstein(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Wasserstein-1 distance between the empirical distributions of `a` and `b`."""
    a = sorted(float(v) for v in a if v is not None)
    b = sorted(float(v) for v in b if v is not None)
    if not a or not b:
        return None
    points = sorted(set(a) | set(b))
    total, i, j = 0.0, 0, 0
    for left, right in zip(points, points[1:], strict=False):
        while i < len(a) and a[i] <= left:
            i += 1
        while j < len(b) and b[j] <= left:
            j += 1
        total += abs(i / len(a) - j / len(b)) * (right - left)
    return total


def wilson(successes: int, n: int, z: float = 1.96) -> dict[str, Any]:
    """{share, low, high, n}: a proportion with its Wilson score interval."""
    if n == 0:
        return {"share": None, "low": None, "high": None, "n": 0}
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return {"share": p, "low": max(0.0, centre - half), "high": min(1.0, centre + half), "n": n}


def variation(values: Sequence[float]) -> float | None:
    """The coefficient of variation (population standard deviation / mean)."""
    values = [float(v) for v in values if v is not None]
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    if mean == 0:
        return None
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) / mean


def numeric(value: Any) -> float | None:
    """A metric's value as a number for a distribution (a bool: 0/1; a label: None)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


# --- how real a dialogues file's simulated users are ------------------------------------------------

RELIEF_TURN = 2  # "need met by supporter turn 2": the speed of relief


def _turn_fields(turn: Any) -> dict[str, Any]:
    return turn if isinstance(turn, dict) else turn.model_dump(mode="json")


def seeker_realism(dialogues: Sequence[Any], real: dict[str, Sequence[str]]) -> dict[str, Any]:
    """The simulated user turns of `dialogues` (Dialogue records or their rows; the opening
    query is the generated one, left out) against the same users' real messages (`real`:
    user id -> their own messages): words per message and its ratio, politeness and question
    rates, uniformity (the coefficient of variation across users of their mean length), and
    the speed of relief: the share of dialogues whose need is met by supporter turn
    RELIEF_TURN, and the mean emotion change per simulated turn. Each with its n."""
    simulated: dict[str, list[str]] = {}
    changes, relieved, dialogues_n = [], 0, 0
    for dialogue in dialogues:
        row = _turn_fields(dialogue)
        dialogues_n += 1
        met = row.get("need_met_at_turn")
        relieved += met is not None and met <= RELIEF_TURN
        for turn in row["turns"][1:]:
            if turn["role"] != "user":
                continue
            simulated.setdefault(row["user_id"], []).append(turn["text"])
            if turn.get("change") is not None:
                changes.append(turn["change"])
    users = [u for u in simulated if real.get(u)]
    languages = {}
    for dialogue in dialogues:
        row = _turn_fields(dialogue)
        languages[row["user_id"]] = row.get("language")

    def side(texts_of: dict[str, Sequence[str]]) -> dict[str, Any]:
        texts = [(u, t) for u in users for t in texts_of[u]]
        words = [w for _, t in texts if (w := word_count(t)) is not None]
        polite = [p for u, t in texts if (p := _has_marker(t, languages.get(u), POLITE)) is not None]
        means = []
        for u in users:
            counts = [w for t in texts_of[u] if (w := word_count(t)) is not None]
            if counts:
                means.append(sum(counts) / len(counts))
        return {
            "messages": len(texts),
            "words": sum(words) / len(words) if words else None,
            "politeness": sum(polite) / len(polite) if polite else None,
            "question_rate": sum(bool(_QUESTION.search(t)) for _, t in texts) / len(texts) if texts else None,
            "length_cv_across_users": variation(means),
        }

    sim, own = side(simulated), side({u: list(real[u]) for u in users})
    ratio = sim["words"] / own["words"] if sim["words"] and own["words"] else None
    return {
        "users": len(users),
        "dialogues": dialogues_n,
        "simulated": sim,
        "real": own,
        "length_ratio": ratio,
        "relief_by_turn_2": relieved / dialogues_n if dialogues_n else None,
        "mean_change_per_turn": sum(changes) / len(changes) if changes else None,
        "turns_with_change": len(changes),
        "rule": f"simulated user turns (the opening query left out) against the same users' real messages; "
        f"relief: need met by supporter turn {RELIEF_TURN}",
    }
