"""The simulated user in verl >= 0.8, whose rollouts are agent loops: verl 0.8 removed the
multi-turn `Interaction` API (`verl.interactions`, `multi_turn.interaction_config_path`) that
`SimulatedUserInteraction` was written for (verl 0.4-0.7), so this agent loop drives it.

verl registers it from an agent-loop YAML (`actor_rollout_ref.rollout.agent.agent_loop_config_path`)
and builds one per sample with hydra, with the YAML entry's other keys as arguments:

    - name: personaemp
      _target_: personaemp.training.agent_loop.SimulatedUserAgentLoop
      interaction: {config: personaemp.toml, max_turns: 6, session_reward: emotion}

`interaction` is SimulatedUserInteraction's config (InteractionOptions). Rows reach it with
`actor_rollout_ref.rollout.agent.default_agent_loop=personaemp`; each row's
`extra_info.interaction_kwargs` (`personaemp export --dialogues`) names the simulated user.

Per sample: the policy answers (its tokens: response_mask 1), the simulated user replies (its
tokens: 0), until the session ends, verl's `max_assistant_turns` or the response length. The
trajectory's `reward_score` is the session reward (so verl asks no reward function), and
`extra_fields.turn_scores` the turn scores (what `interaction.compute_score` reads where a reward
function is configured anyway). Importing this module needs verl; interaction.py does not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.utils.profiler import simple_timer

from personaemp.training.interaction import NAME, SimulatedUserInteraction

_interactions: dict[str, SimulatedUserInteraction] = {}


def interaction_for(config: Mapping[str, Any]) -> SimulatedUserInteraction:
    """One Interaction per config in the process (hydra builds an agent loop per sample)."""
    key = json.dumps(config, sort_keys=True, default=str)
    if key not in _interactions:
        _interactions[key] = SimulatedUserInteraction(config)
    return _interactions[key]


class SimulatedUserAgentLoop(AgentLoopBase):
    """A supporter (the policy) and the simulated user, turn by turn."""

    def __init__(self, *args, interaction: Mapping[str, Any] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.interaction = interaction_for({str(k): v for k, v in (interaction or {}).items()})
        self.response_length = self.rollout_config.response_length
        self.max_assistant_turns = self.rollout_config.multi_turn.max_assistant_turns

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        messages = [dict(m) for m in kwargs["raw_prompt"]]
        found = kwargs.get("interaction_kwargs") or (kwargs.get("extra_info") or {}).get("interaction_kwargs")
        interaction_kwargs = dict(found or {})
        interaction_kwargs.setdefault("name", NAME)
        agent = self.interaction
        request_id = uuid4().hex
        instance = await agent.start_interaction(request_id, **interaction_kwargs)
        metrics: dict[str, Any] = {}
        turn_scores: list[float] = []
        prompt_ids = await self.ct_build_initial_tokens(messages)
        tokens, mask, turns = list(prompt_ids), [], 0
        try:
            while True:
                with simple_timer("generate_sequences", metrics):
                    output = await self.server_manager.generate(
                        request_id=request_id, prompt_ids=tokens, sampling_params=sampling_params
                    )
                turns += 1
                merged, mask, _ = await self.ct_merge_assistant_token(tokens, output.token_ids, mask)
                tokens = merged.token_ids
                text = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
                messages.append({"role": "assistant", "content": text})
                if len(mask) >= self.response_length:
                    break  # verl's cut: the session reward as it stands
                ends, reply, score, _ = await agent.generate_response(instance, messages)
                if score is not None:  # None: the simulator failed this turn
                    turn_scores.append(score)
                if ends or (self.max_assistant_turns and turns >= self.max_assistant_turns):
                    break
                before = list(messages)
                messages.append({"role": "user", "content": reply})
                merged, user_mask, _ = await self.ct_merge_context_msg(before, messages, tokens, mask)
                if len(user_mask) >= self.response_length:
                    break
                tokens, mask = merged.token_ids, user_mask
            reward = await agent.calculate_score(instance)
        finally:
            failed = getattr(agent.sessions.get(instance), "ended_by", None) == "simulator_failed"
            penalty = getattr(agent.sessions.get(instance), "safety_penalty", 0.0)  # in the reward already
            await agent.finalize_interaction(instance)
        if failed:
            # The simulator failed, not the policy: verl has no per-sample "no reward", so the
            # session's tokens leave the loss (mask 0) and it is flagged (docs/multi-turn-training.md).
            mask, reward = [0] * len(mask), 0.0
        response = tokens[len(tokens) - len(mask) :]
        metrics.setdefault("num_preempted", -1)
        result = AgentLoopOutput(
            prompt_ids=tokens[: len(tokens) - len(mask)],
            response_ids=response[: self.response_length],
            response_mask=mask[: self.response_length],
            reward_score=reward,
            num_turns=sum(m.get("role") in ("user", "assistant") for m in messages),
            metrics=metrics,
        )
        result.extra_fields.update(
            {
                "turn_scores": turn_scores,
                "tool_rewards": [],
                "simulator_failed": failed,
                "safety_penalty": penalty,
            }
        )
        return result


__all__ = ["SimulatedUserAgentLoop", "interaction_for"]
