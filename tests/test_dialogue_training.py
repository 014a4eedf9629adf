"""The simulated user as verl's Interaction (training/interaction.py) against the test server,
and `personaemp export --dialogues` (the rows verl's multi-turn rollouts read)."""

from __future__ import annotations

import asyncio
import importlib
import json
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
        assert steps == {"hidden_need": 1, "simulate": 2, "in_character": 2}
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


def test_a_simulator_that_keeps_breaking_its_rules_ends_the_session(tmp_path):
    kwargs = exported(tmp_path)[0]["extra_info"]["interaction_kwargs"]
    leak = {"thought": "t", "change": 3, "reason": "r", "need_met": False, "end": False,
            "text": f"What I need is {NEED}"}  # fmt: skip
    script = Script(bad=lambda step, body, seen: leak if step == "simulate" else None)
    with FakeOpenAI(responder=script) as server:
        agent = SimulatedUserInteraction({"turn_attempts": 2}, settings=settings_for(server, tmp_path / "w"))
        (terminate, text, turn_score, extra), score = drive(agent, kwargs, [REPLY])
    assert terminate and text == "" and extra["ended_by"] == "simulator_failed"
    assert turn_score == score == 0.4, "the emotion it had: the opening's"
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


def test_verls_own_loader_drives_two_turns(tmp_path, monkeypatch):
    pytest.importorskip("verl")
    from verl.interactions.utils.interaction_registry import initialize_interactions_from_config

    kwargs = exported(tmp_path)[0]["extra_info"]["interaction_kwargs"]
    with FakeOpenAI(responder=Script()) as server:
        config = tmp_path / "personaemp.toml"
        config.write_text(
            f'[llm]\nbase_url = ["{server.base_url}"]\nmodel = "sim"\nwork_dir = "{tmp_path / "w"}"\n',
            encoding="utf-8",
        )
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        path = tmp_path / "interaction.yaml"
        path.write_text(YAML.replace("CONFIG", str(config)), encoding="utf-8")
        agent = initialize_interactions_from_config(str(path))["personaemp"]
        first, second, score = drive(agent, kwargs, [REPLY, "Resting is not selfish."])
    assert not first[0] and second[0] and score == 0.5


def test_export_dialogues_on_the_command_line(tmp_path):
    splits = splits_with(tmp_path)
    output = tmp_path / "rollouts.parquet"
    result = CliRunner().invoke(app, [
        "export", "--splits", str(splits), "--format", "verl", "--dialogues", "-o", str(output),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    import pyarrow.parquet as pq

    assert pq.read_table(output).to_pylist()[0]["extra_info"]["interaction_kwargs"]["user"]["user_id"] == "u0"
