"""Turn AlpsBench shapes (sessions, memory items, intents) into `records.User` parts.

Every reader calls these, so all formats produce the same records and the same errors.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
from pydantic import ValidationError

from personaemp.errors import RowError, first_problem
from personaemp.language import user_language, user_languages
from personaemp.records import FilterMatch, Intent, Memory, Source, Turn, User


def _fail(location: str, message: str) -> RowError:
    return RowError(location, message)


def _expect(value: Any, kind: type, what: str, location: str) -> Any:
    if not isinstance(value, kind):
        raise _fail(location, f"{what} must be a {kind.__name__}, got {type(value).__name__}")
    return value


# (role, text, session_id, utterance index). Turns are checked and made into Turn records
# only for the users the filter keeps: most users are dropped on their memories alone.
# The text may still be undecoded JSON (msgspec.Raw): assistant turns are mostly not needed.
RawTurn = tuple[str, "str | msgspec.Raw", str | None, int | None]
LANGUAGE_CACHE = 200_000  # users' languages remembered by their turns' digest (16 bytes each)
_LANGUAGES: dict[bytes, str | None] = {}
_STRINGS = msgspec.json.Decoder(list[str])


def _remember(key: bytes, language: str | None) -> None:
    if len(_LANGUAGES) >= LANGUAGE_CACHE:
        _LANGUAGES.clear()
    _LANGUAGES[key] = language


def unseen_languages(users: list[SourceUser]) -> tuple[dict[bytes, list[SourceUser]], list[list[str]]]:
    """Set the language of users whose history was decided before; the others grouped by
    history, with each history's own texts (for `user_languages`, here or in a worker). Users
    whose turns do not decode are left to the `language` property, which raises their error."""
    todo: dict[bytes, list[SourceUser]] = {}
    for user in users:
        if "language" in user.__dict__ or user._language or user._user_texts is None:
            continue
        key = user._history_key()
        if key in _LANGUAGES:
            user.__dict__["language"] = _LANGUAGES[key]
        else:
            todo.setdefault(key, []).append(user)
    return todo, [same[0]._user_texts for same in todo.values()]


def settle_languages(todo: dict[bytes, list[SourceUser]], found: list[str | None]) -> None:
    """Give each history's users the language found for it, and remember it."""
    for (key, same), language in zip(todo.items(), found, strict=True):
        _remember(key, language)
        for user in same:
            user.__dict__["language"] = language


def decide_languages(users: list[SourceUser]) -> None:
    """Set the language of users whose turns decode, their unseen histories decided together
    (user_languages: one pass of the model for all)."""
    todo, histories = unseen_languages(users)
    # From the users' own words: not what they paste to translate, quote or debug.
    settle_languages(todo, user_languages(histories))


def lazy_turns(sessions: Any, dialogue: Any, location: str) -> Callable[[], list[RawTurn]]:
    """Check the container now (cheap), return a function that reads the turns later."""
    if sessions:
        _expect(sessions, list, "sessions", location)
        return functools.partial(turns_from_sessions, sessions, location)
    if dialogue is not None:
        _expect(dialogue, list, "dialogue", location)
        return functools.partial(turns_from_dialogue, dialogue, location)
    raise _fail(location, "missing required field 'sessions' (or 'dialogue')")


def turns_from_sessions(sessions: Any, location: str) -> list[RawTurn]:
    """Flatten every session's turns in order (AlpsBench `sessions[].turns[]`)."""
    turns = []
    for session in _expect(sessions, list, "sessions", location):
        _expect(session, dict, "each session", location)
        session_id = session.get("session_id")
        session_id = str(session_id) if session_id is not None else None
        for position, turn in enumerate(_expect(session.get("turns"), list, "turns", location)):
            # The hot loop of reading large inputs: checks inlined.
            if type(turn) is not dict:
                raise _fail(location, f"each turn must be a dict, got {type(turn).__name__}")
            role, text = turn.get("role"), turn.get("text")
            if type(role) is not str or type(text) is not str:
                raise _fail(location, "a turn needs a string 'role' and 'text'")
            index = turn.get("utterance_index", position)
            turns.append((role, text, session_id, index if type(index) is int else None))
    return turns


def turns_from_dialogue(dialogue: Any, location: str) -> list[RawTurn]:
    return [
        _turn(_expect(turn, dict, "each dialogue turn", location), location, None, position)
        for position, turn in enumerate(_expect(dialogue, list, "dialogue", location))
    ]


def _turn(turn: dict, location: str, session_id: str | None, index: Any) -> RawTurn:
    role, text = turn.get("role"), turn.get("text", turn.get("content"))
    if not isinstance(role, str) or not isinstance(text, str):
        raise _fail(location, "a turn needs a string 'role' and 'text'")
    return role, text, session_id, index if isinstance(index, int) else None


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
            raise _fail(location, f"memory {memory_id}: {first_problem(exc)}") from None
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


class SourceUser:
    """A user as a reader yields it: ids and memories parsed, turns and language on demand.

    Most users are dropped by the filter on their memories alone, so building their turn
    records (and guessing their language) would be wasted work on large inputs.
    """

    def __init__(
        self,
        *,
        user_id: Any,
        location: str,
        source: Source,
        memories: list[Memory],
        intents: list[Intent],
        load_turns: Callable[[], list[RawTurn]],
        language: str | None = None,
    ):
        self.user_id = str(user_id)
        self.location = location  # "file:line" of the row, for error messages
        self.source = source
        self.memories = memories
        self.intents = intents
        self._load_turns = load_turns
        self._language = language

    @functools.cached_property
    def _raw_turns(self) -> list[RawTurn]:
        return self._load_turns()  # raises RowError on a malformed turn

    @functools.cached_property
    def turns(self) -> list[Turn]:
        return [Turn.model_validate(turn) for turn in self._turn_dicts(None)]

    def _text(self, text: str | msgspec.Raw) -> str:
        if isinstance(text, str):
            return text
        try:
            text = msgspec.json.decode(text)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise RowError(self.location, f"dialogue text is not valid UTF-8 ({exc})") from None
        if not isinstance(text, str):
            raise RowError(self.location, "a turn needs a string 'role' and 'text'")
        return text

    @functools.cached_property
    def _user_literals(self) -> bytes | None:
        """The user's turns as one JSON array of their undecoded string literals (None when
        the reader decoded them already): one digest and one decode instead of one per turn."""
        texts = [text for role, text, _, _ in self._raw_turns if role == "user"]
        if not all(isinstance(text, msgspec.Raw) for text in texts):
            return None
        return b"[" + b",".join(texts) + b"]"

    @functools.cached_property
    def _user_texts(self) -> list[str] | None:
        """The user's turns decoded at once; None when one is not valid (the turn-by-turn
        path then raises its error where it did before, naming it)."""
        if self._user_literals is None:
            texts = [text for role, text, _, _ in self._raw_turns if role == "user"]
            return texts if all(isinstance(text, str) for text in texts) else None
        try:
            return _STRINGS.decode(self._user_literals)
        except (msgspec.DecodeError, UnicodeDecodeError):
            return None

    def _turn_dicts(self, roles: tuple[str, ...] | None) -> list[dict]:
        texts = self._user_texts
        decoded = iter(texts) if texts is not None else None
        return [
            {
                "role": r,
                "text": next(decoded) if decoded is not None and r == "user" else self._text(t),
                "session_id": s,
                "index": i,
            }
            for r, t, s, i in self._raw_turns
            if roles is None or r in roles
        ]

    def _history_key(self) -> bytes:
        """The key of the user's turns in the language cache: a digest of their raw bytes (no
        JSON decoding), so a repeated history (a copied session, a replicated benchmark
        input) is decided once. A miss costs a hash of the turns, about a microsecond per KB."""
        digest = hashlib.blake2b(digest_size=16)
        if self._user_literals is not None:
            # String literals are self-delimiting: the array alone is a key no other history shares.
            digest.update(b"r")
            digest.update(self._user_literals)
        else:
            for role, text, _, _ in self._raw_turns:
                if role == "user":
                    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
                    # The kind and the length first: no two histories share a key.
                    digest.update((b"s" if isinstance(text, str) else b"b") + len(data).to_bytes(8, "big"))
                    digest.update(data)
        return digest.digest()

    def _own_turns(self) -> Iterable[str]:
        texts = self._user_texts
        if texts is None:  # decoded one by one, as far as own_words reads: a bad one raises here
            return (self._text(text) for role, text, _, _ in self._raw_turns if role == "user")
        return texts

    @functools.cached_property
    def language(self) -> str | None:
        if self._language:
            return self._language
        key = self._history_key()
        if key not in _LANGUAGES:
            _remember(key, user_language(self._own_turns()))
        return _LANGUAGES[key]

    def to_user(
        self,
        memories: list[Memory],
        match: FilterMatch,
        roles: tuple[str, ...] | None,
        turns: list[dict] | None = None,
    ) -> User:
        """The output record: given memories, turns of the given roles (None: all; `turns`:
        what `_turn_dicts(roles)` gave already)."""
        # Turns as plain dicts: pydantic builds them far faster than Turn(...) calls would.
        return User.model_validate(
            {
                "user_id": self.user_id,
                "source": self.source,
                "language": self.language,
                "turns": self._turn_dicts(roles) if turns is None else turns,
                "memories": memories,
                "intents": self.intents,
                "filter": match,
            }
        )
