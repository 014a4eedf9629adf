"""`--estimate`: what a stage would send now, counted without sending anything.

The stage runs as usual, but every request the cache cannot answer is recorded and its
unit stops there (engine.Pending). A unit stopped at step S is counted as needing all of
S's calls (a little over, when some of them were cached) and every later step of the
stage's chain. Token counts:
- prompt tokens of the requests that would be sent now: exact text, counted as
  characters / 4 (no tokenizer is assumed);
- later calls: the mean prompt of that step's replies in the cache, else the prompt of
  the step the unit stopped at;
- completion tokens: the mean reply of that step in the cache, else DEFAULT_COMPLETION
  (never over the step's max_tokens);
- the response schema is billed as prompt tokens: OpenAI bills the json_schema as the
  prompt's prefix; DeepSeek refuses json_schema, so its requests are rendered as a run on it
  sends them (json_object, the schema stated in the prompt) and counted with their text;
- cached prompt tokens (priced at --price-cached), under the provider's rule ([llm]
  cache_rule, CACHE_RULES): for the requests rendered now, the prefix each shares with a
  request rendered before it, in whole blocks (deepseek: 64-token blocks; openai: nothing
  under 1,024 tokens, then 128-token steps, the schema first; none: nothing); for later
  calls, the share the provider reported for that step's replies in the cache, else the
  share of the step stopped at.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_COMPLETION = 300  # tokens per reply when the cache has none of the step yet
# A provider's prefix-cache rule: (block, fewest tokens served), in tokens; None: no cache.
CACHE_RULES: dict[str, tuple[int, int] | None] = {"deepseek": (64, 64), "openai": (128, 1024), "none": None}
TOKEN_CHARS = 4


def tokens(chars: float) -> float:
    return chars / TOKEN_CHARS


def cache_rule(settings) -> str:
    """[llm] cache_rule (of LLMSettings or LLMOptions), `auto` decided from the endpoint:
    OpenAI's own API bills by OpenAI's rule; a local server bills nothing; any other
    endpoint by DeepSeek's (64-token blocks)."""
    if settings.cache_rule != "auto":
        return settings.cache_rule
    urls = getattr(settings, "base_urls", None) or getattr(settings, "base_url", None) or []
    if settings.llm == "local" or (settings.llm == "auto" and not urls):
        return "none"
    if any("openai.com" in url for url in urls):
        return "openai"
    return "deepseek"


def first_mode(settings) -> str | None:
    """The structured mode a run settles on before it has asked the endpoint anything:
    DeepSeek's API refuses json_schema, so its requests state the schema in the prompt."""
    urls = getattr(settings, "base_urls", None) or []
    return "json_object" if any("deepseek.com" in url for url in urls) else None


def sent_schema(request: dict[str, Any]) -> dict[str, Any] | None:
    """The schema a request's response_format carries (json_schema, or llama.cpp's
    json_object with a schema), None when it carries none."""
    fmt = request.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return (fmt.get("json_schema") or {}).get("schema")
    return fmt.get("schema")


def billed_schema(request: dict[str, Any], rule: str) -> str:
    """The schema text a provider bills as prompt beside the messages: OpenAI bills the
    json_schema as the prompt's prefix. (DeepSeek takes no json_schema: the schema is in the
    messages; a server that decodes by the schema, vLLM or llama.cpp, bills none.)"""
    if rule != "openai" or sent_schema(request) is None:
        return ""
    fmt = request["response_format"]  # its name comes with it: json_schema is {name, schema}
    return json.dumps(fmt.get("json_schema") or fmt.get("schema"), ensure_ascii=False)


def billed_text(request: dict[str, Any], rule: str) -> str:
    """A request's prompt as the provider bills and caches it: the billed schema first, then
    each message with its role."""
    messages = "".join(f"<|{m['role']}|>{m['content']}" for m in request["messages"])
    return billed_schema(request, rule) + messages


def billed_chars(request: dict[str, Any], rule: str) -> int:
    """Characters billed as prompt: the messages, each with its role (a provider bills a few
    tokens a message for the chat format), and the billed schema."""
    return len(billed_text(request, rule))


@dataclass
class Estimate:
    chain: Sequence[tuple[str, int]]  # (step name, calls per unit), in the order a unit makes them
    pending: Counter = field(default_factory=Counter)  # step -> units stopped at it
    prompt_chars: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    max_tokens: dict[str, int] = field(default_factory=dict)
    first_source: str = "rendered now"  # where the stopped step's prompts come from
    rendered: bool = True  # False: a projection (project), its first step's prompts not rendered
    cached_chars: Counter = field(default_factory=Counter)  # step -> chars in a prefix sent before
    rule: str = "deepseek"  # the provider's prefix-cache rule (CACHE_RULES)
    first_mode: str | None = None  # the engine's structured mode when none is remembered
    _prefixes: set = field(default_factory=set)

    def add(self, step: str, request: dict[str, Any], key: str = "") -> None:
        self.pending[step] += 1
        self.prompt_chars[step].append(billed_chars(request, self.rule))
        self.max_tokens[step] = request["max_tokens"]
        self.cached_chars[step] += self._shared_prefix(request)

    def remember(self, cache, limit: int = 2000) -> None:
        """The prefixes of the requests already answered (the reply cache, up to `limit` per
        step): sent before, the provider's cache holds them too."""
        if cache is None or CACHE_RULES[self.rule] is None:
            return
        for step, _ in self.chain:
            for request, _ in cache.replies_of(step, limit):
                self._shared_prefix(json.loads(request))

    def _shared_prefix(self, request: dict[str, Any]) -> int:
        """Characters of this request in whole blocks an earlier one sent the same (and remember
        its blocks): what the provider's prefix cache would serve, under its rule."""
        rule = CACHE_RULES[self.rule]
        if rule is None:
            return 0
        size, fewest = rule[0] * TOKEN_CHARS, rule[1] * TOKEN_CHARS
        text = billed_text(request, self.rule)
        digest, shared, missed = hashlib.sha1(), 0, False
        for start in range(0, len(text) - size + 1, size):
            digest.update(text[start : start + size].encode())
            key = digest.digest()
            if not missed and key in self._prefixes:
                shared += size
            else:
                missed = True
                self._prefixes.add(key)
        return shared if shared >= fewest else 0

    def report(
        self, history, price_in: float | None, price_out: float | None, price_cached: float | None = None
    ) -> dict[str, Any]:
        """Per step: calls, prompt (and cached) and completion tokens, and where each figure
        comes from.

        `history(step)` -> (mean prompt chars, mean completion chars, replies, cached share)
        from the cache; the share is None when no reply of the step reported one."""
        from personaemp.llm.accounting import dollars

        order = [name for name, _ in self.chain]
        per_unit = dict(self.chain)
        steps: dict[str, dict[str, Any]] = {
            name: {"calls": 0, "prompt_tokens": 0.0, "cached_tokens": 0.0, "completion_tokens": 0.0}
            for name in order
        }
        sources: dict[str, str] = {}
        for stopped, units in self.pending.items():
            if stopped not in per_unit:
                continue
            exact = sum(self.prompt_chars[stopped]) / units
            stopped_share = self.cached_chars[stopped] / max(sum(self.prompt_chars[stopped]), 1)
            reached = history(stopped)[2]  # units of the cache that made the stopped step
            for name in order[order.index(stopped) :]:
                mean_prompt, mean_reply, seen, share = history(name)
                # Rendered now: the prefixes those requests share; projected: what the provider
                # reported for the step's replies in the cache, when it did.
                if share is None or (name == stopped and self.rendered):
                    share = stopped_share
                # A later step runs for the share of units that got that far in the cache (a
                # persona without depth asks no situations).
                reach = seen / reached if name != stopped and 0 < seen < reached else 1.0
                calls = units * per_unit[name] * reach
                if name == stopped:
                    prompt, source = exact, self.first_source
                elif seen:
                    prompt, source = mean_prompt, f"cache mean of {seen}"
                else:
                    prompt, source = exact, f"as {stopped} (no {name} reply in the cache yet)"
                cap = self.max_tokens.get(name) or self.max_tokens.get(stopped) or DEFAULT_COMPLETION
                completion = min(tokens(mean_reply), cap) if seen else min(DEFAULT_COMPLETION, cap)
                entry = steps[name]
                entry["calls"] += calls
                entry["prompt_tokens"] += calls * tokens(prompt)
                entry["cached_tokens"] += calls * tokens(prompt) * share
                entry["completion_tokens"] += calls * completion
                sources[name] = source + (
                    f"; replies: cache mean of {seen}" if seen else f"; replies: {DEFAULT_COMPLETION} assumed"
                )
        total_in = sum(entry["prompt_tokens"] for entry in steps.values())
        total_out = sum(entry["completion_tokens"] for entry in steps.values())
        total_cached = sum(entry["cached_tokens"] for entry in steps.values())
        for name, entry in steps.items():
            entry["calls"] = round(entry["calls"])
            entry["prompt_tokens"] = round(entry["prompt_tokens"])
            entry["cached_tokens"] = round(entry["cached_tokens"])
            entry["completion_tokens"] = round(entry["completion_tokens"])
            entry["source"] = sources.get(name, "")
        cost = None
        if price_in is not None or price_out is not None:
            cost = dollars(total_in, total_cached, total_out, price_in, price_out, price_cached)
        return {
            "units_pending": sum(self.pending.values()),
            "steps": steps,
            "prompt_tokens": round(total_in),
            "cached_tokens": round(total_cached),
            "completion_tokens": round(total_out),
            "cost": cost,
            "counted_as": "characters / 4",
        }


def cache_history(cache, rule: str = "deepseek"):
    """history(step) over the valid replies in the cache (at most 2,000 per step), their
    prompts counted as billed under `rule`."""
    memo: dict[str, tuple[float, float, int, float | None]] = {}

    def history(step: str) -> tuple[float, float, int, float | None]:
        if step not in memo:
            rows = cache.replies_of(step, 2000) if cache is not None else []
            prompts = [billed_chars(json.loads(request), rule) for request, _ in rows]
            stored = [json.loads(reply) for _, reply in rows]
            replies = [len(reply.get("content", "")) for reply in stored]
            # The share of prompt tokens the provider's cache served, where it said; without the
            # step's first reply, which found the cache cold (the requests to come find it warm).
            told = [r for r in stored if r.get("cached_tokens") is not None and r.get("prompt_tokens")]
            told = told[1:] if len(told) > 1 else told
            memo[step] = (
                sum(prompts) / len(prompts) if prompts else 0.0,
                sum(replies) / len(replies) if replies else 0.0,
                len(rows),
                sum(r["cached_tokens"] for r in told) / sum(r["prompt_tokens"] for r in told)
                if told
                else None,
            )
        return memo[step]

    return history


def project(chain, units: int, prompt_chars: float, source: str, max_tokens: int, history, prices):
    """The estimate for `units` units not written yet (their input does not exist yet), each
    starting the chain with a prompt of `prompt_chars` (from `source`)."""
    estimate = Estimate(chain, first_source=source, rendered=False)
    if units:
        first = chain[0][0]
        estimate.pending[first] = units
        estimate.prompt_chars[first] = [round(prompt_chars)] * units
        estimate.max_tokens[first] = max_tokens
    return estimate.report(history, *prices)


def project_from_cache(steps: Sequence[str], units: int, fallback: tuple[float, str], llm) -> dict[str, Any]:
    """`project` of `units` units through `steps`, on the [llm] options `llm`: the first
    prompt's size is the mean of that step's prompts in the reply cache, else `fallback`
    (characters, where they come from)."""
    import contextlib

    from personaemp.llm.cache import ReplyCache

    path = llm.work_dir / "cache.sqlite"
    readable = path.exists() and not llm.no_cache
    with contextlib.closing(ReplyCache(path, write=False)) if readable else contextlib.nullcontext() as cache:
        history = cache_history(cache, cache_rule(llm))
        seen = history(steps[0])
        first = (seen[0], f"cache mean of {seen[2]}") if seen[2] else fallback
        prices = (llm.price_in, llm.price_out, llm.price_cached)
        return project([(step, 1) for step in steps], units, *first, llm.max_tokens, history, prices)
