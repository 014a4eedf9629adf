"""The engine: one structured LLM call = request building, cache, send, validate, re-ask.

Also what makes it work on the endpoints people really use:
- the structured-output mode is negotiated per run (json_schema, else json_object with
  the schema at the end of the prompt, else the schema in the prompt alone) and remembered in the
  work dir; a refused format never fails a unit;
- replies are read through reasoning blocks, preambles and fenced code (reply.py);
- re-asks quote the bad reply inside the user turn, so endpoints that demand
  `reasoning_content` on replayed assistant turns accept them;
- until an endpoint has answered once, requests go one at a time, and a dead or
  refusing endpoint stops the run (EndpointError) instead of failing every unit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from personaemp.errors import Pending, PersonaempError
from personaemp.io import write_json_atomic
from personaemp.llm.accounting import Accounting, StepStats
from personaemp.llm.cache import ReplyCache, request_key
from personaemp.llm.endpoints import LLMError, RawReply, mentions_format, refuses_format
from personaemp.llm.messages import (  # noqa: F401 - REASK, SCHEMA_IN_PROMPT: importable from here too
    REASK,
    SCHEMA_IN_PROMPT,
    Message,
    bounded,
    fold_system,
    join_turns,
    reask,
    with_schema_text,
)
from personaemp.llm.reply import EXTRACTOR_VERSION, extract_json, split_reasoning
from personaemp.llm.step import RejectedReply, Step

Reply = TypeVar("Reply", bound=BaseModel)

LADDER = ("json_schema", "json_object", "none")  # what `--structured auto` tries, in order
TEXT = "text"  # a free-text request (Engine.text): outside the ladder, never refused for its format
EARLY_HTTP_ERRORS = 3  # the same refusal this often before any reply: the endpoint refuses us
FAILURES_IN_ROW = 8  # failed requests in a row after replies: the endpoint went away
DECISIONS_FILE = "endpoints.json"


class EndpointError(PersonaempError):
    """The endpoint cannot be used for this run (dead, refusing every request): exit 1.

    Units in flight are not recorded as failed: the next run does them."""


@dataclass
class CallResult(Generic[Reply]):
    value: Reply  # the reply model
    parsed: Any  # what the step's parse made of it (the value itself without a parse)
    raw: str  # the reply text the value was read from
    cached: bool  # True when no request was sent for the accepted reply
    key: str | None = None  # its cache key (Engine.reject)


@dataclass(frozen=True)
class Sampling:
    temperature: float
    max_tokens: int
    seed: int | None


class BudgetReached(PersonaempError):
    """The next request could take the spend over --max-cost: the run stops, resumable.

    Units in flight are not recorded as failed: a run with a larger budget does them."""


@dataclass
class Budget:
    """--max-cost: a request is sent only if the spend so far, the requests in flight and
    this one at its most (its prompt, and max_tokens of completion) fit in `limit`. One
    that does not fit waits for those in flight (they usually cost less than their most);
    when none is left and it still does not fit, the run stops."""

    limit: float  # dollars
    price_in: float | None  # per million tokens
    price_out: float | None
    price_cached: float | None = None  # None: cached prompt tokens cost price_in
    reserved: float = 0.0  # the most the requests in flight can cost
    in_flight: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def most(self, request: dict) -> float:
        # A byte-level BPE token (GPT, DeepSeek, Qwen, Llama) is at least one byte: the UTF-8
        # bytes bound the prompt's tokens in any language (chars/4 overspent on Russian). At
        # its most, no prompt token is served from the provider's cache.
        prompt = sum(len(m["content"].encode()) for m in request["messages"]) + 32  # and the template
        return self.dollars(prompt, request["max_tokens"])

    def dollars(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * (self.price_in or 0) + completion_tokens * (self.price_out or 0)) / 1e6


class _FormatRefused(Exception):
    """The endpoint refused the response format; the mode stepped down, build again."""


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
        seed: int | None = None,
        steps: dict[str, dict[str, Any]] | None = None,
        decisions: Path | None = None,
        notify: Callable[[str], None] | None = None,
        request_extras: dict[str, Any] | None = None,
        budget: Budget | None = None,
        offline=None,
        prompt_variant: str | None = None,
        shared_schemas: bool = False,
    ):
        self.pool, self.model, self.configured = pool, model, structured
        self.prompt_variant = prompt_variant  # prompts.COMPACT on the embedded model
        # One schema per step, not narrowed to each unit's ids: under OpenAI's cache rule the
        # schema is the prompt's cached prefix, and a per-unit enum would keep every request
        # of the step from being served by the cache (llm/step.py id_choice).
        self.shared_schemas = shared_schemas
        self.request_extras = request_extras or {}  # sent with every request (the local model's sampler)
        self.budget = budget
        # --estimate (llm.estimate.Estimate) or --batch (llm.batch.BatchQueue): a request the
        # cache cannot answer is handed to it, not sent, and its unit stops (Pending).
        self.offline = offline
        self.fold_system, self.max_tokens, self.temperature = fold_system, max_tokens, temperature
        self.max_reasks, self.cache, self.seed = max_reasks, cache, seed
        self.step_settings = steps or {}
        self.accounting = accounting or Accounting()
        self.endpoint_kind = endpoint_kind
        self.notify = notify or (lambda message: None)
        self.decisions = decisions
        self.refusals: list[str] = []
        self.asked_for_structure = False  # a request with a schema was made (not all free text)
        self.mode, self.confirmed, self.mode_source = structured, structured != "auto", "set"
        if structured == "auto":
            # --estimate: the mode a run on the endpoint settles on (it renders what it counts).
            first = getattr(offline, "first_mode", None)
            self.mode, self.mode_source = self._remembered_mode() or (first or LADDER[0], "first try")
            self.confirmed = self.mode_source == "remembered"
        self.answered = False  # has the endpoint answered a request on this run?
        self._gate = asyncio.Lock()
        self._early_http_errors = 0
        self._failures_in_row = 0
        self._dead: PersonaempError | None = None  # once judged unusable, nothing more is sent

    # --- the call -----------------------------------------------------------------------

    async def call(
        self,
        step: Step,
        messages: list[Message],
        *,
        schema: dict[str, Any] | None = None,
        parse: Callable[[Any], Any] | None = None,
        sample: int = 0,
    ) -> CallResult:
        """Ask for `step.reply` JSON; re-ask on an invalid, empty, cut or refused reply.

        `schema` overrides the reply model's schema (e.g. to narrow ids to an enum per user);
        `parse(value)` turns the reply into the stage's result and may raise RejectedReply
        (or ValueError) for rules a schema cannot say. Raises LLMError or EndpointError.
        """
        stats = self.accounting.step(step.name)
        stats.calls += 1
        schema = schema or step.schema
        sampling = self.sampling(step, sample)
        budget, conversation, kind, error = sampling.max_tokens, messages, "invalid", ""
        reply = RawReply("", None, None, None)
        for attempt in range(self.max_reasks + 1):
            reply, key, request, cached = await self._reply(
                step.name, conversation, schema, sampling, budget, sample, attempt
            )
            answer = split_reasoning(reply.content)[0]
            kind, error = _problem(reply, answer)
            if error is None:
                try:
                    value = step.reply.model_validate(extract_json(reply.content))
                    parsed = parse(value) if parse is not None else value
                except ValidationError as exc:
                    kind, error = "invalid", _validation_summary(exc)
                except RejectedReply as exc:
                    kind, error = exc.kind, str(exc)
                except ValueError as exc:
                    kind, error = "invalid", str(exc)
                else:
                    if not cached:
                        self._store(key, step.name, request, reply, valid=True)
                    return CallResult(value=value, parsed=parsed, raw=reply.content, cached=cached, key=key)
            # Kept for the record, never served again: a retry must ask afresh.
            self._store(key, step.name, request, reply, valid=False)
            if reply.finish_reason == "length":
                stats.cut_replies += 1
                if not answer and (reply.reasoning or "<think>" in reply.content.lower()):
                    stats.cut_in_reasoning += 1
                # The reply was cut: give the retry room to finish. Not under a grammar (the
                # bounded schema caps a valid answer): there a cut reply means a loop.
                if self.mode != "json_object_schema":
                    budget *= 2
            conversation = reask(messages, answer or reply.content, error)
        stats.failures[kind] += 1
        raise LLMError(
            kind,
            f"{step.name}: no valid reply after {self.max_reasks} re-asks ({error})",
            reply.content,
            attempts=self.max_reasks + 1,
        )

    async def text(self, step: Step, messages: list[Message], *, sample: int = 0) -> CallResult:
        """Ask for free text (a policy model's response): no response format, no schema.

        Reasoning (`<think>` blocks, `reasoning_content`) is set aside; an empty answer is
        asked again, and one cut while reasoning gets twice the budget. An answer cut by
        the token limit is kept: `parsed` is the finish reason, so the stage can say so.
        """
        stats = self.accounting.step(step.name)
        stats.calls += 1
        sampling = self.sampling(step, sample)
        budget = sampling.max_tokens
        reply = RawReply("", None, None, None)
        for attempt in range(self.max_reasks + 1):
            reply, key, request, cached = await self._reply(
                step.name, messages, None, sampling, budget, sample, attempt
            )
            answer = split_reasoning(reply.content)[0]
            if answer:
                if not cached:
                    self._store(key, step.name, request, reply, valid=True)
                return CallResult(value=answer, parsed=reply.finish_reason, raw=reply.content, cached=cached)
            self._store(key, step.name, request, reply, valid=False)
            if reply.finish_reason == "length":
                stats.cut_replies += 1
                stats.cut_in_reasoning += 1
                budget *= 2
        kind = "truncated" if reply.finish_reason == "length" else "empty"
        stats.failures[kind] += 1
        raise LLMError(
            kind,
            f"{step.name}: no answer after {self.max_reasks} re-asks "
            f"({'cut while reasoning' if kind == 'truncated' else 'empty reply'})",
            reply.content,
            attempts=self.max_reasks + 1,
        )

    def reject(self, result: CallResult) -> None:
        """The stage refused this reply after all (its own rules): never served again."""
        if self.cache is not None and result.key is not None:
            self.cache.reject(result.key)

    def sampling(self, step: Step, sample: int = 0) -> Sampling:
        """A step's sampling: the run's per-step setting, else the step's default, else the run's."""
        chosen = self.step_settings.get(step.name, {})

        def pick(name: str, declared, run_value):
            value = chosen.get(name)
            return value if value is not None else declared if declared is not None else run_value

        return Sampling(
            temperature=pick("temperature", step.temperature, self.temperature),
            max_tokens=pick("max_tokens", step.max_tokens, self.max_tokens),
            # Sample k is another draw: with --seed S it sends S + k (docs/providers.md "Seeds").
            seed=None if self.seed is None else self.seed + sample,
        )

    def fingerprint(self, step: Step, prompt_hash: str = "") -> str:
        """What decides whether a finished row was made by the same recipe for this step."""
        sampling = self.sampling(step)
        return "/".join(
            str(part)
            for part in (
                step.name, step.version, prompt_hash, step.schema_hash, self.model, self.configured,
                sampling.temperature, sampling.max_tokens, sampling.seed, f"x{EXTRACTOR_VERSION}",
                *(f"{key}={value}" for key, value in sorted(self.request_extras.items())),
            )
        )  # fmt: skip

    def build_request(
        self, messages: list[Message], schema: dict[str, Any], sampling: Sampling, max_tokens: int, mode: str
    ) -> dict:
        """The exact chat-completions request for this model in structured mode `mode`
        (TEXT: a free-text request, no response format)."""
        if mode in ("json_object", "none"):
            messages = with_schema_text(messages, schema)
        messages = join_turns(messages)
        if self.fold_system:
            messages = fold_system(messages)
        request: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": sampling.temperature,
            "max_tokens": max_tokens,
            **self.request_extras,
        }
        if sampling.seed is not None:
            request["seed"] = sampling.seed
        if mode == "json_schema":
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": schema},
            }
        elif mode == "json_object_schema":
            request["response_format"] = {"type": "json_object", "schema": bounded(schema)}
        elif mode == "json_object":
            request["response_format"] = {"type": "json_object"}
        return request

    def provenance(self, prompts: dict[str, str]):
        """Who made a row, from which prompts (name -> hash), and when."""
        from datetime import UTC, datetime

        from personaemp.records import Provenance

        return Provenance(
            model=self.model,
            endpoint_kind=self.endpoint_kind,
            prompts=prompts,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )

    def structured_report(self) -> dict[str, Any]:
        """The structured mode negotiated and used; nothing for a stage whose every request
        is free text (respond): no mode was used, and none was decided."""
        if not self.asked_for_structure:
            return {}
        return {
            "configured": self.configured,
            "used": self.mode,
            "decided_by": self.mode_source,
            "refused": list(self.refusals),
        }

    # --- cache and sending --------------------------------------------------------------

    async def _reply(self, step_name: str, messages, schema, sampling, budget, sample, attempt=0):
        """`schema` None: a free-text request, whatever the structured mode. `attempt` 1 and up:
        a re-ask, counted as one."""
        stats = self.accounting.step(step_name)
        if attempt:
            stats.reasks += 1
            # The attempt is part of the key: a second re-ask may repeat the first one's request.
            sample = f"{sample}.{attempt}"
        while True:
            mode = TEXT if schema is None else self.mode
            self.asked_for_structure |= schema is not None
            request = self.build_request(messages, schema, sampling, budget, mode)
            key = request_key(request, sample) if self.cache is not None else None
            once = getattr(self.offline, "answers_once", False)  # --batch (llm/batch.py)
            stored = self.cache.get(key, any_verdict=once) if self.cache is not None else None
            if stored is not None and "error" in stored:  # --batch: the batch refused this request
                stats.failures["http_error"] += 1
                error = LLMError("http_error", f"{step_name}: the batch answered {stored['error']}")
                error.status = stored.get("status")
                raise error
            if stored is not None:
                stats.cache_hits += 1
                reply = RawReply(**stored)
                _count_tokens(stats, request, reply, sent=False)
                return reply, key, request, True
            if self.offline is not None:
                self.offline.add(step_name, request, key or request_key(request, sample))
                raise Pending
            try:
                reply = await self._send(stats, request, mode)
            except _FormatRefused:
                continue
            prompt_tokens, completion_tokens = _count_tokens(stats, request, reply)
            if reply.seconds is not None:
                self.accounting.record_call(
                    step_name,
                    reply.seconds,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    mode=mode,
                    cached_tokens=min(reply.cached_tokens or 0, prompt_tokens),
                )
            return reply, key, request, False

    async def _send(self, stats: StepStats, request: dict, mode: str) -> RawReply:
        """Send a request built in structured `mode`; raise _FormatRefused to have it built
        again when the mode changes (refused now, or by another request while this waited)."""

        def on_retry(error: LLMError | None = None, attempt: int = 0, retries: int = 0) -> None:
            stats.retries += 1
            stats.requests += 1
            if error is not None and error.kind == "timeout":  # it was re-sent without a word
                self.notify(f"{error.message}; sent again (retry {attempt} of {retries})")

        async with self._turn():
            if self._dead is not None:
                raise type(self._dead)(self._dead.message, self._dead.hint)
            if mode not in (self.mode, TEXT):
                raise _FormatRefused
            most = await self._reserve(request)
            stats.requests += 1
            try:
                reply = await self.pool.send(request, on_retry, cautious=not self.answered)
            except LLMError as error:
                if self._refuses_format(error, request):
                    self._step_down(mode, error)
                    raise _FormatRefused from None
                stats.failures[error.kind] += 1
                try:
                    self._judge_failure(error)
                except EndpointError as dead:
                    self._dead = dead
                    raise
                raise
            except PersonaempError as error:  # 401, 403, 404: every request would get the same
                self._dead = error
                raise
            finally:
                await self._release(most)
        self._answered(mode)
        return reply

    async def _reserve(self, request: dict) -> float:
        """Wait until this request fits in --max-cost at its most; BudgetReached if it never will."""
        budget = self.budget
        if budget is None:
            return 0.0
        most = budget.most(request)
        async with budget.changed:
            while True:
                spent = self.accounting.cost(budget.price_in, budget.price_out, budget.price_cached) or 0.0
                if spent + budget.reserved + most <= budget.limit:
                    budget.reserved += most
                    budget.in_flight += 1
                    return most
                if not budget.in_flight:
                    raise BudgetReached(
                        f"stopped before --max-cost ${budget.limit:g}: spent ${spent:.4f}, the next "
                        f"request could cost up to ${most:.4f}",
                        "finished units are kept; each run has its own budget: run again to go on",
                    )
                await budget.changed.wait()

    async def _release(self, most: float) -> None:
        """A request is over: its tokens are counted (by the caller, before any wait ends)."""
        budget = self.budget
        if budget is None:
            return
        async with budget.changed:
            budget.reserved -= most
            budget.in_flight -= 1
            budget.changed.notify_all()

    @contextlib.asynccontextmanager
    async def _turn(self):
        """One request at a time until the endpoint has answered once; then no limit here."""
        held = False
        if not self.answered:
            await self._gate.acquire()
            held = not self.answered
            if not held:
                self._gate.release()
        try:
            yield
        finally:
            if held:
                self._gate.release()

    def _answered(self, mode: str) -> None:
        self.answered, self._failures_in_row = True, 0
        if not self.confirmed and mode == self.mode:
            self.confirmed = True
            if self.configured == "auto":
                self.mode_source = "refusals" if self.refusals else "accepted"
                self._remember(mode)

    def _judge_failure(self, error: LLMError) -> None:
        """Raise EndpointError when the failure is about the endpoint, not about the unit."""
        where = getattr(error, "endpoint", "the endpoint")
        if not self.answered and error.kind != "http_error":
            raise EndpointError(f"{where} did not answer: {error}", _hint(error))
        self._failures_in_row += 1
        if not self.answered:
            self._early_http_errors += 1
            if self._early_http_errors >= EARLY_HTTP_ERRORS:
                raise EndpointError(
                    f"{where} refused the first {EARLY_HTTP_ERRORS} requests: {error}", _hint(error)
                )
        elif self._failures_in_row >= FAILURES_IN_ROW:
            raise EndpointError(f"{where} failed {FAILURES_IN_ROW} requests in a row: {error}", _hint(error))

    # --- structured-mode negotiation ----------------------------------------------------

    def _refuses_format(self, error: LLMError, request: dict) -> bool:
        return self.configured == "auto" and refuses_format(error, request)

    def _step_down(self, mode: str, error: LLMError) -> None:
        if mode != self.mode:
            return  # a request in flight at the same time already stepped down
        self.mode = LADDER[LADDER.index(mode) + 1]
        self.confirmed, self.mode_source = False, "refusals"
        self.refusals.append(f"{mode}: HTTP {error.status} {error.server_message}")
        self.notify(
            f"structured output: the endpoint refused {mode} (HTTP {error.status}: "
            f"{error.server_message}); trying {self.mode}"
        )

    def _decision_keys(self) -> list[str]:
        return [f"{endpoint.base_url} {self.model}" for endpoint in self.pool.endpoints]

    def _remembered_mode(self) -> tuple[str, str] | None:
        decisions = _read_decisions(self.decisions)
        modes = [decisions.get(key, {}).get("structured") for key in self._decision_keys()]
        if not modes or any(mode not in LADDER for mode in modes):
            return None
        return max(modes, key=LADDER.index), "remembered"

    def _remember(self, mode: str) -> None:
        if self.decisions is None:
            return
        decisions = _read_decisions(self.decisions)
        for key in self._decision_keys():
            decisions[key] = {
                "structured": mode,
                "refused": list(self.refusals),
                "decided_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
        with contextlib.suppress(OSError):
            write_json_atomic(self.decisions, decisions)

    def _store(self, key, step: str, request: dict, reply: RawReply, valid: bool) -> None:
        if self.cache is not None and key is not None:
            self.cache.put(key, step, request, reply.as_dict(), valid=valid)


def _read_decisions(path: Path | None) -> dict[str, Any]:
    if path is None or not path.exists():
        return {}
    try:
        decisions = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return decisions if isinstance(decisions, dict) else {}


def _hint(error: LLMError) -> str:
    if mentions_format(error.server_message):
        return "this endpoint refuses that response format: use --structured auto"
    if error.kind == "connection":
        return "is the server running? check --base-url"
    if error.kind == "timeout":
        return "the server did not answer in time: check it, or raise --timeout"
    if error.too_large:
        return "the server sends far more than --max-tokens allows: check that it honours max_tokens"
    if error.kind in ("server_error", "rate_limited"):
        return "the server fails every request: check its log, or try again later"
    return "the endpoint refuses these requests: check --model, --max-tokens and --temperature for it"


def _count_tokens(stats: StepStats, request: dict, reply: RawReply, sent: bool = True) -> tuple[int, int]:
    """Characters count every reply (the pipeline's size, cache or not); tokens count only
    what was sent and paid for. Returns the (prompt, completion) tokens counted."""
    prompt_chars = sum(len(m["content"]) for m in request["messages"])
    stats.prompt_chars += prompt_chars
    stats.completion_chars += len(reply.content)
    if not sent:
        return 0, 0
    # Endpoints that report no usage get the chars/4 estimate.
    prompt = reply.prompt_tokens if reply.prompt_tokens is not None else prompt_chars // 4
    completion = reply.completion_tokens if reply.completion_tokens is not None else len(reply.content) // 4
    stats.prompt_tokens += prompt
    stats.cached_tokens += min(reply.cached_tokens or 0, prompt)
    stats.completion_tokens += completion
    if reply.reasoning_tokens is not None:
        stats.reasoning_tokens += reply.reasoning_tokens
    else:
        stats.reasoning_tokens += (len(reply.reasoning) + len(split_reasoning(reply.content)[1])) // 4
    return prompt, completion


def _problem(reply: RawReply, answer: str) -> tuple[str, str | None]:
    """(failure kind, reason) of a reply that cannot be read at all, or (_, None)."""
    if reply.finish_reason == "length":
        return "truncated", "the reply was cut off by the token limit; answer more briefly"
    if not answer:
        return (
            "empty",
            "the reply was empty" if not reply.content.strip() else "the reply held only reasoning",
        )
    return "invalid", None


def _validation_summary(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "the reply"
        problems.append(f"{where}: {error['msg']}")
    return "; ".join(problems)
