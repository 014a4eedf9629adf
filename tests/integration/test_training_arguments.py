"""Issue 63 item 18: the training APIs take only what the config file takes, checked once where
the [reward] keys are (training/options.py), with errors that name the argument; the
Interaction refuses messages, memories and instance ids it cannot use, in one line."""

from __future__ import annotations

import asyncio
import math

import pytest
from fake_openai import FakeOpenAI
from test_dialogue_training import exported
from test_dialogues import Script, settings_for

from personaemp.errors import InputError
from personaemp.llm.settings import LLMSettings
from personaemp.training.interaction import SimulatedUserInteraction, compute_score
from personaemp.training.reward import FixedCriteriaReward, PereGRM, Reward, RewardOptions

SETTINGS = LLMSettings(base_urls=["http://127.0.0.1:9/v1"], model="m")


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: PereGRM(SETTINGS, reward_lambda=-0.5), "PereGRM: reward_lambda= must be at least 0"),
        (
            lambda: PereGRM(SETTINGS, reward_lambda=math.nan),
            "PereGRM: reward_lambda= input should be a finite",
        ),
        (
            lambda: FixedCriteriaReward(SETTINGS, reward_lambda=math.inf),
            "FixedCriteriaReward: reward_lambda=",
        ),
        (lambda: PereGRM(SETTINGS, samples="three"), "PereGRM: samples= must be a whole number, not 'three'"),
        (lambda: PereGRM(SETTINGS, samples=0), "PereGRM: samples= must be at least 1"),
        (lambda: Reward(SETTINGS, RewardOptions(dynamic=False, samples=2)), "Reward: dynamic= is false"),
    ],
)
def test_the_reward_refuses_what_the_config_file_refuses_naming_the_argument(make, named):
    with pytest.raises(InputError) as caught:
        make()
    assert named in str(caught.value)


def test_the_reward_reads_a_number_given_as_text_as_the_config_file_does():
    assert PereGRM(SETTINGS, samples="3").options.samples == 3  # [reward] samples = "3" reads 3 too


@pytest.mark.parametrize(
    ("extra_info", "named"),
    [
        ({"turn_scores": [0.5, math.nan]}, "not finite"),
        ({"turn_scores": [0.5, "high"]}, "must be a list of numbers"),
        ({"turn_scores": 0.5}, "must be a list of numbers"),
        ({"turn_scores": [[0.5]]}, "must be a list of numbers"),
        ({"turn_scores": [True]}, "must be a list of numbers"),
    ],
)
def test_compute_score_refuses_odd_turn_scores_in_one_line(extra_info, named):
    with pytest.raises(InputError, match=named):
        compute_score(extra_info=extra_info)


def test_compute_score_takes_the_last_score_and_skips_a_failed_turn():
    assert compute_score(extra_info={"turn_scores": [0.2, 0.7, None]}) == 0.7
    assert compute_score(extra_info={"turn_scores": []}) == 0.0
    assert compute_score(extra_info=None) == 0.0


def test_the_interaction_refuses_bad_messages_memories_and_a_live_instance_id(tmp_path):
    kwargs = exported(tmp_path)[0]["extra_info"]["interaction_kwargs"]
    with FakeOpenAI(responder=Script()) as server:
        agent = SimulatedUserInteraction({}, settings=settings_for(server, tmp_path / "w"))

        async def calls():
            for memories, named in [
                ("a text", "user.memories must be a list"),
                ([{"memory_id": 3}], "user.memories."),
            ]:
                with pytest.raises(InputError, match=named):
                    await agent.start_interaction(
                        "m", **{**kwargs, "user": {**kwargs["user"], "memories": memories}}
                    )
            with pytest.raises(InputError, match="user.memory_ids must be a list of ids"):
                await agent.start_interaction("m", **{**kwargs, "user": {**kwargs["user"], "memory_ids": 7}})
            instance = await agent.start_interaction("live", **kwargs)
            with pytest.raises(InputError, match="'live' is a session still open"):
                await agent.start_interaction("live", **kwargs)
            for messages in (["hello"], "hello", [{"role": "user", "content": "hi"}, 3]):
                with pytest.raises(InputError, match="messages must be a list of chat messages"):
                    await agent.generate_response(instance, messages)
            await agent.finalize_interaction(instance)
            assert await agent.start_interaction("live", **kwargs) == "live"  # finalized: the id is free

        asyncio.run(calls())
