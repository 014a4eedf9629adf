"""Filter rules: load the TOML rules file and match memories, intents and languages."""

from __future__ import annotations

import functools
import re
import tomllib
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from personaemp.errors import InputError, first_problem
from personaemp.records import Intent, Memory

DEFAULT_RULES = "default_rules.toml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryRules(_Section):
    flagged_value_pattern: str = r"\[ERROR:"
    min_memories: int = Field(1, ge=0)
    min_matched_memories: int = Field(1, ge=0)

    @field_validator("flagged_value_pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression ({exc})") from None
        return value


class KeywordRules(_Section):
    keywords: list[str] = []


class LabelRules(_Section):
    prefixes: list[str] = []


class LanguageRules(_Section):
    allow: list[str] = []


class Rules(_Section):
    memories: MemoryRules = MemoryRules()
    intents: KeywordRules = KeywordRules()
    labels: LabelRules = LabelRules()
    unmapped: KeywordRules = KeywordRules()
    language: LanguageRules = LanguageRules()


def default_rules_text() -> str:
    return resources.files("personaemp").joinpath(DEFAULT_RULES).read_text(encoding="utf-8")


def _parse_toml(text: str, name: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{name}: not valid TOML ({exc})") from None


def load_rules(path: Path | None = None) -> Rules:
    """The shipped defaults, overridden key by key by a user's rules file if given."""
    merged = _parse_toml(default_rules_text(), DEFAULT_RULES)
    name = DEFAULT_RULES
    if path is not None:
        name = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError(f"{path}: no such rules file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read the rules file ({exc})") from None
        for section, values in _parse_toml(text, name).items():
            if isinstance(values, dict) and isinstance(merged.get(section), dict):
                merged[section] = {**merged[section], **values}
            else:
                merged[section] = values
    try:
        return Rules.model_validate(merged)
    except ValidationError as exc:
        raise InputError(f"{name}: {first_problem(exc)}") from None


_NON_WORD = re.compile(r"[\W_]+")


def _words(text: str) -> str:
    """'Social_Relationships/Marital-Conflict' -> ' social relationships marital conflict '."""
    return f" {_NON_WORD.sub(' ', text.lower()).strip()} "


class KeywordMatcher:
    """Whole-word keyword search; returns the keyword that occurs first in the text."""

    def __init__(self, keywords: list[str]):
        self.keywords = keywords
        parts = []
        for number, keyword in enumerate(keywords):
            wildcard = keyword.endswith("*")
            words = _words(keyword.rstrip("*")).strip()
            if not words:
                continue
            pattern = re.escape(words).replace(r"\ ", " ") + (r"\w*" if wildcard else "")
            parts.append(f"(?P<k{number}> {pattern} )")
        self._pattern = re.compile("|".join(parts)) if parts else None

    def find(self, text: str | None) -> str | None:
        if not text or self._pattern is None:
            return None
        found = self._pattern.search(_words(text))
        return self.keywords[int(found.lastgroup[1:])] if found else None


class RuleSet:
    """Compiled rules, applied to one user at a time."""

    def __init__(self, rules: Rules):
        self.rules = rules
        self.flagged = re.compile(rules.memories.flagged_value_pattern)
        self.intent_keywords = KeywordMatcher(rules.intents.keywords)
        self.unmapped_keywords = KeywordMatcher(rules.unmapped.keywords)
        self.prefixes = [
            (prefix, [part.lower() for part in prefix.strip("/").split("/")])
            for prefix in rules.labels.prefixes
        ]
        self.languages = {code.lower() for code in rules.language.allow}

    def is_flagged(self, memory: Memory) -> bool:
        return bool(self.flagged.search(memory.value))

    def match_memory(self, memory: Memory) -> str | None:
        """The rule a memory matches: 'label:<prefix>' or 'unmapped:<keyword>'."""
        return self._match_label(memory.label, memory.label_suggestion)

    @functools.lru_cache(maxsize=1 << 16)  # noqa: B019 - one RuleSet per run; labels repeat a lot
    def _match_label(self, label: str, suggestion: str | None) -> str | None:
        if label.strip().upper() == "UNMAPPED":
            keyword = self.unmapped_keywords.find(suggestion)
            return f"unmapped:{keyword}" if keyword else None
        parts = [part.lower() for part in label.strip("/").split("/")]
        for prefix, wanted in self.prefixes:
            if parts[: len(wanted)] == wanted:
                return f"label:{prefix}"
        return None

    def match_intents(self, intents: list[Intent]) -> str | None:
        for intent in intents:
            for text in (intent.category, intent.subtype):
                keyword = self.intent_keywords.find(text)
                if keyword:
                    return f"intent:{keyword}"
        return None

    def language_allowed(self, user) -> bool:
        """Only looks at (so only guesses) the user's language when an allowlist is set."""
        return not self.languages or (user.language or "").lower() in self.languages
