"""gen-dialogues against the test server: a scripted simulated user and supporter (responders
below), each simulator rule broken once and caught, the hidden need kept from the supporter,
kill -9 and resume, every provider profile, and the record's contract."""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from pathlib import Path

import pytest
from fake_openai import Deterministic, FakeOpenAI, reply
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.dialogues import (
    INITIAL_EMOTION,
    DialogueOptions,
    SimulatedUser,
    build_supporter_messages,
    generate_dialogues,
    pick_dialogues,
    read_dialogues,
    read_units,
)
from personaemp.errors import InputError
from personaemp.instruments.policy import RESPOND, build_messages
from personaemp.llm.settings import LLMSettings
from personaemp.prompts import load_prompt
from personaemp.records import DialogueTurn

NEED = "to hear that wanting a quiet weekend alone is not selfish before planning anything"
SUPPORTER = "That sounds like a lot to carry. What part of it weighs on you most right now?"
FENCED_QUERY = re.compile(r"<query-[0-9a-f]{16}>\n(.*?)\n</query-[0-9a-f]{16}>", re.S)
REPLY_NUMBER = re.compile(r"This is the assistant's reply number (\d+)\.")


# --- input ----------------------------------------------------------------------------------------


def user_row(user_id: str, queries: int = 1, language: str = "en") -> dict:
    values = {  # the user's id in a value: no two users' requests are the same (cache, counts)
        "work": f"Works long shifts as a nurse at ward {user_id} and feels drained.",
        "family": "Her brother expects her at every family event.",
        "hobby": "Paints watercolours to calm down.",
    }
    memories = [
        {"memory_id": f"{user_id}-m{n}", "label": label, "value": value}
        for n, (label, value) in enumerate(values.items(), 1)
    ]
    level = {"level": "medium", "evidence": [], "rationale": "r", "thin_evidence": True}
    texts = [
        "My brother wants me at his party this weekend but I am exhausted after my shifts. "
        "Is it wrong that I just want to stay home?",
        "I snapped at a colleague today after a double shift and now I feel terrible about it. "
        "How do I make it right with her?",
    ]
    return {
        "user_id": user_id, "language": language, "eligible": True,
        "profile": "A caring nurse who puts others first and feels guilty resting.",
        "memories": memories,
        "turns": [{"role": "user", "text": "can you help me write a shift swap request"}],
        "big_five": {trait: level for trait in
                     ("openness", "conscientiousness", "extraversion", "agreeableness", "neuroticism")},
        "queries": [
            {"query_id": f"{user_id}-q{n + 1}", "category": "ES", "query": texts[n % 2],
             "situation": {"topic": "rest", "text": "She is invited to a party after a week of shifts.",
                           "memory_ids": [f"{user_id}-m1", f"{user_id}-m2"]},
             "memory_ids": [f"{user_id}-m1", f"{user_id}-m2"]}
            for n in range(queries)
        ],
    }  # fmt: skip


def write_queries(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# --- the scripted endpoint ----------------------------------------------------------------------------


def text_of(body: dict) -> str:
    return "\n".join(m.get("content") or "" for m in body["messages"])


def step_of(body: dict) -> str:
    text = text_of(body)
    if "You prepare a role" in text:
        return "hidden_need"
    if "You play the person above" in text:
        return "simulate"
    if "You check one message written by a simulated user" in text:
        return "in_character"
    if "You review replies written by an AI assistant" in text:
        return "behaviours"
    return "supporter"


def good_turn(body: dict) -> dict:
    """A cooperative user: +5 a turn, need met from the second reply, leaves after the third."""
    number = int(REPLY_NUMBER.search(text_of(body)).group(1))
    opening = FENCED_QUERY.search(text_of(body)).group(1)
    # Their own words (so in their language), shuffled anew each turn: no run of them repeats
    # the opening or an earlier turn (no_echo), and never the need.
    words = opening.split()
    spaced = len(words) >= 4
    units = words if spaced else list(opening)
    random.Random(number).shuffle(units)
    text = (" " if spaced else "").join(units[:14])
    return {
        "thought": "they are listening", "change": 5, "reason": "it felt heard", "need_met": number >= 2,
        "end": number >= 3, "text": text,
    }  # fmt: skip


class Script:
    """A responder: the good user, unless `bad(step, body, seen)` gives another reply for a
    request (`seen`: how often that very request came before)."""

    def __init__(self, bad=None, judge=None):
        self.bad, self.judge = bad, judge
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, body: dict, number: int):
        step = step_of(body)
        digest = hashlib.sha256(json.dumps(body["messages"], sort_keys=True).encode()).hexdigest()
        with self.lock:
            seen = self.seen[digest] = self.seen.get(digest, -1) + 1
        if self.bad is not None:
            found = self.bad(step, body, seen)
            if found is not None:
                return reply(found)
        if step == "hidden_need":
            return reply({"need": NEED})
        if step == "simulate":
            return reply(good_turn(body))
        if step == "in_character":
            verdict = self.judge(body) if self.judge else (True, True)
            return reply({"reason": "reads as her", "in_character": verdict[0], "grounded": verdict[1]})
        if step == "behaviours":  # the behaviour judge (evaluate --dialogues, the safety term): none seen
            return reply({"reason": "a plain question", "behaviours": [], "acknowledges_first": True})
        return reply(SUPPORTER)


def settings_for(server: FakeOpenAI, work: Path, **extra) -> LLMSettings:
    return LLMSettings(base_urls=[server.base_url], model="fake", work_dir=work, api_key="sk-test", **extra)


def rows_of(path: Path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []
    )


def run_one(tmp_path: Path, script: Script, **options) -> tuple[list[dict], list[dict], FakeOpenAI]:
    queries = write_queries(tmp_path / "queries.jsonl", [user_row("u1")])
    output = tmp_path / "dialogues.jsonl"
    with FakeOpenAI(responder=script) as server:
        generate_dialogues(queries, output, settings_for(server, tmp_path / "work"), **options)
    assert server.errors == []
    return rows_of(output), rows_of(tmp_path / "gen-dialogues.failures.jsonl"), server


# --- the happy path and the record ------------------------------------------------------------------------


def test_a_dialogue_follows_the_simulated_user_to_its_end(tmp_path):
    rows, failures, server = run_one(tmp_path, Script())
    assert failures == [] and len(rows) == 1
    dialogue = read_dialogues(tmp_path / "dialogues.jsonl")[0]
    assert (dialogue.dialogue_id, dialogue.query_id, dialogue.user_id) == ("u1-q1-d1", "u1-q1", "u1")
    assert dialogue.hidden_need == NEED and dialogue.category == "ES" and dialogue.language == "en"
    assert [t.role for t in dialogue.turns] == ["user", "assistant"] * 3 + ["user"]
    assert dialogue.ended_by == "user", "the user left after the third reply"
    assert dialogue.initial_emotion == INITIAL_EMOTION == dialogue.turns[0].emotion
    assert [t.emotion for t in dialogue.turns if t.role == "user"] == [40, 45, 50, 55]
    assert dialogue.final_emotion == 55 and dialogue.need_met_at_turn == 2
    assert dialogue.supporter_model == dialogue.simulator_model == "fake"
    assert dialogue.memory_ids == ["u1-m1", "u1-m2"] and dialogue.background_memory_ids == ["u1-m3"]
    assert all(t.emotion is None and t.checks is None for t in dialogue.turns if t.role == "assistant")
    assert all(all(t.checks.values()) and t.rejected == [] for t in dialogue.turns[1:] if t.role == "user")
    assert set(dialogue.provenance.prompts) == {"hidden_need", "simulate", "in_character", "respond"}
    # the contract's field names, exactly
    row = rows[0]
    for name in ("dialogue_id", "user_id", "query_id", "category", "language", "hidden_need",
                 "initial_emotion", "final_emotion", "need_met_at_turn", "ended_by", "supporter_model",
                 "simulator_model", "turns"):  # fmt: skip
        assert name in row
    assert set(row["turns"][2]) >= {"role", "text", "emotion", "change", "reason", "need_met"}
    # 1 need + 3 x (supporter, simulated turn, its check)
    assert server.count == 10


def test_the_hidden_need_never_reaches_the_supporter(tmp_path):
    _, _, server = run_one(tmp_path, Script())
    supporter = [r.body for r in server.chat_requests if step_of(r.body) == "supporter"]
    simulator = [r.body for r in server.chat_requests if step_of(r.body) == "simulate"]
    assert len(supporter) == 3 and len(simulator) == 3
    assert all(NEED in text_of(body) for body in simulator), "the simulator does see it"
    assert not any(NEED in text_of(body) or "quiet weekend" in text_of(body) for body in supporter)
    # no assistant turn is replayed; the conversation comes as a transcript, latest message last
    assert all(m["role"] != "assistant" for body in supporter for m in body["messages"])
    assert SUPPORTER in supporter[2]["messages"][-1]["content"]


def test_the_supporters_first_request_is_respond_s_own(tmp_path):
    unit = read_units(write_queries(tmp_path / "q.jsonl", [user_row("u1")]))[0]
    prompt = load_prompt(RESPOND.prompt)
    opening = [DialogueTurn(role="user", text=unit["query"])]
    for context in ("none", "memory", "rag", "persona"):
        assert build_supporter_messages(unit, opening, context, 3, prompt) == build_messages(
            unit, context, 3, prompt
        )
    later = [
        *opening,
        DialogueTurn(role="assistant", text="I hear you."),
        DialogueTurn(role="user", text="yes"),
    ]
    content = build_supporter_messages(unit, later, "memory", 3, prompt)[-1]["content"]
    assert content.index("What you remember") < content.index("I hear you.") < content.index("yes")


# --- each simulator rule, broken by the test server and caught ------------------------------------------


def breaks_once(step_name: str, bad):
    """The simulated turn after the supporter's first reply breaks a rule the first time it is asked."""

    def pick(step, body, seen):
        first = step != "simulate" or "could not be used" not in text_of(body)  # not a re-ask
        if step == step_name and first and seen == 0 and REPLY_NUMBER.search(text_of(body)).group(1) == "1":
            return bad(body)
        return None

    return pick


@pytest.mark.parametrize(
    ("rule", "bad"),
    [
        ("no_need_leak", lambda body: {**good_turn(body), "text": f"What I need is {NEED}."}),
        ("language_match", lambda body: {**good_turn(body), "text":
            "Ich weiß wirklich nicht mehr weiter, mein Bruder versteht einfach nicht, wie müde ich bin."}),
        ("no_emotion_number", lambda body: {**good_turn(body), "text": "Okay. My emotion score is 45 now."}),
        ("no_early_end", lambda body: {**good_turn(body), "end": True, "text": "Thanks, bye."}),
        ("length_ok", lambda body: {**good_turn(body), "text": "I am so tired of all this. " * 40}),
        ("no_echo", lambda body: {**good_turn(body), "text": f"You said: {SUPPORTER}"}),
        ("no_echo", lambda body: {**good_turn(body), "text":
            "Is it wrong that I just want to stay home? Is it wrong that I just want to stay home?"}),
        ("no_echo", lambda body: {**good_turn(body), "text":
            "Never speak as an assistant, never mention being simulated, a role or a score."}),
        ("need_met_consistent", lambda body: {**good_turn(body), "change": -6, "need_met": True}),
    ],
)  # fmt: skip
def test_each_rule_catches_the_turn_that_breaks_it_and_asks_again(tmp_path, rule, bad):
    rows, failures, server = run_one(tmp_path, Script(bad=breaks_once("simulate", bad)))
    assert failures == [] and len(rows) == 1
    first = rows[0]["turns"][2]
    assert [set(r) for r in first["rejected"]] == [{rule, "text", "thought"}], first["rejected"]
    assert first["rejected"][0]["thought"] == "they are listening" and first["rejected"][0]["text"]
    assert first["checks"][rule] is True, "the reply kept passes it"
    # asked again as a new request that says what the last reply broke
    simulated = [text_of(r.body) for r in server.chat_requests if step_of(r.body) == "simulate"]
    assert len(simulated) == 4 and simulated[0] != simulated[1]
    assert rule in simulated[1] and first["rejected"][0]["text"][:40] in simulated[1]


def test_the_llm_check_catches_a_turn_out_of_character(tmp_path):
    out = lambda body: {**good_turn(body), "text": "As an AI language model I cannot feel tired."}  # noqa: E731
    judge = lambda body: (False, True) if "As an AI language model" in text_of(body) else (True, True)  # noqa: E731
    rows, failures, _ = run_one(tmp_path, Script(bad=breaks_once("simulate", out), judge=judge))
    assert failures == []
    first = rows[0]["turns"][2]
    assert [set(r) for r in first["rejected"]] == [{"in_character", "text", "thought"}]
    assert "As an AI" not in first["text"] and first["checks"]["in_character"] is True


def test_an_invented_fact_the_llm_check_flags_is_asked_again(tmp_path):
    made_up = lambda body: {**good_turn(body), "text": "My husband left me last year for my best friend."}  # noqa: E731
    judge = lambda body: (True, "husband" not in text_of(body).split("newest message")[-1])  # noqa: E731
    rows, failures, _ = run_one(tmp_path, Script(bad=breaks_once("simulate", made_up), judge=judge))
    assert failures == []
    assert [set(r) for r in rows[0]["turns"][2]["rejected"]] == [{"grounded", "text", "thought"}]


def test_a_turn_that_never_keeps_the_rules_sends_the_dialogue_to_the_failures(tmp_path):
    def leak(step, body, seen):
        return {**good_turn(body), "text": f"I need {NEED}"} if step == "simulate" else None

    rows, failures, server = run_one(tmp_path, Script(bad=leak), options=DialogueOptions(turn_attempts=2))
    assert rows == [] and len(failures) == 1
    assert failures[0]["dialogue_id"] == "u1-q1-d1" and failures[0]["kind"] == "simulator_rules"
    who = ("user_id", "query_id", "supporter_model", "lost_to")
    assert [failures[0][name] for name in who] == ["u1", "u1-q1", "fake", "simulator"]
    assert "no_need_leak" in failures[0]["error"] and "2 tries" in failures[0]["error"]
    assert len([r for r in server.chat_requests if step_of(r.body) == "simulate"]) == 2


def leaks_until_told(step, body, seen):
    """A simulated user that leaks its need unless the request says what its last reply broke:
    a deterministic endpoint sends the same leak to the same request, whatever the sample."""
    if step == "simulate" and "could not be used" not in text_of(body):
        return {**good_turn(body), "text": f"I need {NEED}"}
    return None


def test_a_deterministic_endpoint_never_gets_the_same_simulate_request_twice(tmp_path):
    """Before, a re-ask was the same body (only the cache key changed): a deterministic
    endpoint gave the same leak 3 times and the dialogue was lost. Now each re-ask says what
    the reply broke; with --seed S, sample k sends S + k."""
    queries = write_queries(tmp_path / "queries.jsonl", [user_row("u1"), user_row("u2")])
    output = tmp_path / "dialogues.jsonl"
    endpoint = Deterministic(Script(bad=leaks_until_told))
    with FakeOpenAI(responder=endpoint) as server:
        report = generate_dialogues(queries, output, settings_for(server, tmp_path / "work", seed=7)).report
    assert report.outcome.done == 2 and report.outcome.failed == 0, report.outcome.failures_by_kind
    assert endpoint.repeats == []
    simulated = [r.body for r in server.chat_requests if step_of(r.body) == "simulate"]
    assert {body["seed"] for body in simulated} == {7, 8}  # the first ask and its re-ask
    first = read_dialogues(output)[0].turns[2]
    assert [set(r) for r in first.rejected] == [{"no_need_leak", "text", "thought"}]
    assert first.thought == "they are listening" and first.checks["no_need_leak"] is True


def test_retry_failed_after_a_simulator_failure_asks_again(tmp_path):
    """The error line advises --retry-failed: it must send, not replay the rejected replies."""
    queries = write_queries(tmp_path / "queries.jsonl", [user_row("u1")])
    output = tmp_path / "dialogues.jsonl"

    def leak(step, body, seen):
        return {**good_turn(body), "text": f"I need {NEED}"} if step == "simulate" else None

    options = DialogueOptions(turn_attempts=2)
    with FakeOpenAI(responder=Script(bad=leak)) as server:
        lost = generate_dialogues(
            queries, output, settings_for(server, tmp_path / "work"), options=options
        ).report
    assert lost.notes["lost"]["simulator"] == 1 and "1 to the simulator" in lost.notes["lost"]["text"]
    assert rows_of(output) == [] and len(rows_of(tmp_path / "gen-dialogues.failures.jsonl")) == 1
    with FakeOpenAI(responder=Script()) as server:
        report = generate_dialogues(
            queries, output, settings_for(server, tmp_path / "work"), options=options, retry_failed=True
        ).report
    assert report.outcome.done == 1, report.outcome.failures_by_kind
    assert [step_of(r.body) for r in server.chat_requests].count("simulate") == 3  # asked, not replayed
    assert len(rows_of(output)) == 1 and rows_of(tmp_path / "gen-dialogues.failures.jsonl") == []


# --- the endings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "ended_by", "final"), [(10, "satisfied", 100), (-10, "gave_up", 0), (1, "max_turns", 42)]
)
def test_the_emotion_bounds_and_max_turns_end_a_dialogue(tmp_path, change, ended_by, final):
    def steady(step, body, seen):
        if step == "simulate":
            return {**good_turn(body), "end": False, "change": change, "need_met": change > 0}
        return None

    # from 40: +10 reaches 100 on turn 6; -10 goes below 10 on turn 4; +1 stops at max_turns
    options = DialogueOptions(max_turns=2 if change == 1 else 8)
    rows, failures, _ = run_one(tmp_path, Script(bad=steady), options=options)
    assert failures == [] and rows[0]["ended_by"] == ended_by
    if ended_by == "gave_up":
        final = rows[0]["final_emotion"]
        assert final < 10 and sum(t["role"] == "assistant" for t in rows[0]["turns"]) == 4
    assert rows[0]["final_emotion"] == final


# --- selection, input errors ----------------------------------------------------------------------


def test_per_user_and_limit_pick_the_first_queries(tmp_path):
    units = read_units(write_queries(tmp_path / "q.jsonl", [user_row("a", 3), user_row("b", 2)]))
    assert pick_dialogues(units, None, None) is None
    assert pick_dialogues(units, None, 1) == {"a-q1-d1", "b-q1-d1"}
    assert pick_dialogues(units, 3, 2) == {"a-q1-d1", "a-q2-d1", "b-q1-d1"}


def test_a_bad_input_line_is_one_line_with_its_place(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(user_row("a")) + "\n" + json.dumps({"user_id": "b"}) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"q\.jsonl:2: not a queries row"):
        read_units(path)
    result = CliRunner().invoke(app, ["gen-dialogues", "--input", str(path), "--model", "m",
                                      "--base-url", "http://127.0.0.1:9/v1"])  # fmt: skip
    assert result.exit_code == 2 and "q.jsonl:2" in result.output
    assert not (tmp_path / "dialogues.jsonl").exists()


def test_the_simulated_user_stands_on_the_cited_memories(tmp_path):
    unit = read_units(write_queries(tmp_path / "q.jsonl", [user_row("a")]))[0]
    user = SimulatedUser.of_unit(unit)
    values = user.values()
    assert (
        values["memories"].index("a-m1")
        < values["memories"].index("Background")
        < values["memories"].index("a-m3")
    )
    assert "shift swap" in values["profile"], "their own messages, for their voice"


# --- the rules that need no LLM, one by one -------------------------------------------------------------


def test_a_number_the_supporter_asked_for_is_allowed():
    from personaemp.instruments.simulator_rules import SUPPORTER, check_turn

    def rule(text, supporter):
        found = check_turn(text, language="en", hidden_need=NEED, ends=False, supporter_turn=2,
                           echoes={SUPPORTER: supporter})  # fmt: skip
        return found["no_emotion_number"][0]

    answer = "Maybe a 4 out of 10, honestly."
    assert rule(answer, "On a scale of 1 to 10, how heavy does it feel right now?")
    assert rule(answer, "How would you rate your stress today?")
    assert not rule(answer, "That sounds exhausting. What part weighs on you most?"), "unprompted: refused"
    assert not rule("My mood is 35 today.", SUPPORTER)


def test_the_hidden_need_is_written_in_the_users_language(tmp_path):
    """so no_need_leak can compare it with what a user who does not write English writes."""
    queries = write_queries(tmp_path / "queries.jsonl", [user_row("u1", language="de")])
    units = read_units(queries)
    from personaemp.instruments.simulator import build_need_messages

    messages = build_need_messages(SimulatedUser.of_unit(units[0]), load_prompt("dialogue_need"))
    text = "\n".join(m["content"] for m in messages)
    assert "one or two sentences, in German, in the third person" in text and "in English" not in text


def test_a_hidden_need_that_copies_the_prompts_example_is_asked_again(tmp_path):
    from personaemp.instruments.simulator import NEED_EXAMPLE

    prompt = " ".join(load_prompt("dialogue_need").user.template.split())
    assert f'("{NEED_EXAMPLE}",' in prompt, "the example the rule compares with is the prompt's"

    def copy_example(step, body, seen):
        if step == "hidden_need" and "could not be used" not in text_of(body):
            return {"need": NEED_EXAMPLE}
        return None

    rows, failures, server = run_one(tmp_path, Script(bad=copy_example))
    assert failures == [] and rows[0]["hidden_need"] == NEED
    needs = [text_of(r.body) for r in server.chat_requests if step_of(r.body) == "hidden_need"]
    assert len(needs) == 2 and "the prompt's example" in needs[1]
