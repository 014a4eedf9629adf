"""The person's voice as a switch (`--voice K`, instruments/voice.py): gen-dialogues' simulator
requests carry the user's own real messages by the declared rule and none with --voice 0;
no_echo asks again a simulated turn that copies one; the training Interaction's `voice` key."""

from __future__ import annotations

import json

from fake_openai import FakeOpenAI
from test_dialogues import Script, rows_of, settings_for, step_of, user_row, write_queries
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.dialogues import DialogueOptions, generate_dialogues
from personaemp.instruments.simulator import SimulatedUser, read_units

OWN = [
    "can you help me write a shift swap request",
    "my manager never answers my emails on time",
    "```python\nprint('x')\n```",  # code: never shown as a voice
    "ok thanks that helps a lot for tonight",
]


def row_with_voice(user_id: str) -> dict:
    row = user_row(user_id)
    row["turns"] = [{"role": "user", "text": text} for text in OWN]
    return row


def simulator_bodies(tmp_path, *args: str) -> list[str]:
    tmp_path.mkdir()
    queries = write_queries(tmp_path / "queries.jsonl", [row_with_voice("u1")])
    output = tmp_path / "dialogues.jsonl"
    with FakeOpenAI(responder=Script()) as server:
        result = CliRunner().invoke(
            app,
            ["gen-dialogues", "-i", str(queries), "-o", str(output), "--base-url", server.base_url,
             "--model", "fake", "--work-dir", str(tmp_path / "work"), *args],
            env={"OPENAI_API_KEY": "sk-test"},
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        bodies = [r.body for r in server.chat_requests if step_of(r.body) != "supporter"]
    assert rows_of(output)
    return [json.dumps(body, ensure_ascii=False) for body in bodies]


def test_voice_zero_removes_the_users_real_messages_from_the_simulator(tmp_path):
    shown = simulator_bodies(tmp_path / "on")
    assert all("How they write" in body for body in shown)
    assert all("my manager never answers my emails" in body for body in shown)
    assert not any("print(" in body for body in shown)  # code is not a voice
    hidden = simulator_bodies(tmp_path / "off", "--voice", "0")
    assert hidden and not any(text in body for body in hidden for text in OWN[:2] + OWN[3:])
    assert not any("How they write" in body for body in hidden)


def test_voice_k_keeps_the_newest_k(tmp_path):
    path = write_queries(tmp_path / "q.jsonl", [row_with_voice("u1")])
    unit = read_units(path, voice=1)[0]
    assert unit["voice"] == "- ok thanks that helps a lot for tonight"
    assert read_units(path, voice=0)[0]["voice"] == ""
    assert (
        SimulatedUser.of_unit(read_units(path, voice=0)[0]).values()["profile"].count("How they write") == 0
    )


def test_a_turn_copying_a_real_message_is_asked_again(tmp_path):
    """no_echo covers the voice block: a turn repeating 6+ words of an exemplar is re-asked."""

    copied = []

    def copy_first(step, body, seen):
        if step == "simulate" and not copied:
            copied.append(body)
            return {"thought": "t", "change": 1, "reason": "r", "need_met": False, "end": False,
                    "text": "so my manager never answers my emails on time again"}  # fmt: skip
        return None

    queries = write_queries(tmp_path / "queries.jsonl", [row_with_voice("u1")])
    output = tmp_path / "dialogues.jsonl"
    with FakeOpenAI(responder=Script(bad=copy_first)) as server:
        generate_dialogues(
            queries, output, settings_for(server, tmp_path / "work"), options=DialogueOptions()
        )
    [dialogue] = rows_of(output)
    rejected = [r for t in dialogue["turns"] for r in t.get("rejected") or []]
    assert rejected and all("their real message" in r["no_echo"] for r in rejected)
    assert all("my manager never answers my emails" not in t["text"] for t in dialogue["turns"][1:])


def test_interaction_voice_key(tmp_path):
    from personaemp.training.interaction import InteractionOptions

    assert InteractionOptions.of({"voice": "0"}).voice == 0
    assert InteractionOptions.of({}).voice is None
