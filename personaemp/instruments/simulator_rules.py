"""The simulated user's rules that need no LLM, checked on every turn it writes (gen-dialogues,
and the training Interaction after it). Each rule: (passed, why not).

The simulator must stay a person: write in the user's language, at a chat message's length,
keep its hidden need to itself (a long stretch of it copied into the message gives it away),
never state its emotion as a number or a score, and not leave after the supporter's first
reply; not echo the supporter's last reply, its own earlier messages or the prompt's
text; not say its need is met by a reply that lowered its emotion. Staying in character and
inventing no facts are judged by an LLM (the in_character step of dataset/dialogues.py).
"""

from __future__ import annotations

import re

from personaemp import checks

RULES = (
    "language_match", "length_ok", "no_need_leak", "no_emotion_number", "no_early_end", "no_echo",
    "need_met_consistent",
)  # fmt: skip
JUDGED = ("in_character", "grounded")  # the LLM check's verdicts, recorded beside the rules
# What each check asks, as the dataset card lists them (one entry per rule and verdict).
MEANINGS = {
    "language_match": "the user's language",
    "length_ok": "a chat message's length",
    "no_need_leak": "no six words in a row of the hidden need",
    "no_emotion_number": "no emotion stated as a number or score",
    "no_early_end": "no leaving after the first reply",
    "no_echo": "no six words in a row of the supporter's last reply, its own earlier messages or the prompt",
    "need_met_consistent": "no need met by a reply that lowered the emotion",
    "in_character": "reads as this person",
    "grounded": "no fact beyond the memories and the conversation",
}

MIN_CHARS, MAX_CHARS = 2, 800  # a chat message: "ok" is one, a page is not
# Words of the hidden need repeated in a row that give it away; names and short phrases may
# recur ("my sister", "the exam"). Unspaced scripts count a character as half a word.
LEAK_WORDS = 6

_NUMBER = r"\d{1,3}(?:[.,]\d+)?"
# An emotion given as a number or a score, as a simulated user leaking its inner state writes
# it: "my emotion score is 35", "I'm at 40/100", "mood: 7 out of 10", "情绪值 60".
_EMOTION_NUMBER = re.compile(
    "|".join(
        (
            r"\b(?:emotion|emotional|mood|feeling)s?\s+(?:score|level|value|rating|meter)\b",
            rf"\b{_NUMBER}\s*(?:/|out of)\s*(?:100|10)\b",
            rf"\b(?:emotion|mood)s?\b\W+(?:\w+\W+){{0,3}}{_NUMBER}\b",
            r"(?:情绪|情感|心情)(?:值|分数|评分|指数|得分)",
            r"(?:эмоци|настроени)\w*\s+(?:на\s+)?\d",
        )
    ),
    re.IGNORECASE,
)


def no_need_leak(text: str, hidden_need: str) -> tuple[bool, str]:
    """The message does not copy LEAK_WORDS words in a row of the hidden need."""
    run = checks.longest_shared(text, [hidden_need], floor=LEAK_WORDS)
    size = checks.words(run)
    if size >= LEAK_WORDS:
        return False, f"repeats {size:g} words of the hidden need: {' '.join(run)!r}"
    return True, ""


# The supporter asked for a rating ("on a scale of 1 to 10", "how would you rate it"): a number
# in the answer is the person answering, not the simulator leaking its state.
_ASKED_NUMBER = re.compile(
    r"\bscale\b|\b(?:rate|rating)\b|\bout of (?:5|10|100)\b|\b\d+\s*(?:-|to)\s*(?:5|10|100)\b|打分|评分|几分|"
    r"по шкале|оцени",
    re.IGNORECASE,
)


def no_emotion_number(text: str, asked: str = "") -> tuple[bool, str]:
    """No unprompted emotion score; `asked` is the supporter's last reply (a rating it asked
    for may be given)."""
    if asked and _ASKED_NUMBER.search(asked):
        return True, ""
    found = _EMOTION_NUMBER.search(text)
    if found:
        return False, f"states its emotion as a number or score: {found.group()!r}"
    return True, ""


def no_early_end(ends: bool, supporter_turn: int) -> tuple[bool, str]:
    """A person does not leave after the first reply: the simulator may end from turn 2 on."""
    if ends and supporter_turn <= 1:
        return False, "ends the conversation after the supporter's first reply"
    return True, ""


def no_echo(text: str, sources: dict[str, str]) -> tuple[bool, str]:
    """The message copies no LEAK_WORDS words in a row of any of `sources` (what -> its text:
    the supporter's last reply, its own earlier messages, the simulator prompt's text)."""
    for what, source in sources.items():
        run = checks.longest_shared(text, [source], floor=LEAK_WORDS)
        size = checks.words(run)
        if size >= LEAK_WORDS:
            return False, f"repeats {size:g} words of {what}: {' '.join(run)!r}"
    return True, ""


def need_met_consistent(need_met: bool, change: int) -> tuple[bool, str]:
    """A reply that met the hidden need does not lower the emotion."""
    if need_met and change < 0:
        return False, f"says the need is met by a reply that moved the emotion by {change}"
    return True, ""


def check_turn(
    text: str,
    *,
    language: str | None,
    hidden_need: str,
    ends: bool,
    supporter_turn: int,
    need_met: bool = False,
    change: int = 0,
    echoes: dict[str, str] | None = None,
) -> dict[str, tuple[bool, str]]:
    """Every rule on one simulated message (RULES order); `echoes`: what it must not repeat
    (the supporter's last reply first: a rating it asked for may be given)."""
    echoes = echoes or {}
    return {
        "language_match": checks.language_match(text, language),
        "length_ok": checks.length_ok(text, MIN_CHARS, MAX_CHARS),
        "no_need_leak": no_need_leak(text, hidden_need),
        "no_emotion_number": no_emotion_number(text, echoes.get(SUPPORTER, "")),
        "no_early_end": no_early_end(ends, supporter_turn),
        "no_echo": no_echo(text, echoes),
        "need_met_consistent": need_met_consistent(need_met, change),
    }


SUPPORTER = "the supporter's last reply"  # the echoes key of the reply answered
