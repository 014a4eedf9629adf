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
    answered: int = 0  # requests the endpoint answered (timed)
    seconds: float = 0.0  # the endpoint's answer time, summed over them
    slowest: float = 0.0  # the longest single answer
    failures: Counter = field(default_factory=Counter)

    def record(self, seconds: float) -> None:
        self.answered += 1
        self.seconds += seconds
        self.slowest = max(self.slowest, seconds)


class Accounting:
    """Per-step statistics; every number a run report shows comes from here."""

    def __init__(self) -> None:
        self.steps: dict[str, StepStats] = {}
        self.calls: list[dict] = []  # one per answered request, for the run report

    def record_call(
        self, step: str, seconds: float, *, prompt_tokens: int, completion_tokens: int, mode: str
    ) -> None:
        self.step(step).record(seconds)
        self.calls.append(
            {
                "step": step,
                "seconds": round(seconds, 3),
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "tokens_per_second": round(completion_tokens / seconds, 1) if seconds > 0 else None,
                "structured": mode,
            }
        )

    def slowest_calls(self, keep: int) -> list[dict]:
        """Every call when there are few (a demo), else the `keep` slowest."""
        if len(self.calls) <= keep:
            return list(self.calls)
        return sorted(self.calls, key=lambda call: call["seconds"], reverse=True)[:keep]

    def step(self, name: str) -> StepStats:
        return self.steps.setdefault(name, StepStats())

    def totals(self) -> StepStats:
        total = StepStats()
        for stats in self.steps.values():
            for name, value in asdict(stats).items():
                if name == "failures":
                    total.failures.update(stats.failures)
                elif name == "slowest":
                    total.slowest = max(total.slowest, stats.slowest)
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
