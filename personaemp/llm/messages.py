"""How the engine shapes a request's messages for an endpoint: the schema stated in the prompt
(for endpoints that take none), a re-ask quoting the bad reply inside the user turn, turns
of one role joined, system turns folded into the first user turn, and the bounds a
grammar-constrained endpoint needs on every string and list."""

from __future__ import annotations

import json
from typing import Any

from personaemp.secrets import redact

Message = dict[str, str]

SCHEMA_IN_PROMPT = (
    "Answer in json: one JSON object that follows this JSON schema, and nothing else.\n{schema}"
)
REASK = (
    "Your previous answer could not be used: {error}.\n"
    "It was:\n<<<\n{reply}\n>>>\n"
    "Answer again with only the JSON object, in the required format."
)
MAX_REASK_ECHO = 2000  # characters of a bad reply quoted back in a re-ask

GRAMMAR_MAX_STRING = 200  # characters
GRAMMAR_TEXT_CHAR = r"[^\"\\{}<>#\[\]\n\r\t]"  # no quotes, escapes, brackets or markup
GRAMMAR_MAX_ITEMS = 4  # a small model fills a list to its limit, and slowly (~50 ms/token)


def bounded(schema: Any) -> Any:
    """The schema with a length limit on every string and list that has none.

    For grammar-constrained endpoints (llama.cpp): the grammar keeps a small model on a
    valid path but not from looping inside an unbounded string or list until max_tokens.
    """
    if isinstance(schema, list):
        return [bounded(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: bounded(value) for key, value in schema.items()}
    kinds = result.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "string" in kinds and not {"enum", "const", "format", "pattern"} & result.keys():
        result.setdefault("maxLength", GRAMMAR_MAX_STRING)
        # Plain text only: a small model otherwise closes a list inside a string ("... }, {").
        result["pattern"] = f"^{GRAMMAR_TEXT_CHAR}{{{result.get('minLength', 0)},{result['maxLength']}}}$"
    if "array" in kinds:
        # Also below a larger bound (8 traits): a small model fills every list to its limit.
        ceiling = min(result.get("maxItems", GRAMMAR_MAX_ITEMS), GRAMMAR_MAX_ITEMS)
        result["maxItems"] = max(ceiling, result.get("minItems", 0))
    return result


def reask(messages: list[Message], bad_reply: str, error: str) -> list[Message]:
    """The original messages with the bad reply quoted inside the last user turn.

    Not replayed as an assistant turn: thinking-mode endpoints (DeepSeek) refuse an
    assistant turn without its reasoning, and strict chat templates want roles to alternate."""
    note = REASK.format(error=redact(error), reply=bad_reply[:MAX_REASK_ECHO])
    last = messages[-1]
    if last["role"] == "user":
        return [*messages[:-1], {"role": "user", "content": f"{last['content']}\n\n{note}"}]
    return [*messages, {"role": "user", "content": note}]


def with_schema_text(messages: list[Message], schema: dict[str, Any]) -> list[Message]:
    """For endpoints that cannot take a schema: state it (with the word json, which DeepSeek
    and OpenAI require for json_object) at the end of the first user turn: after the shared
    context and the step's task, before what only this request carries (a prompt's second
    user turn: the moment, the dimension, the response). Not first: a schema differs per
    step (and per user: ids narrowed to theirs), and would keep the provider's prefix cache
    from serving the context the requests share."""
    if "$defs" in schema:
        # Same schema, $defs last: a step narrows ids per user inside its $defs, and what
        # comes before the first per-user byte is what the prefix cache can share.
        schema = {**{k: v for k, v in schema.items() if k != "$defs"}, "$defs": schema["$defs"]}
    text = SCHEMA_IN_PROMPT.format(schema=json.dumps(schema, separators=(",", ":")))
    first = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if first is None:
        return [*messages, {"role": "user", "content": text}]
    turn = messages[first]
    return [
        *messages[:first],
        {"role": "user", "content": f"{turn['content']}\n\n{text}"},
        *messages[first + 1 :],
    ]


def join_turns(messages: list[Message]) -> list[Message]:
    """Consecutive turns of one role as one: strict chat templates want roles to alternate."""
    joined: list[Message] = []
    for message in messages:
        if joined and joined[-1]["role"] == message["role"]:
            joined[-1] = {**joined[-1], "content": f"{joined[-1]['content']}\n\n{message['content']}"}
        else:
            joined.append(message)
    return joined


def fold_system(messages: list[Message]) -> list[Message]:
    """Chat formats that drop system messages (gemma-3 on llama.cpp): prepend them to the first
    user turn instead."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [m for m in messages if m["role"] != "system"]
    if not system:
        return rest
    if rest and rest[0]["role"] == "user":
        return [{"role": "user", "content": f"{system}\n\n{rest[0]['content']}"}, *rest[1:]]
    return [{"role": "user", "content": system}, *rest]
