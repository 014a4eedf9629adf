"""From the trainers' arguments to rollouts: a completion (text, TRL's conversational
messages, verl's numpy-typed extra_info) and its dataset row as the one `Rollout` the
reward judges."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from personaemp.errors import InputError


@dataclasses.dataclass
class Rollout:
    """One completion to score and what the judge reads about its query."""

    query_id: str
    query: str
    situation: str
    profile: str
    memories: list[dict]
    completion: str
    user_id: str = ""
    category: str = ""
    criteria: dict | None = None


def _plain(value: Any) -> Any:
    """numpy arrays and scalars (verl's non-tensor batch, pandas-read parquet) as lists and numbers."""
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        return _plain(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def completion_text(completion: Any) -> str:
    """A completion as text: a string, or a conversational completion (a list of messages,
    the assistant's content joined; TRL's shape), or one message."""
    completion = _plain(completion)
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        completion = [completion]
    if isinstance(completion, list):
        parts = []
        for message in completion:
            if not isinstance(message, Mapping):
                raise InputError(f"a completion message is not a dict with content: {message!r:.80}")
            if message.get("role", "assistant") == "assistant":
                content = message.get("content") or ""
                parts.append(content if isinstance(content, str) else _text_parts(content))
        return "\n".join(parts)
    raise InputError(f"a completion is neither text nor a list of messages: {completion!r:.80}")


def _text_parts(content: list) -> str:
    # Multimodal message content: [{"type": "text", "text": ...}, ...]
    return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))


NEEDED = ("query_id", "query", "situation", "memories")


def rollout_from(completion: Any, info: Mapping[str, Any], where: str) -> Rollout:
    """A rollout from a completion and its row (TRL columns or verl extra_info)."""
    info = _plain(info) or {}
    lacking = [key for key in NEEDED if key not in info]
    if "persona" not in info and "profile" not in info:
        lacking.append("persona")
    if lacking:
        raise InputError(
            f"{where}: no {', '.join(lacking)} for the judge",
            "train on rows written by `personaemp export` (they carry what the reward needs)",
        )
    memories = info["memories"] or []
    memories = [
        m if isinstance(m, Mapping) else {"memory_id": f"m{n}", "value": str(m)}
        for n, m in enumerate(memories, 1)
    ]
    return Rollout(
        query_id=str(info["query_id"]),
        query=str(info["query"]),
        situation=str(info["situation"] or ""),
        profile=str(info.get("persona", info.get("profile")) or ""),
        memories=[
            {"memory_id": str(m.get("memory_id", "")), "value": str(m.get("value", ""))} for m in memories
        ],
        completion=completion_text(completion),
        user_id=str(info.get("user_id") or ""),
        category=str(info.get("category") or ""),
        criteria=info.get("criteria") or None,
    )
