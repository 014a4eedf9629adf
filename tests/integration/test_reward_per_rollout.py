"""verl's per-rollout calls (its reward loop calls `compute_score` once per rollout: a sync
function in executor threads, an async one on the worker's loop): one reward per process,
whatever the thread or loop. The fake judge answers after a fixed latency, so calls overlap
and the server's in-flight count shows the cap."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from fake_openai import FakeOpenAI
from test_reward import PereGRM, expected, judge, row

from personaemp.llm.settings import LLMSettings

LATENCY = 0.05


def slow_settings(server, tmp_path, concurrency: int) -> LLMSettings:
    return LLMSettings(
        base_urls=[server.base_url], model="fake", work_dir=tmp_path / "work", concurrency=concurrency
    )


def rows(n: int) -> list[dict]:
    return [row("q1" if i % 2 else "q2") for i in range(n)]


def per_rollout_async(reward, infos: list[dict], texts: list[str]) -> list[float]:
    async def main():
        return await asyncio.gather(
            *(
                reward.compute_score_async("personaemp", text, "", info)
                for text, info in zip(texts, infos, strict=True)
            )
        )

    return asyncio.run(main())


def per_rollout_threads(reward, infos: list[dict], texts: list[str]) -> list[float]:
    results: dict[int, float] = {}
    start = threading.Barrier(len(texts))

    def worker(i):
        start.wait()
        results[i] = reward.compute_score("personaemp", texts[i], "", infos[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [results[i] for i in range(len(texts))]


@pytest.mark.parametrize("call", [per_rollout_async, per_rollout_threads], ids=["one-loop", "threads"])
def test_per_rollout_calls_never_put_more_in_flight_than_the_concurrency(tmp_path, call):
    infos, texts = rows(12), [f"answer {i}" for i in range(12)]
    with FakeOpenAI(responder=judge, latency=lambda: LATENCY) as server:
        reward = PereGRM(slow_settings(server, tmp_path, concurrency=4))
        try:
            scores = call(reward, infos, texts)
        finally:
            reward.close()
        assert server.count == 12 * 4  # every rollout judged: 3 dimensions + bystander
        assert server.max_in_flight <= 4
    assert scores == pytest.approx([expected("q1" if i % 2 else "q2") for i in range(12)])


@pytest.mark.parametrize("call", [per_rollout_async, per_rollout_threads], ids=["one-loop", "threads"])
def test_identical_rollouts_in_flight_are_judged_once(tmp_path, call):
    with FakeOpenAI(responder=judge, latency=lambda: LATENCY) as server:
        reward = PereGRM(slow_settings(server, tmp_path, concurrency=8))
        try:
            scores = call(reward, [row("q1")] * 6, ["the same answer"] * 6)
        finally:
            reward.close()
        assert server.count == 4
    assert scores == pytest.approx([expected("q1")] * 6)


def test_the_step_log_groups_the_rollouts_of_one_step(tmp_path):
    """A step: the rollouts scored until none has been in flight for `step_gap` seconds (verl
    scores a step's rollouts together, then updates the policy)."""
    log = tmp_path / "reward.jsonl"
    with FakeOpenAI(responder=judge, latency=lambda: LATENCY) as server:
        reward = PereGRM(slow_settings(server, tmp_path, concurrency=8), log_path=log, step_gap=0.3)
        try:
            per_rollout_async(reward, rows(8), [f"step one {i}" for i in range(8)])
            time.sleep(0.6)  # the policy update: longer than step_gap
            per_rollout_threads(reward, [row("q1")] * 4, [f"step two {i}" for i in range(4)])
            reward.flush()
            # the same rollouts again: answered from the cache, a third step
            per_rollout_async(reward, [row("q1")] * 4, [f"step two {i}" for i in range(4)])
        finally:
            reward.close()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["rollouts"] for line in lines] == [8, 4, 4]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert [line["requests"] for line in lines] == [32, 16, 0]
    assert lines[2]["cache_hits"] == 16
    assert reward.summary()["rollouts"] == 16


def test_a_batch_call_between_per_rollout_calls_keeps_its_own_line(tmp_path):
    log = tmp_path / "reward.jsonl"
    with FakeOpenAI(responder=judge) as server:
        reward = PereGRM(slow_settings(server, tmp_path, concurrency=8), log_path=log, step_gap=5)
        try:
            reward.compute_score("personaemp", "one", "", row("q1"))
            reward.compute_score_batch(["personaemp"], ["two"], [""], [row("q2")])
            reward.compute_score("personaemp", "three", "", row("q2"))
        finally:
            reward.close()  # closes the open step
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(line["rollouts"] for line in lines) == [1, 2]
