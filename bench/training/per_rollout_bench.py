"""verl's per-rollout reward calls against one batched call: wall time, requests, in flight.

    python bench/training/per_rollout_bench.py [--rollouts 32] [--concurrency 32] [--latency 0.2] [--repeat 3]

verl 0.9's reward loop scores a step one rollout a call: an async function as tasks on the
worker's loop, a sync one in the loop's executor threads (min(32, CPUs + 4) of them). This
bench scores the same rollouts (distinct, each on a cold cache, so every way sends the same
requests) through:

  batch          one `compute_score_batch` call (the reference);
  one loop       that many concurrent `compute_score_async` calls on one event loop;
  threads        that many threads, each calling `compute_score`;
  verl async     verl's own RewardLoopWorker.compute_score_batch -> NaiveRewardManager ->
                 `compute_score_async`, loaded by verl's get_custom_reward_fn from the file
                 personaemp/reward.py (only where verl is installed);
  verl sync      the same with `compute_score` (verl's executor threads).

The judge is tests/fake_openai.py on 127.0.0.1 answering after --latency seconds; it counts
requests and the most in flight at once. Prints, per way, the median wall time of --repeat
runs, its ratio to the batch's, requests and the most in flight. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
sys.path[1:1] = [str(ROOT / "tests" / tier) for tier in ("unit", "integration", "e2e")]

from fake_openai import FakeOpenAI  # noqa: E402
from test_reward import judge, row  # noqa: E402

import personaemp.training.reward as module  # noqa: E402


def infos(n: int) -> list[dict]:
    return [{**row("q1" if i % 2 else "q2"), "query_id": f"q{i % 2 + 1}"} for i in range(n)]


def texts(n: int, run: str) -> list[str]:
    return [f"{run}: answer {i}" for i in range(n)]


def batch(reward, extra, solutions):
    reward.compute_score_batch(["personaemp"] * len(solutions), solutions, [""] * len(solutions), extra)


def one_loop(reward, extra, solutions):
    async def main():
        await asyncio.gather(
            *(
                reward.compute_score_async("personaemp", s, "", e)
                for s, e in zip(solutions, extra, strict=True)
            )
        )

    asyncio.run(main())


def threads(reward, extra, solutions):
    start = threading.Barrier(len(solutions))

    def work(i):
        start.wait()
        reward.compute_score("personaemp", solutions[i], "", extra[i])

    pool = [threading.Thread(target=work, args=(i,)) for i in range(len(solutions))]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


def verl_available() -> str | None:
    try:
        import verl  # noqa: F401
        from verl.experimental.reward_loop.reward_loop import RewardLoopWorker  # noqa: F401
    except ImportError as exc:
        return f"verl not installed ({exc.name})"
    return None


def through_verl(function_name: str):
    """verl's own path: get_custom_reward_fn loads personaemp/reward.py by file path, the
    naive reward-loop manager calls it per rollout, RewardLoopWorker.compute_score_batch
    makes one task per rollout on the worker's loop."""
    import numpy as np
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn

    import personaemp.reward as public

    config = OmegaConf.create(
        {"reward": {"custom_reward_function": {"path": public.__file__, "name": function_name,
                                               "reward_kwargs": {}},
                    "reward_model": {"enable": False}}}
    )  # fmt: skip

    class Decoder:  # response ids [i] -> the i-th text
        def __init__(self):
            self.texts: list[str] = []

        def decode(self, ids, skip_special_tokens=True):
            return self.texts[int(ids[0])]

    def run(reward, extra, solutions):
        decoder = Decoder()
        decoder.texts = solutions
        n = len(solutions)
        data = DataProto.from_dict(
            tensors={
                "prompts": torch.zeros(n, 1, dtype=torch.long),
                "responses": torch.arange(n).unsqueeze(1),
                "attention_mask": torch.ones(n, 2, dtype=torch.long),
            },
            non_tensors={
                "data_source": np.array(["personaemp"] * n, dtype=object),
                "reward_model": np.array([{"ground_truth": ""}] * n, dtype=object),
                "extra_info": np.array([dict(e) for e in extra], dtype=object),
            },
        )
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            worker = object.__new__(RewardLoopWorker)  # its __init__ loads a tokenizer from a hub
            worker.config = config
            worker.reward_manager = NaiveRewardManager(config, decoder, get_custom_reward_fn(config))
            worker.loop = loop
            outputs = loop.run_until_complete(worker.compute_score_batch(data))
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
            asyncio.set_event_loop(None)
        assert len(outputs) == n

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    ways = {"batch": batch, "one loop": one_loop, "threads": threads}
    missing = verl_available()
    if missing is None:
        ways["verl async"] = through_verl("compute_score_async")
        ways["verl sync"] = through_verl("compute_score")
    work = Path(tempfile.mkdtemp(prefix="per_rollout_bench-"))
    extra = infos(args.rollouts)
    found: dict[str, list[tuple[float, int, int]]] = {name: [] for name in ways}
    with FakeOpenAI(responder=judge, latency=lambda: args.latency) as server:
        for repeat in range(args.repeat):
            for name, way in ways.items():
                run = f"{name} {repeat}"
                config = work / f"{name.replace(' ', '-')}-{repeat}.toml"
                config.write_text(
                    f'[llm]\nbase_url = ["{server.base_url}"]\nmodel = "fake"\n'
                    f'concurrency = {args.concurrency}\nwork_dir = "{work / run.replace(" ", "-")}"\n'
                    "[reward]\nsamples = 1\n",
                    encoding="utf-8",
                )
                os.environ[module.CONFIG_VAR] = str(config)  # the module's functions: a new reward
                reward = module.default_reward()
                sent, server.max_in_flight = server.count, 0
                started = time.perf_counter()
                way(reward, extra, texts(args.rollouts, run))
                seconds = time.perf_counter() - started
                found[name].append((seconds, server.count - sent, server.max_in_flight))
                reward.close()
    print(
        f"{args.rollouts} distinct rollouts, [llm] concurrency {args.concurrency}, judge latency "
        f"{args.latency}s, cold cache each run; median of {args.repeat} runs"
    )
    if missing:
        print(f"(verl rows skipped: {missing})")
    print(f"{'way':<12}{'seconds':>9}{'x batch':>9}{'requests':>10}{'max in flight':>15}")
    base = statistics.median(s for s, _, _ in found["batch"])
    for name, runs in found.items():
        seconds = statistics.median(s for s, _, _ in runs)
        requests = sorted({r for _, r, _ in runs})
        in_flight = max(m for _, _, m in runs)
        print(
            f"{name:<12}{seconds:>9.3f}{seconds / base:>9.2f}"
            f"{'/'.join(map(str, requests)):>10}{in_flight:>15}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
