"""Counters for a run: requests, cache hits, retries, re-asks, tokens, failures, cost."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field


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
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # included in completion_tokens; estimated when not reported
    prompt_chars: int = 0  # every call, cached or not; chars/4 is the endpoint-free estimate
    completion_chars: int = 0
    failures: Counter = field(default_factory=Counter)


class Accounting:
    """Per-step statistics; every number a run report shows comes from here."""

    def __init__(self) -> None:
        self.steps: dict[str, StepStats] = {}

    def step(self, name: str) -> StepStats:
        return self.steps.setdefault(name, StepStats())

    def totals(self) -> StepStats:
        total = StepStats()
        for stats in self.steps.values():
            for name, value in asdict(stats).items():
                if name == "failures":
                    total.failures.update(stats.failures)
                else:
                    setattr(total, name, getattr(total, name) + value)
        return total

    def cost(self, price_in: float | None, price_out: float | None) -> float | None:
        if price_in is None and price_out is None:
            return None
        total = self.totals()
        return (total.prompt_tokens * (price_in or 0) + total.completion_tokens * (price_out or 0)) / 1e6

    def as_dict(self) -> dict:
        return {
            name: {**asdict(stats), "failures": dict(stats.failures)} for name, stats in self.steps.items()
        }
