"""Counters for a run: requests, cache hits, retries, re-asks, tokens, failures, cost."""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Collection
from dataclasses import asdict, dataclass, field, fields

CALLS_KEPT = 200  # per-request timings kept: all of a small run, the slowest of a big one


@dataclass
class StepStats:
    calls: int = 0  # engine.call() invocations
    requests: int = 0  # HTTP requests sent (retries included)
    cache_hits: int = 0
    retries: int = 0  # network/HTTP retries
    reasks: int = 0  # follow-up requests after an invalid or truncated reply
    cut_replies: int = 0  # replies that ended at max_tokens (finish_reason "length")
    cut_in_reasoning: int = 0  # ... of which before any answer, while reasoning
    prompt_tokens: int = 0  # as the endpoint reported them, for requests actually sent
    cached_tokens: int = 0  # ... of which the provider's prefix cache served (billed cheaper)
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # included in completion_tokens; estimated when not reported
    prompt_chars: int = 0  # every call, cached or not; chars/4 is the endpoint-free estimate
    completion_chars: int = 0
    answered: int = 0  # requests the endpoint answered (timed)
    seconds: float = 0.0  # the endpoint's answer time, summed over them
    slowest: float = 0.0  # the longest single answer
    failures: Counter = field(default_factory=Counter)

    def record(self, seconds: float) -> None:
        self.answered += 1
        self.seconds += seconds
        self.slowest = max(self.slowest, seconds)


_SUMMED = [f.name for f in fields(StepStats) if f.name not in ("failures", "slowest")]


class Accounting:
    """Per-step statistics; every number a run report shows comes from here."""

    def __init__(self) -> None:
        self.steps: dict[str, StepStats] = {}
        # The CALLS_KEPT slowest answered requests as (seconds, order, call): a run of 200K
        # requests keeps 200 dicts, not 200K.
        self._slowest: list[tuple[float, int, dict]] = []
        self._answered = 0

    def record_call(
        self,
        step: str,
        seconds: float,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        mode: str,
        cached_tokens: int = 0,
    ) -> None:
        self.step(step).record(seconds)
        call = {
            "step": step,
            "seconds": round(seconds, 3),
            "prompt_tokens": prompt_tokens,
            "cached_tokens": cached_tokens,
            "completion_tokens": completion_tokens,
            "tokens_per_second": round(completion_tokens / seconds, 1) if seconds > 0 else None,
            "structured": mode,
        }
        self._answered += 1
        entry = (seconds, self._answered, call)
        if len(self._slowest) < CALLS_KEPT:
            heapq.heappush(self._slowest, entry)
        else:
            heapq.heappushpop(self._slowest, entry)

    def slowest_calls(self, steps: Collection[str] | None = None) -> list[dict]:
        """Every call in order when there were few (a demo), else the slowest first."""
        kept = [entry for entry in self._slowest if steps is None or entry[2]["step"] in steps]
        if self._answered <= CALLS_KEPT:
            return [call for _, _, call in sorted(kept, key=lambda entry: entry[1])]
        return [call for _, _, call in sorted(kept, key=lambda entry: entry[0], reverse=True)]

    def only(self, steps: Collection[str]) -> Accounting:
        """The figures of some steps (one stage's, when `run` shares an engine between two)."""
        part = Accounting()
        part.steps = {name: stats for name, stats in self.steps.items() if name in steps}
        part._slowest = [entry for entry in self._slowest if entry[2]["step"] in steps]
        part._answered = self._answered
        return part

    def step(self, name: str) -> StepStats:
        return self.steps.setdefault(name, StepStats())

    def totals(self) -> StepStats:
        # Called on every progress update: field by field, not through asdict (a copy of all).
        total = StepStats()
        for stats in self.steps.values():
            for name in _SUMMED:
                setattr(total, name, getattr(total, name) + getattr(stats, name))
            total.failures.update(stats.failures)
            total.slowest = max(total.slowest, stats.slowest)
        return total

    def cost(
        self, price_in: float | None, price_out: float | None, price_cached: float | None = None
    ) -> float | None:
        """Dollars at prices per million tokens; cached prompt tokens at `price_cached`
        (None: at `price_in`, as a provider without a cache discount bills them)."""
        if price_in is None and price_out is None:
            return None
        total = self.totals()
        return dollars(total.prompt_tokens, total.cached_tokens, total.completion_tokens,
                       price_in, price_out, price_cached)  # fmt: skip

    def as_dict(self) -> dict:
        return {
            name: {**asdict(stats), "failures": dict(stats.failures)} for name, stats in self.steps.items()
        }


def dollars(
    prompt_tokens: float,
    cached_tokens: float,
    completion_tokens: float,
    price_in: float | None,
    price_out: float | None,
    price_cached: float | None = None,
) -> float:
    """The price of some tokens, per million; `cached_tokens` are part of `prompt_tokens`."""
    cached_price = price_in if price_cached is None else price_cached
    missed = prompt_tokens - cached_tokens
    return (
        missed * (price_in or 0) + cached_tokens * (cached_price or 0) + completion_tokens * (price_out or 0)
    ) / 1e6
