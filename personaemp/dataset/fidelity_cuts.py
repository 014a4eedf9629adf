"""Fidelity's cuts, no LLM: where a user's real next message is held out, what the
simulator may see before it (the conversation, the voice, the memories whose evidence lies
before the cut), and the `self` and `other` controls beside it (dataset/fidelity.py)."""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from personaemp.errors import InputError
from personaemp.instruments.voice import pick_voice

TURN_TEXT = 600  # characters of one earlier turn in the conversation shown
DIALOGUE_TEXT = 4000  # characters of the conversation shown (its newest turns)
REPLY_TEXT = 2000  # characters of the assistant's latest reply


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _fragments(part: str) -> list[str]:
    """An evidence quote's pieces: annotators elide with '...' or '…'."""
    return [piece for piece in (_norm(p) for p in re.split(r"\.\.\.|…", part)) if piece]


def _cites(part: str, text: str) -> bool:
    pieces = _fragments(part)
    return bool(pieces) and all(piece in text for piece in pieces)


def split_memories(memories: Sequence[dict], before: Sequence[str], after: Sequence[str]):
    """(kept, withheld, unplaced): a memory is kept when every part of its evidence (parts
    joined by ' | ') is found in a message of `before` and none in a message of `after` (the
    held-out message and everything later); one found only from the cut on is withheld, one
    whose evidence is found nowhere (or missing) is withheld as unplaced."""
    before = [_norm(t) for t in before]
    after = [_norm(t) for t in after]
    kept, withheld, unplaced = [], 0, 0
    for memory in memories:
        evidence = memory.get("evidence_text") or ""
        parts = [p for p in evidence.split(" | ") if _fragments(p)]
        if not parts:
            unplaced += 1
            continue
        late = any(_cites(p, t) for p in parts for t in after)
        early = all(any(_cites(p, t) for t in before) for p in parts)
        if late:
            withheld += 1
        elif not early:
            unplaced += 1
        else:
            kept.append(memory)
    return kept, withheld, unplaced


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def conversation_text(turns: Sequence[dict]) -> str:
    """The conversation before the assistant's latest reply, newest turns within DIALOGUE_TEXT."""
    lines, size = [], 0
    for turn in reversed(turns):
        line = f"{'User' if turn['role'] == 'user' else 'Assistant'}: {_clip(turn['text'], TURN_TEXT)}"
        if size + len(line) > DIALOGUE_TEXT:
            lines.append("(earlier turns left out)")
            break
        lines.append(line)
        size += len(line)
    return "\n\n".join(reversed(lines)) or "(nothing: the reply above answered the first message)"


@dataclass
class Skipped:
    """Users and cuts left out, by reason (the report's `skipped`)."""

    counts: Counter = field(default_factory=Counter)

    def add(self, reason: str, n: int = 1) -> None:
        self.counts[reason] += n


def _candidates(turns: Sequence[dict]) -> list[int]:
    """Positions of user messages that follow an assistant reply in the same session."""
    return [
        i for i in range(1, len(turns))
        if turns[i]["role"] == "user" and turns[i - 1]["role"] == "assistant"
        and turns[i].get("session_id") == turns[i - 1].get("session_id")
        and turns[i]["text"].strip()
    ]  # fmt: skip


def _stops_after(turns: Sequence[dict], i: int) -> bool:
    """The user sent nothing more in this session after turn i."""
    session = turns[i].get("session_id")
    return not any(t["role"] == "user" and t.get("session_id") == session for t in turns[i + 1 :])


def _position(turns: Sequence[dict], i: int) -> int:
    """The assistant replies before turn i in its session (1: after the first reply)."""
    session = turns[i].get("session_id")
    return sum(t["role"] == "assistant" and t.get("session_id") == session for t in turns[:i])


def make_cuts(
    rows: Sequence[dict], *, cuts: int | None, seed: int, voice: int, skipped: Skipped
) -> list[dict]:
    """The units: one per cut, with everything the prompts may see (from before the cut) and,
    apart, what is measured (the real message, the controls)."""
    units: list[dict] = []
    users_with_replies = 0
    for row in rows:
        turns = [dict(t) for t in row.get("turns") or []]
        if row.get("eligible") is False:
            skipped.add("users turned away by infer-persona's depth check")
            continue
        if not any(t["role"] == "assistant" for t in turns):
            skipped.add("users without assistant turns (no session to cut)")
            continue
        users_with_replies += 1
        own = [i for i, t in enumerate(turns) if t["role"] == "user" and t["text"].strip()]
        if len(own) < 2:
            skipped.add("users with a single message (no self control)")
            continue
        places = _candidates(turns)
        if not places:
            skipped.add("users with no message after an assistant reply")
            continue
        if cuts is None:
            chosen = [places[-1]]
        else:
            chosen = sorted(random.Random(f"{seed}:{row['user_id']}").sample(places, min(cuts, len(places))))
        for i in chosen:
            units.append(_unit(row, turns, own, places, i, voice))
    if rows and not users_with_replies:
        raise InputError(
            "no user of the input has an assistant turn: fidelity cuts real sessions (a user message "
            "after an assistant reply)",
            "re-run `personaemp filter --turns all` (it keeps the assistant's turns) and pass its output",
        )
    _pick_others(units, seed, skipped)
    return units


def _unit(row: dict, turns: list[dict], own: list[int], places: list[int], i: int, voice: int) -> dict:
    session = turns[i].get("session_id")
    shown = [t for t in turns[:i] if t.get("session_id") == session]
    before = [turns[j]["text"] for j in own if j < i]
    after = [turns[j]["text"] for j in own if j >= i]
    kept, withheld, unplaced = split_memories(row.get("memories") or [], before, after)
    others = [j for j in places if j != i] or [j for j in own if j != i]
    mine = min(others, key=lambda j: (abs(j - i), j))  # the nearest other real message
    pre_turns = [
        {k: t[k] for k in ("role", "text", "session_id", "index") if k in t}
        for t in turns[:i] if t["role"] == "user"
    ]  # fmt: skip
    return {
        "cut_id": f"{row['user_id']}-t{i}",
        "user_id": row["user_id"],
        "language": row.get("language"),
        "position": _position(turns, i),
        "dialogue": conversation_text(shown[:-1]),
        "reply": _clip(shown[-1]["text"], REPLY_TEXT),
        "voice": pick_voice(before, voice),
        "persona_source": {  # the user as infer-persona sees them, cut: what precedes the cut
            "user_id": row["user_id"],
            "source": row.get("source") or {"format": "fidelity", "path": ""},
            "language": row.get("language"),
            "turns": pre_turns,
            "memories": kept,
        },  # fmt: skip
        "memories": kept,
        "memories_withheld": withheld,
        "memories_unplaced": unplaced,
        # measured, never shown (the discriminator excepted: it must see the candidates)
        "real": turns[i]["text"],
        "real_stops": _stops_after(turns, i),
        "self": turns[mine]["text"],
        "self_stops": _stops_after(turns, mine),
    }


def _pick_others(units: list[dict], seed: int, skipped: Skipped) -> None:
    """Each cut's `other` control: another user's held-out message in the same language, at the
    nearest position (ties broken by the seed)."""
    rng = random.Random(seed)
    by_language = defaultdict(list)
    for unit in units:
        by_language[unit["language"]].append(unit)
    for unit in units:
        pool = [u for u in by_language[unit["language"]] if u["user_id"] != unit["user_id"]]
        if not pool:
            unit["other"], unit["other_stops"], unit["other_user"] = None, None, None
            skipped.add("cuts without an `other` control (no other user in their language)")
            continue
        nearest = min(abs(u["position"] - unit["position"]) for u in pool)
        choice = rng.choice(sorted((u for u in pool if abs(u["position"] - unit["position"]) == nearest),
                                   key=lambda u: u["cut_id"]))  # fmt: skip
        unit["other"], unit["other_stops"], unit["other_user"] = (
            choice["real"],
            choice["real_stops"],
            choice["user_id"],
        )
