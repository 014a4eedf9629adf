"""The simulated user's rules that need no LLM, checked on every turn it writes (gen-dialogues,
and the training Interaction after it). Each rule: (passed, why not).

The simulator must stay a person: write in the user's language, at a chat message's length,
keep its hidden need to itself (a long stretch of it copied into the message gives it away),
never state its emotion as a number or a score unless the supporter asked for one, not leave
after the supporter's first reply, say its need is met only when the reply did not hurt, and
write its own words: no long stretch of the supporter's last reply, of its own earlier turns
or of the prompt's text, and none of the prompt's frames. Staying in character and inventing
no facts are judged by an LLM (the in_character step of build/dialogues.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from personaemp import checks

RULES = (
    "language_match", "length_ok", "no_need_leak", "no_emotion_number", "no_early_end", "need_met_consistent",
    "no_echo", "no_scaffolding",
)  # fmt: skip
JUDGED = ("in_character", "grounded")  # the LLM check's verdicts, recorded beside the rules
# What each check holds, in words (a card or a page says them from here).
DESCRIPTIONS = {
    "language_match": "the user's language",
    "length_ok": "a chat message's length",
    "no_need_leak": "no six words in a row of the hidden need",
    "no_emotion_number": "no emotion stated as a number or score, unless the supporter asked for one",
    "no_early_end": "no leaving after the first reply",
    "need_met_consistent": "no need met while the emotion falls",
    "no_echo": "no eight words in a row of the supporter's last reply, its own turns or its prompt",
    "no_scaffolding": "no text of our prompts' frames",
    "in_character": "reads as this person (LLM check)",
    "grounded": "no fact beyond the memories and the conversation (LLM check)",
}

MIN_CHARS, MAX_CHARS = 2, 800  # a chat message: "ok" is one, a page is not
# Words of the hidden need repeated in a row that give it away; names and short phrases may
# recur ("my sister", "the exam"). Unspaced scripts count a character as half a word.
LEAK_WORDS = 6
# Words in a row shared with the supporter's last reply, the user's own earlier turns or the
# prompt's text that make a turn an echo, not a reply: a person quotes a phrase back ("you
# said 'take a break'"), a looping simulator repeats whole sentences. As many as not_copied's.
ECHO_WORDS = checks.COPY_WORDS

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


# The supporter asks for a number: "on a scale of 1 to 10", "from 0-10", "out of 10", "1到10分".
_ASKED_RANGE = re.compile(
    r"(?:scale|rate|rating|score|number|grade|打分|评分|几分|多少分)\D{0,30}?(\d{1,3})\s*(?:-|–|to|through|到|至)\s*(\d{1,3})"
    r"|\bout of (\d{1,3})\b|(\d{1,3})\s*(?:-|–|to|到|至)\s*(\d{1,3})\s*(?:scale|分)",
    re.IGNORECASE,
)


def asked_scale(reply: str) -> int | None:
    """The top of the number scale the supporter's `reply` asks the user for (None: it asks none)."""
    found = _ASKED_RANGE.search(reply)
    if not found:
        return None
    return max(int(value) for value in found.groups() if value)


def no_emotion_number(text: str, supporter_reply: str = "") -> tuple[bool, str]:
    """No emotion stated as a number or score, unless the supporter's last reply asked for one
    on a scale: then a number on that scale is an answer ("maybe a 4 out of 10"); one above it
    (the simulator's own 0-100) still gives the inner state away."""
    top = asked_scale(supporter_reply)
    for found in _EMOTION_NUMBER.finditer(text):
        numbers = [float(n.replace(",", ".")) for n in re.findall(_NUMBER, found.group())]
        if top is None or any(n > top for n in numbers):
            return False, f"states its emotion as a number or score: {found.group()!r}"
    return True, ""


def no_early_end(ends: bool, supporter_turn: int) -> tuple[bool, str]:
    """A person does not leave after the first reply: the simulator may end from turn 2 on."""
    if ends and supporter_turn <= 1:
        return False, "ends the conversation after the supporter's first reply"
    return True, ""


def need_met_consistent(need_met: bool, change: int) -> tuple[bool, str]:
    """A reply that met the need did not also hurt: need met while the emotion falls is a
    contradiction (Met % would count a refusal that cost -10 as a success)."""
    if need_met and change < 0:
        return False, f"says its need is met while its emotion falls ({change:+d})"
    return True, ""


def need_met_at(turns) -> int | None:
    """The supporter turn after which the need was first met, counting a user turn that says
    so only when it keeps need_met_consistent (Met %: one that breaks it is not met)."""
    number = 0
    for turn in turns:
        number += turn.role == "assistant"
        said = turn.role == "user" and number and turn.need_met
        if said and need_met_consistent(True, turn.change or 0)[0]:
            return number
    return None


def no_echo(text: str, sources: dict[str, Sequence[str]]) -> tuple[bool, str]:
    """The message repeats no ECHO_WORDS words in a row of any of `sources` (what -> texts:
    the supporter's last reply, the user's own earlier turns, the prompt's text)."""
    for what, texts in sources.items():
        run = checks.longest_shared(text, texts, floor=ECHO_WORDS)
        size = checks.words(run)
        if size >= ECHO_WORDS:
            shown = " ".join(run)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            return False, f"repeats {size:g} words of {what}: {shown!r}"
    return True, ""


@dataclass(frozen=True)
class TurnContext:
    """What a simulated message is checked against besides itself."""

    language: str | None
    hidden_need: str
    supporter_turn: int  # the supporter's replies so far
    supporter_reply: str = ""  # the one it answers
    earlier: tuple[str, ...] = ()  # the user's own earlier turns
    frames: tuple[str, ...] = ()  # the simulator prompt's own text (between its slots)
    markers: tuple[str, ...] = ()  # no_scaffolding's: text of our prompts found anywhere
    labels: tuple[str, ...] = ()  # ... and at the start of a line


def check_turn(text: str, *, ends: bool, need_met: bool, change: int, context: TurnContext
               ) -> dict[str, tuple[bool, str]]:  # fmt: skip
    """Every rule on one simulated message (RULES order)."""
    return {
        "language_match": checks.language_match(text, context.language),
        "length_ok": checks.length_ok(text, MIN_CHARS, MAX_CHARS),
        "no_need_leak": no_need_leak(text, context.hidden_need),
        "no_emotion_number": no_emotion_number(text, context.supporter_reply),
        "no_early_end": no_early_end(ends, context.supporter_turn),
        "need_met_consistent": need_met_consistent(need_met, change),
        "no_echo": no_echo(
            text,
            {
                "the supporter's last reply": [context.supporter_reply],
                "its own earlier turns": list(context.earlier),
                "the simulator's prompt": list(context.frames),
            },
        ),
        "no_scaffolding": checks.scaffolding(text, context.markers, context.labels),
    }
