"""How a user's memories and turns are written into prompts, bounded, the same for
every step that shows them."""

from __future__ import annotations

from collections.abc import Sequence

from personaemp.records import (
    Memory,
    User,
)

MEMORY_TEXT = 240  # characters of a memory's value kept in a prompt


EVIDENCE_TEXT = 160  # characters of its evidence quote


TURN_TEXT = 300  # characters per user turn in the style window


TURN_WINDOW = 1200  # characters of user turns in all


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_memories(memories: Sequence[Memory]) -> str:
    lines = []
    for memory in memories:
        label = (
            memory.label_suggestion
            if memory.label == "UNMAPPED" and memory.label_suggestion
            else memory.label
        )
        line = f"[{memory.memory_id}] {label}: {_clip(memory.value, MEMORY_TEXT)}"
        if memory.evidence_text:
            line += f' (user said: "{_clip(memory.evidence_text, EVIDENCE_TEXT)}")'
        lines.append(line)
    return "\n".join(lines)


def render_turns(user: User) -> str:
    """The user's latest turns, newest last, within TURN_WINDOW characters."""
    picked, size = [], 0
    for turn in reversed([t for t in user.turns if t.role == "user"]):
        text = _clip(turn.text, TURN_TEXT)
        if size + len(text) > TURN_WINDOW:
            break
        picked.append(f"- {text}")
        size += len(text)
    return "\n".join(reversed(picked)) or "(none)"
