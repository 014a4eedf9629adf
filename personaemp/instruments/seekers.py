"""Seeker styles: how hard a simulated user is to help (gen-dialogues --seeker, the training
Interaction's `seeker`).

A style is declared once, in prompts/seekers.md: a few lines added to the simulator's own
requests (the hidden need, each turn, the in-character check), so the hidden need, the rules
and the checks stay what they are. `cooperative` adds nothing: its requests are the
simulator's own, byte for byte. The lines a person reads are in their language where the
file has them (English otherwise); the checker's line is in English, as the checker's task.

Each style may add one deterministic rule (STYLE_RULES, recorded in a turn's checks as
`seeker_style`): a turn that breaks it is asked again like any other rule. What only a
reader can tell (a resistant user who suddenly agrees) goes to the in-character check.

`auto` picks a style per user from their Big Five levels by AUTO_TABLE (first match wins);
the dialogues card shows that table.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from personaemp import checks
from personaemp.vocabulary import SEEKER_CHOICES, SEEKERS

AUTO = "auto"
CHOICES = SEEKER_CHOICES  # what --seeker takes: a style, or auto
DEFAULT = "cooperative"
PROMPT_FILE = "seekers"  # prompts/seekers.md
RULE = "seeker_style"  # the style's own deterministic rule, in a turn's checks

# Big Five levels -> style, the first row whose levels all match wins; a user without levels
# is cooperative. A reading of the traits, not a finding: neuroticism high and agreeableness
# high want reassurance; neuroticism high alone escalates; low agreeableness argues; low
# extraversion keeps to itself.
AUTO_TABLE: tuple[tuple[dict[str, str], str], ...] = (
    ({"neuroticism": "high", "agreeableness": "high"}, "validation-seeking"),
    ({"neuroticism": "high"}, "escalating"),
    ({"agreeableness": "low"}, "resistant"),
    ({"extraversion": "low"}, "guarded"),
    ({}, "cooperative"),
)

# guarded: one thing at a time, briefly.
GUARDED_SENTENCES, GUARDED_CHARS = 2, 240
_SENTENCE_END = re.compile(r"[.!?。！？…]+[\"'”’)]*(?:\s+|$)")


def style_for(seeker: str, big_five: Mapping[str, str] | None) -> str:
    """The style a user plays: `seeker` itself, or under `auto` the AUTO_TABLE row their Big
    Five levels match."""
    if seeker != AUTO:
        return seeker
    if not big_five:
        return DEFAULT
    for levels, style in AUTO_TABLE:
        if all(big_five.get(trait) == level for trait, level in levels.items()):
            return style
    return DEFAULT


def auto_table_text() -> list[str]:
    """The AUTO_TABLE as lines (the card's and the docs' rendering)."""
    lines = []
    for levels, style in AUTO_TABLE:
        when = " and ".join(f"{trait} {level}" for trait, level in levels.items()) or "otherwise"
        lines.append(f"{when} -> {style}")
    return lines


# --- the style's text ------------------------------------------------------------------------------

_HEADING = re.compile(r"^## ([a-z-]+)\.(need|turn|check)(?: ([a-z]{2,3}))?\s*$", re.MULTILINE)


@dataclass(frozen=True)
class StyleText:
    texts: dict[tuple[str, str, str], str]  # (style, part, language or "") -> text
    hash: str

    def part(self, style: str, part: str, language: str | None = None) -> str:
        """The style's `part` in `language` when the file has it, else in English ("" when the
        style adds nothing there)."""
        return self.texts.get((style, part, language or ""), self.texts.get((style, part, ""), ""))


@functools.cache
def _load(folder: str | None) -> StyleText:
    from pathlib import Path

    from personaemp.prompts import _read, prompts_dir

    text = _read((Path(folder) if folder else prompts_dir()) / f"{PROMPT_FILE}.md")
    parts = _HEADING.split(text)
    texts = {}
    for i in range(1, len(parts) - 3, 4):
        style, part, language, body = parts[i], parts[i + 1], parts[i + 2] or "", parts[i + 3]
        if style not in SEEKERS:
            raise ValueError(f"prompts/{PROMPT_FILE}.md: no seeker style {style!r}")
        texts[(style, part, language)] = " ".join(body.split()) if not language else body.strip()
    return StyleText(texts, hashlib.sha256(text.encode()).hexdigest()[:12])


def style_text() -> StyleText:
    """prompts/seekers.md, read once per prompts folder ($PERSONAEMP_PROMPTS may name another)."""
    import os

    from personaemp.prompts import ENV_VAR

    return _load(os.environ.get(ENV_VAR) or None)


def with_style(messages: list[dict], addition: str, heading: str) -> list[dict]:
    """`messages` with the style's lines at the end of the last user turn (nothing added for
    a style that adds nothing there: the request is the simulator's own)."""
    if not addition:
        return messages
    last = messages[-1]
    return [*messages[:-1], {**last, "content": f"{last['content']}\n\n{heading}\n{addition}"}]


NEED_HEADING = "This person as a seeker:"
TURN_HEADING = "Your style in this chat (keep it every turn):"
CHECK_HEADING = "The person plays a hard-to-help seeker; a message out of this style is not in character:"


# --- the deterministic rule per style --------------------------------------------------------------


def sentences(text: str) -> int:
    return len([piece for piece in _SENTENCE_END.split(text.strip()) if piece.strip()])


def style_kept(style: str, text: str, *, need_met: bool, change: int) -> tuple[bool, str] | None:
    """The style's deterministic rule on one simulated turn; None: the style has none (its
    keeping is judged by the in-character check only)."""
    if style == "guarded":
        count, size = sentences(text), len(text.strip())
        if count > GUARDED_SENTENCES or size > GUARDED_CHARS:
            return False, (
                f"a guarded user writes at most {GUARDED_SENTENCES} sentences and {GUARDED_CHARS} "
                f"characters; this is {count} sentences, {size} characters"
            )
        return True, ""
    if style == "escalating":
        if change > 0 and not need_met:
            return False, f"an escalating user's emotion does not rise ({change:+d}) before its need is met"
        return True, ""
    return None


def words(text: str) -> float:
    """A text's length in words (an unspaced script's character is half a word)."""
    return checks.words(checks.tokens(text))
