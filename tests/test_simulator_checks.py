"""The simulator's checks that need no LLM (issue 50, part 2): each new one with a turn that
breaks it and one that passes it, the hidden need in the user's language and never a copy of
its prompt, and Met % reading a contradicting turn as not met."""

from __future__ import annotations

import json

import pytest
from fake_openai import FakeOpenAI
from test_dialogues import (
    NEED,
    SUPPORTER,
    Script,
    good_turn,
    settings_for,
    step_of,
    text_of,
    user_row,
    write_queries,
)

from personaemp.build.dialogues import generate_dialogues, read_dialogues, read_units
from personaemp.evaluation.sessions import trajectory
from personaemp.instruments.simulator import (
    HIDDEN_NEED,
    SIMULATE,
    SimulatedUser,
    build_need_messages,
    prompt_frames,
    turn_context,
)
from personaemp.instruments.simulator_rules import (
    TurnContext,
    check_turn,
    need_met_at,
    need_met_consistent,
    no_echo,
    no_emotion_number,
)
from personaemp.prompts import load_prompt
from personaemp.records import Dialogue, DialogueTurn

SCALE = "I hear you. On a scale of 1 to 10, how exhausted do you feel right now?"


def context(reply: str = SUPPORTER, language: str = "en") -> TurnContext:
    prompt = load_prompt(SIMULATE.prompt)
    user = SimulatedUser.of_unit(read_units_one(language))
    turns = [
        DialogueTurn(role="user", text=user.query, emotion=40, change=0),
        DialogueTurn(role="assistant", text=reply),
    ]
    return turn_context(user, NEED, turns, prompt)


def read_units_one(language: str = "en") -> dict:
    unit = {key: value for key, value in user_row("u1", language=language).items() if key != "queries"}
    query = user_row("u1")["queries"][0]
    return {
        **unit, "query": query["query"], "situation": query["situation"]["text"],
        "memory_ids": query["memory_ids"], "voice": "", "big_five": None,
    }  # fmt: skip


# --- need_met_consistent -----------------------------------------------------------------------


def test_need_met_while_the_emotion_falls_breaks_the_rule():
    assert need_met_consistent(True, -10) == (False, "says its need is met while its emotion falls (-10)")
    assert need_met_consistent(True, 0)[0] and need_met_consistent(True, 5)[0]
    assert need_met_consistent(False, -10)[0], "not met and hurt: consistent"


def test_met_percent_counts_a_contradicting_turn_as_not_met():
    def dialogue(*user_turns: tuple[int, bool]) -> Dialogue:
        turns, emotion = [DialogueTurn(role="user", text="q", emotion=40, change=0, need_met=False)], 40
        for change, met in user_turns:
            emotion += change
            said = DialogueTurn(role="user", text="u", emotion=emotion, change=change, need_met=met)
            turns += [DialogueTurn(role="assistant", text="a"), said]
        return Dialogue(
            dialogue_id="q-d1", user_id="u", query_id="q", category="ES", language="en", hidden_need="n",
            initial_emotion=40, final_emotion=emotion, need_met_at_turn=1, ended_by="max_turns",
            supporter_model="s", simulator_model="s", memory_ids=[], background_memory_ids=[],
            context="memory", turns=turns,
            provenance={"model": "s", "endpoint_kind": "x", "prompts": {}, "created_at": "now"},
        )  # fmt: skip

    refused = dialogue((-10, True))  # the record (an older writer) says met at turn 1
    assert trajectory(refused)["need_met_at_turn"] is None, "met while falling: not met"
    assert need_met_at(dialogue((-10, True), (5, True)).turns) == 2, "the first turn that keeps the rule"
    assert trajectory(dialogue((5, True)))["need_met_at_turn"] == 1


# --- no_echo ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "what"),
    [
        (f"You said: {SUPPORTER}", "the supporter's last reply"),
        ("My brother wants me at his party this weekend but I am exhausted, like I said.",
         "its own earlier turns"),
        ("Okay, you are not too cooperative: a generic or preachy reply does not help you.",
         "the simulator's prompt"),
    ],
)  # fmt: skip
def test_an_echo_of_the_supporter_its_own_turns_or_its_prompt_breaks_no_echo(text, what):
    passed, why = check_turn(text, ends=False, need_met=False, change=0, context=context())["no_echo"]
    assert not passed and what in why, why


def test_a_reply_in_its_own_words_passes_no_echo_even_quoting_a_short_phrase():
    text = "When you ask what weighs on me most, it is the guilt, not the tiredness."
    assert check_turn(text, ends=False, need_met=False, change=2, context=context())["no_echo"] == (True, "")
    assert no_echo("a b c", {"x": []}) == (True, "")


def test_the_prompt_frames_are_its_text_between_slots():
    frames = prompt_frames(load_prompt(SIMULATE.prompt))
    assert any("You play the person above" in piece for piece in frames)
    assert not any("$" in piece for piece in frames), "slots are cut out"


# --- no_scaffolding -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "Assistant: I understand how you feel.",
        "need_met: false, honestly",
        "The assistant's latest reply:\nok",
    ],
)
def test_the_prompts_frames_in_a_turn_break_no_scaffolding(text):
    assert (
        check_turn(text, ends=False, need_met=False, change=0, context=context())["no_scaffolding"][0]
        is False
    )


def test_a_plain_message_passes_no_scaffolding():
    text = "I guess I need to rest first. My assistant manager says the same."
    assert check_turn(text, ends=False, need_met=False, change=0, context=context())["no_scaffolding"] == (
        True,
        "",
    )


# --- no_emotion_number: a number the supporter asked for ----------------------------------------------


def test_a_number_the_supporter_asked_for_passes():
    assert no_emotion_number("Maybe a 4 out of 10.", SCALE) == (True, "")
    assert no_emotion_number("my mood is maybe 6", "How would you rate your mood from 0-10?") == (True, "")
    assert no_emotion_number("大概4分吧", "用1到10分来说,你现在有多累?") == (True, "")


def test_an_unprompted_score_or_one_off_the_asked_scale_still_fails():
    assert no_emotion_number("Maybe a 4 out of 10.", SUPPORTER)[0] is False, "nobody asked"
    assert no_emotion_number("Honestly I'm at 40/100.", SCALE)[0] is False, "the simulator's own 0-100 scale"
    assert no_emotion_number("My emotion score is 45 now.", SUPPORTER)[0] is False


def test_asked_for_a_number_the_whole_turn_is_kept(tmp_path):
    def scale(step, body, seen):
        if step == "supporter":
            return SCALE
        if step == "simulate" and "reply number 1." in text_of(body):
            return {**good_turn(body), "text": "Maybe a 4 out of 10, if I am honest with myself."}
        return None

    queries = write_queries(tmp_path / "q.jsonl", [user_row("u1")])
    with FakeOpenAI(responder=Script(bad=scale)) as server:
        generate_dialogues(queries, tmp_path / "d.jsonl", settings_for(server, tmp_path / "w"))
    turn = read_dialogues(tmp_path / "d.jsonl")[0].turns[2]
    assert turn.text.startswith("Maybe a 4 out of 10") and turn.rejected == []
    assert turn.checks["no_emotion_number"] is True


# --- the hidden need --------------------------------------------------------------------------------


@pytest.mark.parametrize(("language", "name"), [("zh", "Chinese"), ("en", "English")])
def test_the_hidden_need_is_asked_in_the_users_language(language, name):
    user = SimulatedUser.of_unit(read_units_one(language))
    content = "\n".join(m["content"] for m in build_need_messages(user, load_prompt(HIDDEN_NEED.prompt)))
    assert f"in {name} (the language this person writes in)" in content


def test_a_chinese_users_need_in_chinese_is_caught_when_leaked():
    need = "在做任何决定之前,先听到想要一个人安静度过周末并不自私"
    leaked = f"其实我只是想{need[8:]}"
    found = check_turn(leaked, ends=False, need_met=False, change=0,
                       context=TurnContext(language="zh", hidden_need=need, supporter_turn=1))  # fmt: skip
    assert found["no_need_leak"][0] is False
    fine = check_turn("我还是觉得很累,也不知道怎么跟哥哥说。", ends=False, need_met=False, change=0,
                      context=TurnContext(language="zh", hidden_need=need, supporter_turn=1))  # fmt: skip
    assert found["language_match"][0] and fine["no_need_leak"][0]


def test_a_hidden_need_that_copies_its_prompts_example_is_asked_again(tmp_path):
    example = "to hear that wanting a break is not laziness before deciding anything"

    def copies(step, body, seen):
        if step == "hidden_need" and "copies the prompt" not in text_of(body):
            return {"need": example}
        return None

    queries = write_queries(tmp_path / "q.jsonl", [user_row("u1")])
    with FakeOpenAI(responder=Script(bad=copies)) as server:
        generate_dialogues(queries, tmp_path / "d.jsonl", settings_for(server, tmp_path / "w"))
    needs = [r.body for r in server.chat_requests if step_of(r.body) == "hidden_need"]
    assert len(needs) == 2, "asked again once, with why"
    assert "copies the prompt's text" in json.dumps(needs[1])
    assert read_dialogues(tmp_path / "d.jsonl")[0].hidden_need == NEED


def test_a_need_of_its_own_is_kept_at_once(tmp_path):
    queries = write_queries(tmp_path / "q.jsonl", [user_row("u1")])
    with FakeOpenAI(responder=Script()) as server:
        generate_dialogues(queries, tmp_path / "d.jsonl", settings_for(server, tmp_path / "w"))
    assert sum(step_of(r.body) == "hidden_need" for r in server.chat_requests) == 1


# --- the thought ------------------------------------------------------------------------------------


def test_the_inner_thought_is_kept_in_the_record(tmp_path):
    queries = write_queries(tmp_path / "q.jsonl", [user_row("u1")])
    with FakeOpenAI(responder=Script()) as server:
        generate_dialogues(queries, tmp_path / "d.jsonl", settings_for(server, tmp_path / "w"))
    turns = read_dialogues(tmp_path / "d.jsonl")[0].turns
    assert [t.thought for t in turns[2::2]] == ["they are listening"] * 3
    assert all(t.thought is None for t in turns[1::2]), "the supporter has none"
    assert read_units(queries)[0]["query"] == turns[0].text


def test_every_check_is_described_once():
    from personaemp.instruments import simulator_rules

    assert list(simulator_rules.DESCRIPTIONS) == [*simulator_rules.RULES, *simulator_rules.JUDGED]
