"""The engine: one structured LLM call = request building, cache, send, validate, re-ask."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from personaemp.llm.accounting import Accounting
from personaemp.llm.cache import ReplyCache, request_key
from personaemp.llm.endpoints import LLMError, RawReply

Reply = TypeVar("Reply", bound=BaseModel)
Message = dict[str, str]

REASK = (
    "Your previous reply could not be used: {error}. Reply again with only one JSON object "
    "that follows the required format."
)
SCHEMA_IN_PROMPT = "Reply with only one JSON object that follows this JSON schema:\n{schema}"
MAX_REASK_ECHO = 2000  # characters of a bad reply echoed back in a re-ask


@dataclass
class CallResult(Generic[Reply]):
    value: Reply
    raw: str  # the reply text the value was parsed from
    cached: bool  # True when no request was sent for the accepted reply


class Engine:
    """Structured calls through an endpoint pool (see `open_engine` for how one is built)."""

    def __init__(
        self,
        pool,
        *,
        model: str,
        structured: str,
        fold_system: bool,
        max_tokens: int,
        temperature: float,
        max_reasks: int,
        cache: ReplyCache | None,
        accounting: Accounting | None = None,
        endpoint_kind: str = "remote",
    ):
        self.pool, self.model, self.structured = pool, model, structured
        self.fold_system, self.max_tokens, self.temperature = fold_system, max_tokens, temperature
        self.max_reasks, self.cache = max_reasks, cache
        self.accounting = accounting or Accounting()
        self.endpoint_kind = endpoint_kind

    async def call(
        self,
        step: str,
        messages: list[Message],
        reply_model: type[Reply],
        *,
        schema: dict[str, Any] | None = None,
        check: Callable[[Reply], None] | None = None,
        sample: int = 0,
        max_tokens: int | None = None,
    ) -> CallResult[Reply]:
        """Ask for a `reply_model` JSON object; re-ask on an invalid, empty or cut reply.

        `schema` overrides the model's JSON schema (e.g. to narrow ids to an enum per user);
        `check` may raise ValueError for rules a schema cannot say. Raises LLMError.
        """
        stats = self.accounting.step(step)
        stats.calls += 1
        schema = schema or _schema_of(reply_model)
        conversation = list(messages)
        budget = max_tokens or self.max_tokens
        reply = None
        for attempt in range(self.max_reasks + 1):
            if attempt:
                stats.reasks += 1
            request = self.build_request(conversation, schema, budget)
            # The attempt is part of the key: a second re-ask repeats the first one's request,
            # and must not be answered with the same cached bad reply.
            reply, cached = await self._reply(step, request, f"{sample}.{attempt}" if attempt else sample)
            error = _problem(reply)
            if error is None:
                try:
                    value = reply_model.model_validate(_loads(reply.content))
                    if check is not None:
                        check(value)
                    return CallResult(value=value, raw=reply.content, cached=cached)
                except ValidationError as exc:
                    error = _validation_summary(exc)
                except ValueError as exc:
                    error = str(exc)
            if reply.finish_reason == "length":
                budget *= 2  # the reply was cut: give the retry room to finish
            conversation = [
                *messages,
                {"role": "assistant", "content": reply.content[:MAX_REASK_ECHO]},
                {"role": "user", "content": REASK.format(error=error)},
            ]
        kind = "truncated" if reply.finish_reason == "length" else "empty" if not reply.content else "invalid"
        stats.failures[kind] += 1
        raise LLMError(
            kind,
            f"{step}: no valid reply after {self.max_reasks} re-asks ({error})",
            reply.content,
            attempts=self.max_reasks + 1,
        )

    def build_request(self, messages: list[Message], schema: dict[str, Any], max_tokens: int) -> dict:
        """The exact chat-completions request for this engine's model and structured mode."""
        if self.structured in ("json_object", "none"):
            messages = _with_schema_text(messages, schema)
        if self.fold_system:
            messages = _fold_system(messages)
        request: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": max_tokens,
        }
        if self.structured == "json_schema":
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": schema},
            }
        elif self.structured == "json_object_schema":
            request["response_format"] = {"type": "json_object", "schema": bounded(schema)}
        elif self.structured == "json_object":
            request["response_format"] = {"type": "json_object"}
        return request

    async def _reply(self, step: str, request: dict, sample: int | str) -> tuple[RawReply, bool]:
        stats = self.accounting.step(step)
        key = request_key(request, sample) if self.cache is not None else None
        stored = self.cache.get(key) if self.cache is not None else None
        if stored is not None:
            stats.cache_hits += 1
            reply = RawReply(**stored)
            self._count_tokens(stats, request, reply, sent=False)
            return reply, True

        def on_retry() -> None:
            stats.retries += 1
            stats.requests += 1

        stats.requests += 1
        try:
            reply = await self.pool.send(request, on_retry)
        except LLMError as error:
            stats.failures[error.kind] += 1
            raise
        self._count_tokens(stats, request, reply)
        if self.cache is not None:
            self.cache.put(key, step, request, reply.as_dict())
        return reply, False

    @staticmethod
    def _count_tokens(stats, request: dict, reply: RawReply, sent: bool = True) -> None:
        """Characters count every reply (the pipeline's size, cache or not); tokens count
        only what was sent and paid for."""
        prompt_chars = sum(len(m["content"]) for m in request["messages"])
        stats.prompt_chars += prompt_chars
        stats.completion_chars += len(reply.content)
        if not sent:
            return
        # Endpoints that report no usage get the chars/4 estimate.
        stats.prompt_tokens += reply.prompt_tokens if reply.prompt_tokens is not None else prompt_chars // 4
        stats.completion_tokens += (
            reply.completion_tokens if reply.completion_tokens is not None else len(reply.content) // 4
        )


GRAMMAR_MAX_STRING = 200  # characters
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
    if "string" in kinds and "enum" not in result:
        result.setdefault("maxLength", GRAMMAR_MAX_STRING)
    if "array" in kinds:
        result.setdefault("maxItems", GRAMMAR_MAX_ITEMS)
    return result


@functools.lru_cache(maxsize=256)
def _schema_of(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def _loads(text: str) -> Any:
    """JSON, tolerating raw control characters inside strings (small models write literal
    newlines there); a ValueError names what is wrong otherwise."""
    try:
        return json.loads(text, strict=False)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"the reply is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None


def _problem(reply: RawReply) -> str | None:
    if not reply.content.strip():
        return "the reply was empty"
    if reply.finish_reason == "length":
        return "the reply was cut off by the token limit; answer more briefly"
    return None


def _validation_summary(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "the reply"
        problems.append(f"{where}: {error['msg']}")
    return "; ".join(problems)


def _with_schema_text(messages: list[Message], schema: dict[str, Any]) -> list[Message]:
    """For endpoints that cannot take a schema: state it in the system message."""
    text = SCHEMA_IN_PROMPT.format(schema=json.dumps(schema, separators=(",", ":")))
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _fold_system(messages: list[Message]) -> list[Message]:
    """Chat formats that drop system messages (gemma on llama.cpp): prepend them to the first
    user turn instead."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [m for m in messages if m["role"] != "system"]
    if not system:
        return rest
    if rest and rest[0]["role"] == "user":
        return [{"role": "user", "content": f"{system}\n\n{rest[0]['content']}"}, *rest[1:]]
    return [{"role": "user", "content": system}, *rest]
