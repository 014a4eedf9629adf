"""GRPO steps through TRL's `rollout_func` with the simulated user (training/interaction.py) as
the other side of each rollout, on CPU, offline.

    pip install -e '.[trl]'            # trl, transformers, torch
    python bench/training/dialogue_grpo_bench.py [--steps 2] [--max-turns 2] [--generations 2]

What it does:
  1. writes two users' accepted queries and exports them with `personaemp export --format trl
     --dialogues` (each row: respond's prompt and `interaction_kwargs`, the simulated user);
  2. builds the tiny random policy of bench/training/grpo_bench.py (nothing downloaded);
  3. runs GRPOTrainer(rollout_func=...) for --steps steps: per prompt the policy answers, the
     simulated user (SimulatedUserInteraction, tests/fake_openai.py playing the simulator on
     127.0.0.1, its emotion's change per turn a hash of the conversation) replies, until the
     session ends; the completion is every token after the prompt,
     `env_mask` 0 over the user's, and the session reward goes to the reward function as a column;
  4. prints per step the rollouts, what TRL handed rollout_func (prompts, distinct prompts),
     supporter turns, simulator requests and tokens, the session rewards and the loss.

Prints figures, asserts nothing; not part of `make test`. Without trl/transformers/torch it says
so and exits 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench" / "training")]
sys.path[1:1] = [str(ROOT / "tests" / tier) for tier in ("unit", "integration", "e2e")]


def missing_extra() -> str | None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import trl  # noqa: F401
    except ImportError as exc:
        return f"the [trl] extra is not installed ({exc.name} missing): pip install -e '.[trl]'"
    return None


def varied_user(step: str, body: dict, seen: int) -> dict | None:
    """The scripted user, its emotion's change a hash of what it read (-5..+5): the rollouts of a
    group get different session rewards, so GRPO has an advantage to learn from."""
    from test_dialogues import good_turn

    if step != "simulate":
        return None
    turn = good_turn(body)
    digest = hashlib.sha256(json.dumps(body["messages"], sort_keys=True).encode()).hexdigest()
    return {**turn, "change": int(digest[:4], 16) % 11 - 5}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=2, help="supporter turns per session")
    parser.add_argument("--generations", type=int, default=2, help="GRPO group size")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="per supporter turn")
    args = parser.parse_args(argv)
    reason = missing_extra()
    if reason:
        print(f"dialogue_grpo_bench: skipped: {reason}")
        return 0
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    import datasets
    import torch
    import transformers
    import trl
    from fake_openai import FakeOpenAI
    from grpo_bench import tiny_policy
    from test_dialogues import Script, step_of, user_row, write_queries
    from trl import GRPOConfig, GRPOTrainer

    from personaemp.llm.settings import LLMSettings
    from personaemp.training.dialogue_rollouts import rollout_func_for, session_reward
    from personaemp.training.export import write_export
    from personaemp.training.interaction import SimulatedUserInteraction

    print(f"trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")
    work = Path(tempfile.mkdtemp(prefix="dialogue_grpo_bench-"))
    splits = work / "splits"
    (splits / "random").mkdir(parents=True)
    write_queries(splits / "random" / "train.jsonl", [user_row("u0"), user_row("u1")])
    exported = work / "train.jsonl"
    write_export(splits, exported, format="trl", part="train", dialogues=True)
    dataset = datasets.load_dataset("json", data_files=str(exported), split="train")
    users = {json.dumps(row["prompt"], sort_keys=True): row["interaction_kwargs"] for row in dataset}
    torch.manual_seed(0)
    tokenizer, model = tiny_policy([m["content"] for row in dataset for m in row["prompt"]])
    print(
        f"policy: {sum(p.numel() for p in model.parameters()):,} parameters (random), {len(dataset)} prompts"
    )

    counts: Counter = Counter()
    with FakeOpenAI(responder=Script(bad=varied_user)) as server:
        settings = LLMSettings(base_urls=[server.base_url], model="sim", work_dir=work / "w",
                               api_key="sk-test")  # fmt: skip
        interaction = SimulatedUserInteraction({"max_turns": args.max_turns}, settings=settings)
        rollout_func = rollout_func_for(interaction, users, max_new_tokens=args.max_new_tokens, counts=counts)
        config = GRPOConfig(
            output_dir=str(work / "out"), max_steps=args.steps, num_generations=args.generations,
            per_device_train_batch_size=2 * args.generations, max_completion_length=512,
            learning_rate=1e-5, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
            bf16=False, seed=0,
        )  # fmt: skip
        trainer = GRPOTrainer(model=model, reward_funcs=[session_reward], args=config, train_dataset=dataset,
                              processing_class=tokenizer, rollout_func=rollout_func)  # fmt: skip
        steps: list[dict] = []

        def tokens() -> int:
            total = interaction.service.engine.accounting.totals().__dict__
            return total.get("prompt_tokens", 0) + total.get("completion_tokens", 0)

        class Figures(transformers.TrainerCallback):
            def on_step_begin(self, *a, **k):
                engine = interaction.service.engine
                self.before = (time.perf_counter(), server.count, tokens() if engine else 0, Counter(counts))

            def on_step_end(self, *a, **k):
                started, requests, used, seen = self.before
                steps.append({"seconds": time.perf_counter() - started, "requests": server.count - requests,
                              "tokens": tokens() - used, "counts": counts - seen})  # fmt: skip

        trainer.add_callback(Figures())
        trainer.train()
        by_step = Counter(step_of(r.body) for r in server.chat_requests)
    logs = [line for line in trainer.state.log_history if "loss" in line]
    for number, (step, log) in enumerate(zip(steps, logs, strict=False), 1):
        done, rollouts = step["counts"], step["counts"]["prompts_handed"]
        print(
            f"step {number}: {rollouts} rollouts ({done['distinct_prompts_handed']} distinct prompts "
            f"handed to rollout_func), {done['supporter_turns']} supporter turns, {step['requests']} "
            f"simulator requests ({step['requests'] / rollouts:.1f} a session), {step['tokens']:,} "
            f"simulator tokens ({step['tokens'] / rollouts:,.0f} a session), reward mean "
            f"{log.get('reward', float('nan')):.3f} std {log.get('reward_std', float('nan')):.3f}, "
            f"loss {log['loss']:.4f}, grad norm {log.get('grad_norm', float('nan')):.4f}, "
            f"{step['seconds']:.1f} s"
        )
    ended = {k.removeprefix("ended_by_"): v for k, v in counts.items() if k.startswith("ended_by_")}
    print(f"GRPO: {trainer.state.global_step} steps; sessions ended by {ended}; "
          f"simulator requests by step {dict(by_step)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
