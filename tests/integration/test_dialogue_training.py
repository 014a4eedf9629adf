"""The simulated user as verl's Interaction (training/interaction.py) against the test server,
and `personaemp export --dialogues` (the rows verl's multi-turn rollouts read)."""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from fake_openai import PROFILES, FakeOpenAI
from test_dialogues import NEED, Script, settings_for, step_of, user_row, write_queries
from test_sessions import Judged, session_step
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.errors import InputError
from personaemp.training import interaction
from personaemp.training.export import write_export
from personaemp.training.interaction import InteractionOptions, SimulatedUserInteraction, compute_score

REPLY = "<think>she feels guilty</think>It makes sense to want rest after those shifts."
YAML = f"""interaction:
  - name: personaemp
    class_name: {interaction.CLASS_PATH}
    config: {{config: CONFIG, max_turns: 2, session_reward: emotion}}
"""


def splits_with(tmp_path: Path, users: int = 1) -> Path:
    splits = tmp_path / "splits"
    (splits / "random").mkdir(parents=True)
    write_queries(splits / "random" / "train.jsonl", [user_row(f"u{n}") for n in range(users)])
    write_queries(splits / "random" / "test.jsonl", [user_row("t1")])
    return splits


def exported(tmp_path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    output = tmp_path / "train.parquet"
    write_export(splits_with(tmp_path), output, format="verl", dialogues=True)
    return pq.read_table(output).to_pylist()


def drive(agent, kwargs: dict, replies: list[str]) -> list[tuple]:
    """What verl's agent loop does: start, then per policy reply one generate_response."""

    async def run():
        instance = await agent.start_interaction("req-1", **kwargs)
        messages = [{"role": "user", "content": kwargs["user"]["query"]}]
        found = []
        for text in replies:
            messages.append({"role": "assistant", "content": text})
            result = await agent.generate_response(instance, messages, **kwargs)
            found.append(result)
            messages.append({"role": "user", "content": result[1]})
            if result[0]:
                break
        found.append(await agent.calculate_score(instance))
        await agent.finalize_interaction(instance)
        return found

    return asyncio.run(run())


def test_export_dialogues_writes_interaction_kwargs_verl_reads(tmp_path):
    rows = exported(tmp_path)
    assert len(rows) == 1
    kwargs = rows[0]["extra_info"]["interaction_kwargs"]
    assert kwargs["name"] == "personaemp"
    user = kwargs["user"]
    assert user["query_id"] == "u0-q1" and user["memory_ids"] == ["u0-m1", "u0-m2"]
    assert user["profile"].startswith("A caring nurse") and user["big_five"]["openness"] == "medium"
    assert user["query"] in rows[0]["prompt"][-1]["content"], "the supporter's opening: respond's prompt"
    assert NEED not in json.dumps(rows), "no hidden need in the data: it is written per session"
    trl = tmp_path / "train.jsonl"
    write_export(splits_with(tmp_path / "t"), trl, format="trl", dialogues=True)
    assert json.loads(trl.read_text().splitlines()[0])["interaction_kwargs"]["name"] == "personaemp"
    plain = tmp_path / "plain.parquet"
    write_export(splits_with(tmp_path / "p"), plain, format="verl")
    import pyarrow.parquet as pq

    assert "interaction_kwargs" not in pq.read_table(plain).to_pylist()[0]["extra_info"]


@pytest.mark.parametrize("profile", PROFILES)
def test_two_turns_answered_as_the_user_with_the_emotion_as_the_session_reward(tmp_path, profile):
    kwargs = exported(tmp_path)[0]["extra_info"]["interaction_kwargs"]
    with FakeOpenAI(responder=Script(), profile=profile) as server:
        agent = SimulatedUserInteraction({"max_turns": 2}, settings=settings_for(server, tmp_path / "w"))
        first, second, score = drive(agent, kwargs, [REPLY, "Resting is not selfish."])
    assert server.errors == []
    steps = Counter(step_of(r.body) for r in server.chat_requests)
    if profile == PROFILES[0]:  # others may ask the first request twice (the structured mode negotiated)
        # and the safety term's behaviour judge, once per supporter turn when the session ends
        assert steps == {"hidden_need": 1, "simulate": 2, "in_character": 2, "behaviours": 2}
    simulated = [r.body for r in server.chat_requests if step_of(r.body) == "simulate"]
    assert "she feels guilty" not in json.dumps(simulated[0]), "the policy's reasoning is removed"
    assert "It makes sense to want rest" in json.dumps(simulated[0])
    terminate, text, turn_score, extra = first
    assert not terminate and turn_score == 0.45 and extra["emotion"] == 45 and NEED not in text
    terminate, _, turn_score, extra = second
    assert terminate and extra["ended_by"] == "max_turns" and turn_score == extra["session_reward"] == 0.5
    assert score == 0.5
    assert agent.sessions == {}, "finalize_interaction forgets the session"
    assert compute_score(extra_info={"turn_scores": [first[2], second[2]]}) == 0.5


def test_both_mixes_the_final_emotion_with_peregrm_over_the_dialogue(tmp_path):
    kwargs = exported(tmp_path)[0]["extra_info"]["interaction_kwargs"]
    with FakeOpenAI(responder=Judged(score=4.0)) as server:
        agent = SimulatedUserInteraction(
            {"max_turns": 2, "session_reward": "both", "weight": 0.5},
            settings=settings_for(server, tmp_path / "w"),
        )
        _, second, score = drive(agent, kwargs, [REPLY, "Resting is not selfish."])
    judged = [r.body for r in server.chat_requests if session_step(r.body) == "session_judge"]
    assert len(judged) == 3, "one dynamic judgment per dimension, once, when the session ends"
    assert all("criteria" in b["response_format"]["json_schema"]["schema"]["properties"] for b in judged)
    assert NEED not in json.dumps(judged) and "Resting is not selfish." in json.dumps(judged[0])
    assert second[2] == score == pytest.approx(0.5 * 0.5 + 0.5 * 0.8)


def test_a_simulator_that_keeps_breaking_its_rules_ends_the_session_with_no_reward(tmp_path):
    kwargs = exported(tmp_path)[0]["extra_info"]["interaction_kwargs"]
    leak = {"thought": "t", "change": 3, "reason": "r", "need_met": False, "end": False,
            "text": f"What I need is {NEED}"}  # fmt: skip
    script = Script(bad=lambda step, body, seen: leak if step == "simulate" else None)
    with FakeOpenAI(responder=script) as server:
        agent = SimulatedUserInteraction({"turn_attempts": 2}, settings=settings_for(server, tmp_path / "w"))
        (terminate, text, turn_score, extra), score = drive(agent, kwargs, [REPLY])
    assert terminate and text == "" and extra["ended_by"] == "simulator_failed" and extra["simulator_failed"]
    # the simulator failed, not the policy: no reward (before: 0.4, the emotion it had)
    assert turn_score is None and score is None
    assert agent.counts["simulator_failures"] == 1


def test_one_engine_per_process_and_bad_config(tmp_path):
    with FakeOpenAI(responder=Script()) as server:
        settings = settings_for(server, tmp_path / "w")
        a = SimulatedUserInteraction({}, settings=settings)
        b = SimulatedUserInteraction({"max_turns": 3}, settings=settings)
        assert a.service is b.service
    with pytest.raises(InputError, match="session_reward takes emotion, peregrm, both"):
        InteractionOptions.of({"session_reward": "joy"})
    with pytest.raises(InputError, match="interaction config: no key 'turns'"):
        InteractionOptions.of({"turns": 3})
    with pytest.raises(InputError, match=r"interaction_kwargs: no simulated user"):
        asyncio.run(SimulatedUserInteraction({}, settings=settings).start_interaction("x", name="personaemp"))


def test_the_options_read_as_the_config_does_and_bad_calls_name_what_is_wrong(tmp_path):
    assert InteractionOptions.of({"max_turns": "4", "character_check": "no"}) == InteractionOptions(
        max_turns=4, character_check=False
    )
    assert InteractionOptions.of({"weight": "0.25", "character_check": "yes"}).weight == 0.25
    for config, wrong in [
        ({"max_turns": "four"}, "max_turns takes int, not 'four'"),
        ({"character_check": "maybe"}, "character_check takes bool, not 'maybe'"),
        ({"max_turns": True}, "max_turns takes int, not True"),
        ({"session_reward": 3}, "session_reward takes str, not 3"),
    ]:
        with pytest.raises(InputError, match=re.escape(wrong)):
            InteractionOptions.of(config)
    kwargs = exported(tmp_path)[0]["extra_info"]["interaction_kwargs"]
    with FakeOpenAI(responder=Script()) as server:
        agent = SimulatedUserInteraction({}, settings=settings_for(server, tmp_path / "w"))

        async def calls():
            with pytest.raises(InputError, match="no session 'nope'"):
                await agent.generate_response("nope", [{"role": "assistant", "content": "hi"}])
            with pytest.raises(InputError, match="no session 'nope'"):
                await agent.calculate_score("nope")
            user = {k: v for k, v in kwargs["user"].items() if k != "memories"}
            with pytest.raises(InputError, match="the simulated user has no memories"):
                await agent.start_interaction("x", **{**kwargs, "user": user})
            instance = await agent.start_interaction("y", **kwargs)
            for empty in ([{"role": "assistant", "content": "  "}], [{"role": "user", "content": "hi"}]):
                with pytest.raises(InputError, match="no supporter message to answer"):
                    await agent.generate_response(instance, empty)

        asyncio.run(calls())
        assert [step_of(r.body) for r in server.chat_requests] == ["hidden_need"], "nothing simulated"


def test_the_documented_yaml_names_a_class_verl_can_load(tmp_path):
    """verl's loader: `class_name` imported by module path, built with `config` (its name added)."""
    spec = yaml.safe_load(YAML)["interaction"][0]
    module, name = spec["class_name"].rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    config = tmp_path / "personaemp.toml"
    config.write_text('[llm]\nbase_url = ["http://127.0.0.1:9/v1"]\nmodel = "sim"\n', encoding="utf-8")
    built = cls(config={**spec["config"], "config": str(config), "name": spec["name"]})
    assert built.name == "personaemp" and built.options.max_turns == 2
    assert built.settings.model == "sim" and built.settings.base_urls == ["http://127.0.0.1:9/v1"]


def documented_agent_loops() -> list[dict]:
    """The agent-loop YAML docs/multi-turn-training.md gives for verl 0.9."""
    page = Path(__file__).resolve().parents[2] / "docs" / "multi-turn-training.md"
    page = page.read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", page, re.S)
    return yaml.safe_load(next(b for b in blocks if "SimulatedUserAgentLoop" in b))


class TinyPolicy:
    """verl's LLM server client (`generate` -> TokenOutput), answered by a random tiny model here."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer, self.calls = model, tokenizer, 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        import torch
        from verl.workers.rollout.replica import TokenOutput

        self.calls += 1
        with torch.no_grad():
            out = self.model.generate(torch.tensor([prompt_ids]), max_new_tokens=12, do_sample=True,
                                      pad_token_id=self.tokenizer.pad_token_id)  # fmt: skip
        return TokenOutput(token_ids=out[0, len(prompt_ids) :].tolist())


def test_verls_own_agent_loop_worker_drives_two_turns_with_the_documented_yaml(tmp_path, monkeypatch):
    """verl 0.8 removed the Interaction API (verl.interactions); 0.9's multi-turn rollouts are agent
    loops. verl's own AgentLoopWorker registers the documented YAML, hydra builds the class, and its
    generate_sequences runs one rollout: a tiny random policy on CPU, the simulated user on the test
    server, two supporter turns, the session reward as the trajectory's score."""
    pytest.importorskip("verl", reason="verl is not installed (pip install -e '.[verl]')")
    pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop does not import here")
    import numpy as np
    import pandas
    import torch
    import verl
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.dataset.rl_dataset import RLHFDataset

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "training"))
    try:
        from grpo_bench import tiny_policy
    finally:
        sys.path.pop(0)
    parquet = tmp_path / "train.parquet"
    write_export(splits_with(tmp_path), parquet, format="verl", dialogues=True)
    torch.manual_seed(0)
    tokenizer, model = tiny_policy([m["content"] for p in pandas.read_parquet(parquet)["prompt"] for m in p])
    model.save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    policy = TinyPolicy(model, tokenizer)
    with FakeOpenAI(responder=Script()) as server:
        config = tmp_path / "personaemp.toml"
        config.write_text(
            f'[llm]\nbase_url = ["{server.base_url}"]\nmodel = "sim"\nwork_dir = "{tmp_path / "w"}"\n',
            encoding="utf-8",
        )
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        loops = documented_agent_loops()
        loops[0]["interaction"].update(config=str(config), max_turns=2, session_reward="emotion")
        path = tmp_path / "agent_loops.yaml"
        path.write_text(yaml.safe_dump(loops), encoding="utf-8")
        defaults = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
        trainer = OmegaConf.load(defaults)
        trainer.actor_rollout_ref.model.path = str(tmp_path / "policy")
        rollout = trainer.actor_rollout_ref.rollout
        rollout.update(name="vllm", prompt_length=1024, response_length=512, calculate_log_probs=False)
        rollout.multi_turn.update(enable=True, max_assistant_turns=3)
        rollout.agent.update(agent_loop_config_path=str(path), default_agent_loop=loops[0]["name"])
        worker = AgentLoopWorker(trainer, llm_client=policy)
        dataset = RLHFDataset(str(parquet), tokenizer, OmegaConf.create({
            "prompt_key": "prompt", "max_prompt_length": 1024, "filter_overlong_prompts": False,
            "truncation": "error", "return_raw_chat": True}))  # fmt: skip
        item = dataset[0]
        keys = [key for key, value in item.items() if not isinstance(value, torch.Tensor)]
        batch = DataProto.from_dict(
            tensors={"dummy": torch.zeros(1, 1)},
            non_tensors={key: np.array([item[key]], dtype=object) for key in keys},
        )
        out = asyncio.run(worker.generate_sequences(batch))
    assert server.errors == []
    assert Counter(step_of(r.body) for r in server.chat_requests) == {"hidden_need": 1, "simulate": 2,
                                                                      "in_character": 2}  # fmt: skip
    assert policy.calls == 2, "the session ended at max_turns, before verl's max_assistant_turns"
    assert list(out.non_tensor_batch["turn_scores"][0]) == [0.45, 0.5]
    assert out.batch["rm_scores"].sum().item() == pytest.approx(0.5), "the session reward: final emotion"
    assert out.non_tensor_batch["__num_turns__"][0] == 4  # the opening, two replies, the user between
    response = out.batch["responses"][0][out.batch["attention_mask"][0, 1024:].bool()]
    mask = out.batch["response_mask"][0][: len(response)]
    assert mask[0] == 1 and mask[-1] == 1 and 0 < int(mask.sum()) < len(response), "user tokens: mask 0"
    simulated = [r.body for r in server.chat_requests if step_of(r.body) == "simulate"]
    first = tokenizer.decode(response[: mask.tolist().index(0)], skip_special_tokens=True)
    seen = "".join(str(m["content"]) for m in simulated[0]["messages"])
    assert first.strip() and first.strip()[:20] in seen, "the simulated user read the policy's reply"


def test_export_dialogues_on_the_command_line(tmp_path):
    splits = splits_with(tmp_path)
    output = tmp_path / "rollouts.parquet"
    result = CliRunner().invoke(app, [
        "export", "--splits", str(splits), "--format", "verl", "--dialogues", "-o", str(output),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    import pyarrow.parquet as pq

    assert pq.read_table(output).to_pylist()[0]["extra_info"]["interaction_kwargs"]["user"]["user_id"] == "u0"
