"""Turn AlpsBench shapes (sessions, memory items, intents) into `records.User` parts.

Every reader calls these, so all formats produce the same records and the same errors.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from personaemp.errors import RowError
from personaemp.language import detect_language
from personaemp.records import Intent, Memory, Source, Turn, User


def _fail(location: str, message: str) -> RowError:
    return RowError(location, message)


def _expect(value: Any, kind: type, what: str, location: str) -> Any:
    if not isinstance(value, kind):
        raise _fail(location, f"{what} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def turns_from_sessions(sessions: Any, location: str) -> list[Turn]:
    """Flatten every session's turns in order (AlpsBench `sessions[].turns[]`)."""
    turns = []
    for session in _expect(sessions, list, "sessions", location):
        _expect(session, dict, "each session", location)
        session_id = session.get("session_id")
        for position, turn in enumerate(_expect(session.get("turns"), list, "turns", location)):
            _expect(turn, dict, "each turn", location)
            index = turn.get("utterance_index", position)
            turns.append(_turn(turn, location, session_id, index))
    return turns


def turns_from_dialogue(dialogue: Any, location: str) -> list[Turn]:
    return [
        _turn(_expect(turn, dict, "each dialogue turn", location), location, None, position)
        for position, turn in enumerate(_expect(dialogue, list, "dialogue", location))
    ]


def _turn(turn: dict, location: str, session_id: Any, index: Any) -> Turn:
    role, text = turn.get("role"), turn.get("text", turn.get("content"))
    if not isinstance(role, str) or not isinstance(text, str):
        raise _fail(location, "a turn needs a string 'role' and 'text'")
    # model_construct: fields are checked above; full validation of long turn lists is the
    # single biggest cost of reading large inputs.
    return Turn.model_construct(
        role=role,
        text=text,
        session_id=str(session_id) if session_id is not None else None,
        index=index if isinstance(index, int) else None,
    )


def memories_from_items(items: Any, location: str) -> list[Memory]:
    """Normalize memory items; ids are kept, or `m1`, `m2`, ... in source order if absent."""
    memories, seen = [], set()
    for position, item in enumerate(_expect(items, list, "memory_items", location), 1):
        _expect(item, dict, "each memory item", location)
        memory_id = item.get("memory_id") or f"m{position}"
        if not isinstance(memory_id, str):
            memory_id = str(memory_id)
        if memory_id in seen:
            raise _fail(location, f"memory id {memory_id!r} appears twice")
        seen.add(memory_id)
        evidence = item.get("evidence")
        evidence_text = evidence.get("text") if isinstance(evidence, dict) else evidence
        if isinstance(evidence_text, list):  # a few real rows cite several utterances
            evidence_text = " | ".join(str(part) for part in evidence_text)
        try:
            memories.append(
                Memory(
                    memory_id=memory_id,
                    label=item.get("label") or "UNMAPPED",
                    label_suggestion=item.get("label_suggestion"),
                    value=item.get("value"),
                    evidence_text=evidence_text,
                    type=item.get("type"),
                    confidence=item.get("confidence"),
                    emotion=item.get("emotion"),
                )
            )
        except ValidationError as exc:
            problem = exc.errors()[0]
            field = ".".join(str(part) for part in problem["loc"])
            raise _fail(location, f"memory {memory_id}: {field}: {problem['msg']}") from None
    return memories


def intents_from_ranked(items: Any, location: str) -> list[Intent]:
    """AlpsBench raw export `intents_ranked`: [{intent_category, intent_subtype}]."""
    if items is None:
        return []
    intents = []
    for item in _expect(items, list, "intents_ranked", location):
        _expect(item, dict, "each intent", location)
        category = item.get("intent_category", item.get("category"))
        subtype = item.get("intent_subtype", item.get("subtype"))
        if not isinstance(category, str) or not (subtype is None or isinstance(subtype, str)):
            raise _fail(location, "an intent needs a string intent_category")
        intents.append(Intent(category=category, subtype=subtype))
    return intents


def build_user(
    *,
    user_id: Any,
    source: Source,
    turns: list[Turn],
    memories: list[Memory],
    intents: list[Intent],
    language: Any = None,
) -> User:
    if language is None:
        language = detect_language(" ".join(t.text[:2000] for t in turns if t.role == "user"))
    return User.model_construct(
        user_id=str(user_id),
        source=source,
        language=language if isinstance(language, str) else None,
        turns=turns,
        memories=memories,
        intents=intents,
        filter=None,
    )
