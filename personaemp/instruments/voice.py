"""The person's voice: which of a user's own real messages the simulated user is shown as
"How they write" (gen-dialogues, the training Interaction, fidelity). One declared rule,
`VOICE_RULE`, with one switch, K (`--voice K`; 0: none shown).

The rule ("recent-distinct"): walk the user's messages from the newest back; skip one that
is empty, mostly code or pasted text (more than PASTED characters), or nearly the same as
one already taken (character 3-gram Jaccard similarity at least checks.DUPLICATE_SIMILARITY);
take each kept message trimmed to VOICE_TEXT characters; stop at K messages. Shown oldest
first. Fidelity passes only the messages from before its cut, so the block never holds the
message the simulator must write.
"""

from __future__ import annotations

from collections.abc import Sequence

from personaemp import checks
from personaemp.instruments.realism import code_or_markdown

VOICE = 5  # messages shown by default
VOICE_TEXT = 200  # characters kept of each
PASTED = 1500  # a message longer than this was pasted (an essay, a log), not typed
VOICE_RULE = (
    f"recent-distinct: the K newest of the user's own messages, skipping code or markdown, pasted ones "
    f"(over {PASTED} characters) and near-duplicates (3-gram Jaccard >= {checks.DUPLICATE_SIMILARITY}), "
    f"each trimmed to {VOICE_TEXT} characters, shown oldest first"
)


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= VOICE_TEXT else text[: VOICE_TEXT - 1] + "…"


def pick_voice(messages: Sequence[str], k: int = VOICE) -> list[str]:
    """The voice of a user whose own messages, oldest first, are `messages` (VOICE_RULE)."""
    if k <= 0:
        return []
    taken: list[str] = []
    for text in reversed(messages):
        if not text.strip() or len(text) > PASTED or code_or_markdown(text):
            continue
        if any(checks.similarity(text, other) >= checks.DUPLICATE_SIMILARITY for other in taken):
            continue
        taken.append(text)
        if len(taken) == k:
            break
    return [_clip(text) for text in reversed(taken)]


def render_voice(voice: Sequence[str]) -> str:
    return "\n".join(f"- {text}" for text in voice)
