"""The language guesser personaemp had before py3langid (writing system, then common words).

Kept only for bench/dataset/language_bench.py to measure against; the toolkit does not use it.
"""

from __future__ import annotations

import re
from collections import Counter

_SCRIPTS = [
    ("ko", re.compile(r"[\uac00-\ud7af]")),
    ("ja", re.compile(r"[\u3040-\u30ff]")),
    ("zh", re.compile(r"[\u4e00-\u9fff]")),
    ("ru", re.compile(r"[\u0400-\u04ff]")),
    ("ar", re.compile(r"[\u0600-\u06ff]")),
    ("el", re.compile(r"[\u0370-\u03ff]")),
    ("he", re.compile(r"[\u0590-\u05ff]")),
    ("th", re.compile(r"[\u0e00-\u0e7f]")),
    ("hi", re.compile(r"[\u0900-\u097f]")),
]
_SCRIPT_SAMPLE = 300  # characters: plenty to tell a writing system
_LETTER = re.compile(r"[^\W\d_]", re.UNICODE)
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)

_COMMON_WORDS = {
    "en": "the and you is are to of it that this with for have what my not can how i me was",
    "es": "el la de que y en los es por para una con las del lo como pero más mi qué",
    "pt": "o a de que e do da em um para é com não uma os no na você meu mais",
    "fr": "le la les de et est un une des je que pour pas vous dans ce il qui mon",
    "de": "der die und ist ich das nicht ein zu es den mit sie mir ich auf für was",
    "it": "il di che e la per un non sono è mi una con del ho come ma questo",
    "nl": "de het een en van ik is dat niet je op te zijn voor met wat",
    "tr": "ve bir bu da de için ne ben çok mi ile gibi var olan",
    "id": "yang dan di ini itu dengan untuk tidak saya ada ke dari apa bisa",
    "vi": "và của là có không tôi một các cho được này những người với",
    "pl": "i w nie się na że to jest z do co jak mi ale",
}
# word -> languages it is common in, so scoring is one dictionary look-up per word.
_WORD_LANGUAGES: dict[str, list[str]] = {}
for _lang, _words in _COMMON_WORDS.items():
    for _word in _words.split():
        _WORD_LANGUAGES.setdefault(_word, []).append(_lang)


def detect_language(text: str) -> str | None:
    """Return an ISO 639-1 code, or None when the text gives too little to go on."""
    head = text[:_SCRIPT_SAMPLE]
    letters = len(_LETTER.findall(head))
    if letters < 3:
        return None
    if not text.isascii():
        counts = Counter({lang: len(pattern.findall(head)) for lang, pattern in _SCRIPTS})
        lang, hits = counts.most_common(1)[0]
        if hits >= 0.3 * letters:
            # Japanese text is mostly Han characters; any kana decides it.
            return "ja" if lang == "zh" and counts["ja"] else lang
    scores: Counter[str] = Counter()
    for word, count in Counter(_WORD.findall(text.lower())).items():
        for lang in _WORD_LANGUAGES.get(word, ()):
            scores[lang] += count
    if not scores:
        return None
    return max(sorted(scores), key=lambda lang: (scores[lang], lang == "en"))
