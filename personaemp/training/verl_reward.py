"""verl's per-rollout calls (`compute_score`, `compute_score_async`): one engine per process,
on an event loop in a daemon thread, shared by every thread and loop that calls the reward.
The reward (personaemp.training.reward) hands each rollout here and waits for its score."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections import Counter
from typing import Any

log = logging.getLogger("personaemp.reward")  # the reward's own logger


def _since(now, base):
    """The engine's totals now, less those at a step's start: what the step cost."""
    delta = dataclasses.replace(now, failures=Counter(now.failures))
    for field in dataclasses.fields(now):
        if field.name not in ("failures", "slowest"):
            setattr(delta, field.name, getattr(now, field.name) - getattr(base, field.name))
    delta.failures.subtract(base.failures)
    delta.failures = +delta.failures
    return delta


class _Shared:
    """The engine of a reward's per-rollout calls (`compute_score`, `compute_score_async`).

    verl's reward loop scores a step one rollout a call, from executor threads (a sync
    function) or as tasks on its loop (an async one). Were each call to open its own engine,
    every call would bring its own HTTP client and concurrency cap (so requests in flight
    would add up past [llm] concurrency), and identical rollouts would all be judged. Here one
    event loop, in a daemon thread of this process, holds one engine (endpoints, HTTP client,
    cache, cap) for every per-rollout call of the reward: a call from any thread or loop hands
    its rollout over and waits for the score. An identical rollout already in flight is not
    judged again: its caller waits for the same judgment.

    A step (one line of the log) is the rollouts scored from the first call until no call has
    been in flight for `step_gap` seconds: verl scores a step's rollouts together, then
    updates the policy, so the reward is idle between steps. `flush()` ends a step at once.
    A forked child starts its own (`Reward._service` checks the process id)."""

    def __init__(self, reward: Any):  # the Reward whose per-rollout calls these are
        self.reward = reward
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="personaemp-reward", daemon=True)
        self.engine = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._opening: asyncio.Lock | None = None
        self._judging: dict[str, asyncio.Future] = {}  # rollout key -> its judgment in flight
        self._step: dict | None = None  # the open step: rows, keys, start, engine totals then
        self._active = 0  # calls in flight
        self._closer: asyncio.TimerHandle | None = None
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, rollout) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(self._score(rollout), self.loop)

    async def _open(self):
        if self.engine is None:
            from personaemp.llm.session import open_engine

            self._opening = self._opening or asyncio.Lock()
            async with self._opening:
                if self.engine is None:
                    stack = contextlib.AsyncExitStack()
                    engine = await stack.enter_async_context(
                        open_engine(self.reward.settings, notify=log.warning)
                    )
                    engine.answered = engine.answered or self.reward._answered
                    self._stack, self.engine = stack, engine
        return self.engine

    async def _score(self, rollout) -> float:
        unit = self.reward._unit(rollout)
        engine = await self._open()
        step = self._begin(engine)
        try:
            key = unit["key"]
            task = self._judging.get(key)
            if task is None:
                task = asyncio.ensure_future(self.reward._judge(engine, unit))
                self._judging[key] = task
                task.add_done_callback(lambda _, key=key: self._judging.pop(key, None))
            step["keys"].add(key)
            judged = await asyncio.shield(task)
            step["rows"].append({"query_id": unit["query_id"], **judged})
            self.reward._answered = self.reward._answered or engine.answered
            return judged["reward"]
        finally:
            self._end(step)

    def _begin(self, engine) -> dict:
        if self._closer is not None:
            self._closer.cancel()
            self._closer = None
        if self._step is None:
            self._step = {"rows": [], "keys": set(), "started": time.perf_counter(),
                          "ended": None, "base": engine.accounting.totals()}  # fmt: skip
        self._active += 1
        return self._step

    def _end(self, step: dict) -> None:
        self._active -= 1
        step["ended"] = time.perf_counter()
        if self._active == 0 and self._step is step:
            self._closer = self.loop.call_later(self.reward.step_gap, self._close_step)

    def _close_step(self) -> None:
        step, self._step, self._closer = self._step, None, None
        if step is None or not step["rows"]:
            return
        totals = _since(self.engine.accounting.totals(), step["base"])
        seconds = (step["ended"] or time.perf_counter()) - step["started"]
        self.reward._record(step["rows"], len(step["keys"]), totals, seconds, None)

    async def _flush(self) -> None:
        while self._active:  # the step ends once its rollouts in flight are done
            await asyncio.sleep(0.01)
        if self._closer is not None:
            self._closer.cancel()
        self._close_step()

    def flush(self) -> None:
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._flush(), self.loop).result()

    async def _shutdown(self) -> None:
        await self._flush()
        if self._stack is not None:
            await self._stack.aclose()
        self._stack = self.engine = None

    def close(self) -> None:
        if not self.thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()
