"""gen-dialogues --seeker: hard-to-help simulated users (instruments/seekers.py, prompts/seekers.md)
against the test server: every style runs and names itself, its lines reach the simulator's
requests (in the user's language where written), a turn that breaks its style is asked again,
auto follows the declared Big Five table, and a row from before styles reads as cooperative."""

from __future__ import annotations

import json

import pytest
from fake_openai import FakeOpenAI
from test_dialogues import (
    Script,
    good_turn,
    rows_of,
    settings_for,
    step_of,
    text_of,
    user_row,
    write_queries,
)

from personaemp.dataset.dialogues import DialogueOptions, SimulatedUser, generate_dialogues, read_dialogues
from personaemp.errors import InputError
from personaemp.instruments import seekers
from personaemp.instruments.simulator import SIMULATE, build_user_turn_messages
from personaemp.prompts import load_prompt
from personaemp.records import BIG_FIVE, SEEKERS, Dialogue, DialogueTurn


def styled_turn(step, body, seen):
    """A simulated user that keeps its style's deterministic rule: an escalating one loses
    ground until its need is met."""
    if step != "simulate":
        return None
    turn = good_turn(body)
    if seekers.TURN_HEADING in text_of(body) and "you escalate" in text_of(body) and not turn["need_met"]:
        turn["change"] = -3
    return turn


def run_style(tmp_path, seeker: str, script=None, users=None, **options):
    queries = write_queries(tmp_path / "queries.jsonl", users or [user_row("u1")])
    output = tmp_path / f"dialogues-{seeker}.jsonl"
    with FakeOpenAI(responder=script or Script(bad=styled_turn)) as server:
        generate_dialogues(
            queries, output, settings_for(server, tmp_path / "work"),
            options=DialogueOptions(seeker=seeker, **options),
        )  # fmt: skip
    assert server.errors == []
    return rows_of(output), rows_of(tmp_path / "gen-dialogues.failures.jsonl"), server


@pytest.mark.parametrize("seeker", SEEKERS)
def test_every_style_runs_names_itself_and_reaches_the_simulator(tmp_path, seeker):
    rows, failures, server = run_style(tmp_path, seeker)
    assert failures == [] and len(rows) == 1 and rows[0]["seeker"] == seeker
    dialogue = read_dialogues(tmp_path / f"dialogues-{seeker}.jsonl")[0]
    assert dialogue.seeker == seeker
    by_step: dict[str, list[str]] = {}
    for request in server.chat_requests:
        by_step.setdefault(step_of(request.body), []).append(text_of(request.body))
    style = seekers.style_text()
    turn_text, check_text = style.part(seeker, "turn"), style.part(seeker, "check")
    if seeker == "cooperative":
        # the simulator's own requests, byte for byte: nothing added, no style rule recorded
        assert not any(seekers.TURN_HEADING in t or seekers.CHECK_HEADING in t for ts in by_step.values()
                       for t in ts)  # fmt: skip
        assert all(seekers.RULE not in (t.checks or {}) for t in dialogue.turns)
        assert seekers.PROMPT_FILE not in dialogue.provenance.prompts
        return
    assert turn_text and all(turn_text in t for t in by_step["simulate"])
    assert check_text and all(check_text in t for t in by_step["in_character"])
    need_text = style.part(seeker, "need")
    assert (need_text in by_step["hidden_need"][0]) if need_text else True
    assert dialogue.provenance.prompts[seekers.PROMPT_FILE] == style.hash
    ruled = seeker in ("guarded", "escalating")
    kept = [t for t in dialogue.turns[1:] if t.role == "user"]
    assert all((seekers.RULE in t.checks) == ruled for t in kept)
    if seeker == "escalating":
        assert [t.change for t in kept] == [-3, 5, 5], "it lost ground until its need was met"


def test_a_turn_that_breaks_its_style_is_asked_again_and_a_lost_one_names_its_seeker(tmp_path):
    # good_turn raises the emotion before the need is met: an escalating user breaks its rule.
    def once(step, body, seen):
        if step == "simulate" and "could not be used" in text_of(body):
            return styled_turn(step, body, seen)
        return None

    rows, failures, server = run_style(tmp_path, "escalating", script=Script(bad=once))
    assert failures == [] and len(rows) == 1
    first = rows[0]["turns"][2]
    assert [set(r) for r in first["rejected"]] == [{seekers.RULE, "text", "thought"}]
    assert "does not rise (+5)" in first["rejected"][0][seekers.RULE]
    assert first["checks"][seekers.RULE] is True and first["change"] == -3

    never = tmp_path / "never"
    never.mkdir()
    rows, failures, _ = run_style(never, "escalating", script=Script(), turn_attempts=2)
    assert rows == [] and len(failures) == 1
    assert failures[0]["seeker"] == "escalating" and seekers.RULE in failures[0]["error"]


def test_guarded_is_held_to_one_thing_at_a_time():
    assert seekers.style_kept("guarded", "Fine. Whatever.", need_met=False, change=0) == (True, "")
    passed, why = seekers.style_kept(
        "guarded", "I am tired. My brother wants me there. I also hate my job. And my ex called.",
        need_met=False, change=0,
    )  # fmt: skip
    assert not passed and "4 sentences" in why
    assert seekers.style_kept("resistant", "No.", need_met=False, change=5) is None, "judged only"


def test_auto_follows_the_declared_big_five_table(tmp_path):
    def levels(**given):
        return {t: given.get(t, "medium") for t in BIG_FIVE}

    cases = {
        "a": (levels(neuroticism="high", agreeableness="high"), "validation-seeking"),
        "b": (levels(neuroticism="high"), "escalating"),
        "c": (levels(agreeableness="low"), "resistant"),
        "d": (levels(extraversion="low"), "guarded"),
        "e": (levels(), "cooperative"),
    }
    users = []
    for user_id, (found, _) in cases.items():
        row = user_row(user_id)
        row["big_five"] = {t: {**row["big_five"][t], "level": level} for t, level in found.items()}
        users.append(row)
    rows, failures, _ = run_style(tmp_path, "auto", users=users)
    assert failures == []
    assert {r["user_id"]: r["seeker"] for r in rows} == {k: style for k, (_, style) in cases.items()}
    assert seekers.style_for("auto", None) == "cooperative"
    assert seekers.auto_table_text()[0] == "neuroticism high and agreeableness high -> validation-seeking"


def test_the_styles_text_is_in_the_users_language():
    user = SimulatedUser(
        user_id="z", language="zh", profile="p", big_five=None, cited=(), background=(),
        situation="s", query="我该怎么办", voice="", seeker="guarded",
    )  # fmt: skip
    turns = [
        DialogueTurn(role="user", text="我该怎么办", emotion=40),
        DialogueTurn(role="assistant", text="好"),
    ]
    messages = build_user_turn_messages(user, "need", turns, 40, load_prompt(SIMULATE.prompt))
    assert seekers.style_text().part("guarded", "turn", "zh") in messages[-1]["content"]
    assert "每次只透露一点点" in messages[-1]["content"]
    german = SimulatedUser(**{**user.__dict__, "language": "de"})
    english = build_user_turn_messages(german, "need", turns, 40, load_prompt(SIMULATE.prompt))
    assert "you are guarded" in english[-1]["content"], "no German text: the English one"


def test_a_row_from_before_styles_reads_as_cooperative_and_a_bad_style_is_refused(tmp_path):
    rows, _, _ = run_style(tmp_path, "cooperative")
    old = {k: v for k, v in rows[0].items() if k != "seeker"}
    assert Dialogue.model_validate(old).seeker == "cooperative"
    with pytest.raises(ValueError):
        Dialogue.model_validate({**old, "seeker": "hostile"})
    with pytest.raises(InputError, match="--seeker takes"):
        DialogueOptions(seeker="hostile")
    assert DialogueOptions().tag() == DialogueOptions(seeker="cooperative").tag()
    assert DialogueOptions().tag() != DialogueOptions(seeker="guarded").tag()
    assert json.dumps(rows[0]).count('"seeker"') == 1


def test_the_training_interaction_plays_the_style_its_row_or_config_names(tmp_path):
    import asyncio

    from test_dialogue_training import splits_with

    from personaemp.training.export import write_export
    from personaemp.training.interaction import SimulatedUserInteraction

    output = tmp_path / "train.jsonl"
    write_export(splits_with(tmp_path / "export"), output, format="trl", dialogues=True)
    kwargs = json.loads(output.read_text().splitlines()[0])["interaction_kwargs"]
    kwargs["user"]["big_five"] = {
        **kwargs["user"]["big_five"],
        "neuroticism": "high",
        "agreeableness": "high",
    }
    guarded = {**kwargs, "user": {**kwargs["user"], "seeker": "guarded"}}

    async def first_turn(agent, given) -> None:
        instance = await agent.start_interaction(None, **given)
        messages = [
            {"role": "user", "content": given["user"]["query"]},
            {"role": "assistant", "content": "Hm."},
        ]
        await agent.generate_response(instance, messages)
        await agent.finalize_interaction(instance)

    with FakeOpenAI(responder=Script()) as server:
        agent = SimulatedUserInteraction(
            {"seeker": "auto", "safety": 0}, settings=settings_for(server, tmp_path / "w")
        )
        asyncio.run(first_turn(agent, kwargs))
        asyncio.run(first_turn(agent, guarded))
    simulated = [text_of(r.body) for r in server.chat_requests if step_of(r.body) == "simulate"]
    style = seekers.style_text()
    assert style.part("validation-seeking", "turn") in simulated[0], "auto: by its Big Five levels"
    assert style.part("guarded", "turn") in simulated[1], "the row's own style first"
