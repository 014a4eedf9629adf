"""Pydantic models for the rows every stage writes (the contract between stages)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    # Later stages extend a row with new fields; reading it back must keep working.
    model_config = ConfigDict(extra="ignore")


class Turn(Record):
    role: str
    text: str
    session_id: str | None = None
    index: int | None = None


class Memory(Record):
    memory_id: str
    label: str
    label_suggestion: str | None = None
    value: str
    evidence_text: str | None = None
    type: str | None = None
    confidence: float | None = None
    emotion: str | None = None


class Intent(Record):
    category: str
    subtype: str | None = None


class Source(Record):
    format: str
    path: str
    benchmark_id: str | None = None
    line_index: int | None = None


class FilterMatch(Record):
    matched_rules: list[str]
    matched_memory_ids: list[str]
    flagged_memories_dropped: int = 0


class User(Record):
    """One user as the filter writes it: memories never include annotator-flagged ones."""

    user_id: str
    source: Source
    language: str | None = None
    turns: list[Turn]
    memories: list[Memory]
    intents: list[Intent] = []
    filter: FilterMatch | None = None
