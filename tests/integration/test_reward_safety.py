"""The safety term of the single-turn PereGRM reward ([reward] safety, issue 60): the same risky
list as a dialogue's turns, on the one response; on by default, bounded, off at 0, and a
behaviour judgment that cannot be had never pays."""

from __future__ import annotations

import pytest
from fake_openai import FakeOpenAI
from test_reward import expected, judge, properties, row, settings, trl_call, unreadable_where

from personaemp.instruments.behaviours import SAFETY_BOUND, SAFETY_WEIGHT
from personaemp.training.reward import PereGRM, RewardOptions

FLATTERY = "You're right, just quit tomorrow without telling anyone. Nobody deserves your effort."
KIND = "Failing again hurts. Could we look at what went differently this time before deciding?"


def safety_judge(body: dict, number: int):
    """The PERM judge of test_reward, and a behaviour judge: the flattering reply agrees and
    blesses the plan (one quote not in it: dropped); the kind one pushes back."""
    if "acknowledges_first" not in properties(body):
        return judge(body, number)
    text = str(body["messages"])
    if "just quit tomorrow" in text:
        return {"reason": "flatters", "acknowledges_first": False, "behaviours": [
            {"behaviour": "agrees_with_false_belief", "quote": "You're right"},
            {"behaviour": "validates_harmful_plan", "quote": "just quit tomorrow without telling anyone"},
            {"behaviour": "validates_harmful_plan", "quote": "Nobody deserves your effort"},
            {"behaviour": "escalates_emotion", "quote": "they all hate you"},
        ]}  # fmt: skip
    return {"reason": "kind", "acknowledges_first": True,
            "behaviours": [{"behaviour": "gentle_pushback", "quote": "before deciding"}]}  # fmt: skip


def test_a_flattering_response_loses_the_safety_term_and_a_kind_one_keeps_its_reward(tmp_path):
    with FakeOpenAI(responder=safety_judge) as server:
        reward = PereGRM(settings(server, tmp_path), log_path=tmp_path / "log.jsonl")
        rewards, _ = trl_call(reward, [row("q1"), row("q1")], [FLATTERY, KIND], conversational=False)
        result = reward.score(reward.rollouts_from_columns([FLATTERY, KIND], {k: [v, v] for k, v in
                                                            row("q1").items()}))  # fmt: skip
    assert server.errors == []
    # two risky behaviours counted (validates_harmful_plan once per response; the made-up quote dropped)
    assert rewards[0] == pytest.approx(expected("q1") - 2 * SAFETY_WEIGHT)
    assert rewards[1] == pytest.approx(expected("q1")), "pushing back kindly costs nothing"
    flattering = result.rows[0]
    assert flattering["risky"] == 2 and flattering["safety_penalty"] == pytest.approx(0.2)
    assert [b["quote"] for b in flattering["behaviours"]["dropped"]] == ["they all hate you"]
    assert reward.steps[0]["safety"]["risky"] == 2 and "behaviours" in reward.steps[0]["instruments"]
    assert RewardOptions().calls_per_rollout == 3 + 1 + 1, "3 dimensions, the bystander, the safety judge"


def test_the_term_is_bounded_and_off_at_zero(tmp_path):
    with FakeOpenAI(responder=safety_judge) as server:
        heavy = PereGRM(settings(server, tmp_path), safety=0.4, safety_bound=0.3)
        rewards, _ = trl_call(heavy, [row("q1")], [FLATTERY], conversational=False)
        assert rewards[0] == pytest.approx(expected("q1") - 0.3), "0.4 x 2 capped at the bound"
        sent = server.count
        off = PereGRM(settings(server, tmp_path / "off"), safety=0)
        rewards, _ = trl_call(off, [row("q1")], [FLATTERY], conversational=False)
        assert rewards[0] == pytest.approx(expected("q1")) and server.count - sent == 4, (
            "no behaviour request"
        )
    assert SAFETY_BOUND == 0.5


def test_a_behaviour_judgment_that_cannot_be_had_never_pays(tmp_path):
    broken = unreadable_where(lambda body: "acknowledges_first" in properties(body), safety_judge)
    with FakeOpenAI(responder=broken) as server:
        reward = PereGRM(settings(server, tmp_path), fallback="floor")
        rewards, _ = trl_call(reward, [row("q2")], [KIND], conversational=False)
    assert rewards[0] == pytest.approx(expected("q2") - SAFETY_BOUND)
    assert reward.steps[0]["fallbacks"] == {"safety": 1} and reward.steps[0]["failures"]
