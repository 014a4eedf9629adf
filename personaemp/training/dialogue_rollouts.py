"""TRL's `rollout_func` with the simulated user (GRPOTrainer(rollout_func=...), TRL >= 1.16,
experimental): per prompt the policy answers, `SimulatedUserInteraction` answers as the user,
until the session ends; the function returns the token ids, the environment mask (1 over the
policy's tokens, 0 over the user's) and the session reward, which reaches the reward function
as the `session_reward` column. The session reward is the Interaction's: the emotion (or
PereGRM) less the safety term, as in verl (training/interaction.py).

    users = {json.dumps(row["prompt"], sort_keys=True): row["interaction_kwargs"] for row in dataset}
    rollout_func = rollout_func_for(SimulatedUserInteraction({"config": "personaemp.toml"}), users)
    GRPOTrainer(..., reward_funcs=[session_reward], rollout_func=rollout_func)

TRL hands each prompt as many times as it wants completions, and only the prompt: the user is
found by the prompt. `generate(trainer, token_ids) -> new token ids` is the policy's turn; by
default the trainer's model samples `max_new_tokens` (torch is imported only then).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any


def model_generate(max_new_tokens: int) -> Callable[[Any, list[int]], list[int]]:
    """The policy's turn with the trainer's model (transformers' generate, sampling)."""

    def generate(trainer, context: list[int]) -> list[int]:
        import torch

        tokenizer = trainer.processing_class
        ids = torch.tensor([context])
        with torch.no_grad():
            out = trainer.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=True,
                                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        return out[0, ids.shape[1] :].tolist()

    return generate


def rollout_func_for(
    interaction,
    users: Mapping[str, Mapping[str, Any]],
    *,
    max_new_tokens: int = 256,
    generate: Callable[[Any, list[int]], list[int]] | None = None,
    counts: Counter | None = None,
):
    """TRL's rollout_func: (prompts, trainer) -> prompt_ids, completion_ids, logprobs (None),
    env_mask and session_reward per prompt; `users`: the prompt (canonical JSON) -> its
    interaction_kwargs (`personaemp export --format trl --dialogues`)."""
    generate = generate or model_generate(max_new_tokens)
    counts = counts if counts is not None else Counter()
    loop = asyncio.new_event_loop()  # one loop for the run: the Interaction's coroutines run on it

    def tokens(tokenizer, messages: list[dict]) -> list[int]:
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))  # fmt: skip

    async def session(prompt: list[dict], trainer) -> dict:
        tokenizer = trainer.processing_class
        instance = await interaction.start_interaction(None, **users[json.dumps(prompt, sort_keys=True)])
        messages = list(prompt)
        prompt_ids = tokens(tokenizer, messages)
        completion: list[int] = []
        mask: list[int] = []
        try:
            while True:
                policy = list(generate(trainer, prompt_ids + completion))
                if policy[-1:] != [tokenizer.eos_token_id]:
                    policy.append(tokenizer.eos_token_id)  # the turn closes where the budget cut it
                completion += policy
                mask += [1] * len(policy)
                counts["supporter_turns"] += 1
                text = tokenizer.decode(policy, skip_special_tokens=True)
                messages.append({"role": "assistant", "content": text})
                ends, reply, _, extra = await interaction.generate_response(instance, messages)
                if ends:
                    counts[f"ended_by_{extra.get('ended_by')}"] += 1
                    break
                messages.append({"role": "user", "content": reply})
                user = tokens(tokenizer, [{"role": "user", "content": reply}])
                completion += user
                mask += [0] * len(user)
            reward = await interaction.calculate_score(instance)
        finally:
            await interaction.finalize_interaction(instance)
        return {"prompt_ids": prompt_ids, "completion_ids": completion, "env_mask": mask, "reward": reward}

    def rollout_func(prompts: list, trainer) -> dict:
        counts["prompts_handed"] += len(prompts)
        counts["distinct_prompts_handed"] += len({json.dumps(p, sort_keys=True) for p in prompts})
        done = [loop.run_until_complete(session(prompt, trainer)) for prompt in prompts]
        return {
            "prompt_ids": [d["prompt_ids"] for d in done],
            "completion_ids": [d["completion_ids"] for d in done],
            "logprobs": None,  # only vLLM's importance-sampling correction reads them
            "env_mask": [d["env_mask"] for d in done],
            "session_reward": [d["reward"] for d in done],
        }

    return rollout_func


def session_reward(completions, session_reward, **kwargs) -> list[float | None]:
    """The reward function: the session reward rollout_func returned beside each completion
    (None: the simulator failed that session; TRL leaves it out)."""
    return [None if r is None else float(r) for r in session_reward]


__all__ = ["model_generate", "rollout_func_for", "session_reward"]
