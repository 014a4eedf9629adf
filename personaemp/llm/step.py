"""An LLM step, declared once: its prompt, the reply it expects, its version and sampling.

Everything else follows from the declaration: the schema sent to the endpoint, the
sampling of each request, the fingerprint that says whether a finished row was made by
the same recipe, and the provenance written with it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel


@dataclass(frozen=True)
class Step:
    name: str
    reply: type[BaseModel] | None  # None: a free-text step (Engine.text), no JSON asked for
    prompt: str | None = None  # template name (prompts/<prompt>.md)
    version: int = 1  # bump when the stage reads this reply differently
    temperature: float | None = None  # None: the run's --temperature
    max_tokens: int | None = None  # None: the run's --max-tokens

    @property
    def schema(self) -> dict[str, Any]:
        return _schema_of(self.reply) if self.reply is not None else {}

    @property
    def schema_hash(self) -> str:
        return _hash(self.schema)


@functools.lru_cache(maxsize=256)
def _schema_of(model: type[BaseModel]) -> dict[str, Any]:
    return _untitled(model.model_json_schema())


def _untitled(schema: Any) -> Any:
    """A schema without the `title` pydantic gives every model and field ("Memory Ids" for
    memory_ids): it tells a model nothing the key does not, and a provider bills it (OpenAI as
    the prompt's prefix, DeepSeek in the prompt text) in every request. A property *named*
    title is kept."""
    if isinstance(schema, list):
        return [_untitled(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    kept = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs"):  # names, not keywords: every one is kept
            kept[key] = {name: _untitled(sub) for name, sub in value.items()}
        else:
            kept[key] = _untitled(value)
    return kept


def id_choice(ids: list[str], shared: bool) -> dict[str, Any]:
    """A string that is one of this unit's ids: an enum of them, or, where the schema must be
    the same for every unit (`shared`, Engine.shared_schemas), any string (the step's parse
    drops an id the unit does not have)."""
    return {"type": "string"} if shared else {"type": "string", "enum": ids}


def edit_schema(schema: dict[str, Any], path: tuple[str, ...], value: Any = None, **update: Any) -> dict:
    """`schema` with the dict at `path` replaced by `value` (or updated with `update`),
    copying only the dicts along the path: the rest is shared with `schema`, which stays
    as it was (Step.schema is cached). A deep copy per request cost a millisecond."""
    if not path:
        return value if value is not None else {**schema, **update}
    head, rest = path[0], path[1:]
    return {**schema, head: edit_schema(schema[head], rest, value, **update)}


def _hash(value: Any) -> str:
    encoded = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:12]


class RejectedReply(ValueError):
    """A stage's parse refuses a well-formed reply (e.g. no trait cites a real memory).

    The engine re-asks with the reason; if every attempt is refused, the unit fails with
    this `kind`."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
