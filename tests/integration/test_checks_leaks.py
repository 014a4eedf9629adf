"""Checks a weak model slips past (issue 44): our prompts' text in a query (no_scaffolding),
an internal id in text a user sees (no_internal_ids) and a Big Five rationale stating another
level than its own (level_matches_rationale): the pure functions, then each through its
stage against tests/fake_openai.py, then the counts in stats.json."""

from __future__ import annotations

import io
import json

import pytest
from conftest import read_jsonl, write_jsonl
from fake_openai import FakeOpenAI, reply
from rich.console import Console
from test_persona import REASK_START, level, make_user, memory, persona_reply, settings_for, trait
from test_queries import EN_MESSAGES, ZH_MESSAGES, Script, chinese_user, english_user, persona, run_stage

from personaemp import checks
from personaemp.dataset.persona import PERSONA_CHECKS, infer_personas, parse_persona
from personaemp.dataset.stats import compute_stats, sources_in
from personaemp.instruments.query_check import judge_checks, scaffolding
from personaemp.llm.step import RejectedReply
from personaemp.prompts import prompts_dir
from personaemp.records import BIG_FIVE

# --- no_scaffolding ------------------------------------------------------------------------------


def scaffolded(text: str) -> tuple[bool, str]:
    return checks.scaffolding(text, *scaffolding())


@pytest.mark.parametrize(
    ("text", "found"),
    [
        # the query: the frame a memory's evidence is shown in (render_memories)
        ("After I met my wife … (user said: 我和她一起去了那家餐厅", "(user said:"),
        ("I keep thinking about it (User said: it was my fault) and I can't stop.", "(user said:"),
        ("(moment: their sister cancelled) Why does she always do this to me?", "(moment:"),
        ("[HEQ] How do I tell my sister I need help without starting a fight?", "[HEQ]"),
        ("The user's message:\nI feel so alone since the move.", "The user's message:"),
        ("Profile (grounded traits):\n- anxious. Why am I like this?", "Profile (grounded traits):"),
        ("I feel hurt, see memory_ids for why. What should I do?", "memory_ids"),
        ("Dear {name}, I am sorry I missed your party, I feel awful.", "{name}"),
        ("I wanted to tell her {…} but I froze. Why do I always freeze?", "{…}"),
        ("Write as $profile: I am exhausted and nobody helps me.", "$profile"),
    ],
)
def test_a_query_holding_our_prompts_text_fails(text, found):
    ok, reason = scaffolded(text)
    assert not ok and found.lower() in reason.lower()


@pytest.mark.parametrize(
    "text",
    [
        *EN_MESSAGES,
        *ZH_MESSAGES,
        "My memories of dad keep coming back: the moment he left, the smell of his coat. How do I cope?",
        "I paid $50 for her gift and she never said thanks. Am I wrong to feel hurt?",
        "The moment I walked in, everyone went quiet. Did I do something wrong?",
        "我妈说(她不是故意的)，可我还是很难过，我该怎么办？",
    ],
)
def test_ordinary_queries_hold_no_scaffolding(text):
    assert scaffolded(text) == (True, "")


def test_the_labels_come_from_the_prompts_in_use(tmp_path, monkeypatch):
    """Declared nowhere by hand: a label a new template puts above a slot is checked at once."""
    for name in ("shared.md", "situations.md"):
        (tmp_path / name).write_text((prompts_dir() / name).read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "extra.md").write_text("## context\ntask profile\n\n## task\nHidden feelings:\n$feelings\n")
    text = "Hidden feelings:\nI am scared of losing my job."
    assert scaffolded(text) == (True, "")
    monkeypatch.setenv("PERSONAEMP_PROMPTS", str(tmp_path))
    assert scaffolded(text) == (False, "holds the text of our prompts: 'Hidden feelings:'")


# --- no_internal_ids -----------------------------------------------------------------------------

KNOWN = ["m1", "m12", "sess_0016d4107292__92129", "sess_0016d4107292", "alice", "92129"]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("I think I am open-minded, which aligns with the profile-964dce135dad7fe3.", "964dce135dad7fe3"),
        ("Since sess_0016d4107292 I can't stop worrying.", "sess_0016d4107292"),
        ("As m12 says, I get anxious before family dinners.", "m12"),
        ("正如m1所说，我一直很焦虑。", "m1"),
        ("(m1) My sister never helps and I am exhausted.", "m1"),
        ("The user (sess_0016d4107292__92129) feels alone.", "sess_0016d4107292"),
    ],
)
def test_an_internal_id_fails(text, found):
    ok, reason = checks.internal_ids(text, KNOWN)
    assert not ok and found in reason


@pytest.mark.parametrize(
    "text",
    [
        *EN_MESSAGES,
        *ZH_MESSAGES,
        "We moved into a 45 m2 flat in 2019 and I still feel like a guest there.",
        "Alice stopped answering my calls after I paid her back 92129 won. Should I write first?",
        "My number is 13800138000, but nobody calls. I feel forgotten.",
        "她在2023年12月搬走了，我们已经半年没联系了，我很想她。",
        "I drive a BMW M3 and my dad says I am showing off. Why does that hurt so much?",
        "My café menu has a decade of recipes; I feel like a failure when one flops.",
    ],
)
def test_ordinary_sentences_name_no_internal_id(text):
    assert checks.internal_ids(text, KNOWN) == (True, "")


def test_user_ids_are_the_users_own_ids():
    user = make_user("sess_ab12cd34ef56__7", [memory("m1"), memory("m2")])
    assert checks.user_ids(user) == ["sess_ab12cd34ef56__7", "m1", "m2"]


# --- level_matches_rationale ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trait", "level_", "rationale"),
    [
        ("openness", "medium", "The user shows a high level of openness by trying new hobbies."),
        ("openness", "low", "The user is highly open to new experiences."),
        ("openness", "high", "Openness: moderate, given a few new interests."),
        ("neuroticism", "medium", "Neuroticism appears relatively low: calm under pressure."),
        ("agreeableness", "high", "Low agreeableness: argues with everyone."),
        ("conscientiousness", "low", "Shows high conscientiousness at work."),
        ("openness", "low", "用户的开放性较高，喜欢尝试新事物。"),
        ("neuroticism", "low", "她经常焦虑，表现出高神经质。"),
    ],
)
def test_a_rationale_stating_another_level_fails(trait, level_, rationale):
    ok, reason = checks.level_matches_rationale(trait, level_, rationale)
    assert not ok and f"the level is {level_}" in reason


@pytest.mark.parametrize(
    ("trait", "level_", "rationale"),
    [
        ("openness", "high", "The user shows a high level of openness."),
        ("openness", "medium", "Evidence is thin; medium by default."),
        # "high" about something else, or about another trait
        ("openness", "low", "Holds high standards at work, and high neuroticism shows in her worries."),
        ("conscientiousness", "medium", "Open to feedback and highly organized."),
        ("neuroticism", "low", "Under high pressure at work she stays calm."),
        ("agreeableness", "high", "Not highly agreeable at first sight, yet always helps her friends."),
        ("extraversion", "medium", "Moderate-to-high extraversion: enjoys small groups."),
        ("openness", "medium", "他想提高开放性。"),
        ("openness", "high", "用户的开放性较高。"),
    ],
)
def test_a_rationale_agreeing_with_its_level_or_naming_none_passes(trait, level_, rationale):
    assert checks.level_matches_rationale(trait, level_, rationale) == (True, "")


# --- in the parsers ------------------------------------------------------------------------------

USER = make_user("sess_ab12cd34ef56__7", [memory("m1"), memory("m2"), memory("m3")])


def big_five(**rationales: tuple[str, str]):
    """A persona reply with one grounded trait and these levels (else thin medium ones)."""
    levels = {t: level(*rationales.get(t, ("medium", [], "Evidence is thin."))) for t in BIG_FIVE}
    return persona_reply([trait(["m3"])], big_five=levels)


def test_parse_big_five_refuses_a_contradicting_rationale_and_records_it_when_not_enforced():
    reply_ = big_five(openness=("medium", ["m1"], "A high level of openness: tries new hobbies."))
    with pytest.raises(RejectedReply) as refused:
        parse_persona(USER, reply_)
    assert refused.value.kind == "level_matches_rationale"
    assert "openness's rationale: the rationale says 'high level of openness', the level is medium" in str(
        refused.value
    )
    levels = parse_persona(USER, reply_, enforce=("no_internal_ids",)).big_five
    assert levels.openness.checks == {"no_internal_ids": True, "level_matches_rationale": False}
    assert levels.openness.reasons == {
        "level_matches_rationale": "the rationale says 'high level of openness', the level is medium"
    }
    assert levels.neuroticism.checks == {"no_internal_ids": True, "level_matches_rationale": True}


def test_parse_big_five_refuses_an_id_in_a_rationale():
    reply_ = big_five(neuroticism=("high", ["m2"], "Worries a lot, as m2 shows."))
    with pytest.raises(RejectedReply, match="neuroticism's rationale: names an internal id: 'm2'") as refused:
        parse_persona(USER, reply_)
    assert refused.value.kind == "no_internal_ids"


def test_a_failing_trait_statement_is_named_before_a_failing_rationale():
    """One reply, both checks: the re-ask names the first failure, the trait's."""
    reply_ = persona_reply(
        [trait(["m1"], "Gets anxious before exams (m1).")],
        big_five={
            t: level("medium", [], "A high level of openness." if t == "openness" else "Thin.")
            for t in BIG_FIVE
        },
    )
    with pytest.raises(RejectedReply, match=r"the statement of trait 1") as refused:
        parse_persona(USER, reply_)
    assert refused.value.kind == "no_internal_ids"
    with pytest.raises(RejectedReply, match="openness's rationale") as refused:
        parse_persona(USER, reply_, enforce=("level_matches_rationale",))
    assert refused.value.kind == "level_matches_rationale"


def test_parse_persona_refuses_an_id_in_a_statement_and_records_it_when_not_enforced():
    from test_persona import persona_reply, trait

    reply_ = persona_reply([trait(["m1"], "Gets anxious before exams (m1)."), trait(["m2"])])
    with pytest.raises(RejectedReply, match=r"the statement of trait 1 \(emotional_traits\): names an"):
        parse_persona(USER, reply_)
    parsed = parse_persona(USER, reply_, enforce=("level_matches_rationale",))
    assert [t.checks for t in parsed.traits] == [{"no_internal_ids": False}, {"no_internal_ids": True}]
    assert parsed.traits[0].reasons == {"no_internal_ids": "names an internal id: 'm1'"}


# --- gen-queries through the fake server ---------------------------------------------------------


def test_gen_queries_rejects_scaffolding_and_leaked_ids_and_stats_count_them(tmp_path):
    rows = [english_user(), chinese_user()]
    script = Script(*rows)
    script.messages["u-en"] = {1: "After my sister left … (user said: My sister never helps with mom"}
    script.messages["u-zh"] = {2: "我想和她和好，这和 profile-964dce135dad7fe3 一致，我该怎么开口？"}
    _, funnel, by_user, _ = run_stage(tmp_path, script, rows)

    rejected = {q["query_id"]: q["checks"] for row in by_user.values() for q in row["rejected_queries"]}
    assert set(rejected) == {"u-en-q1", "u-zh-q2"}
    assert rejected["u-en-q1"]["no_scaffolding"] is False
    assert rejected["u-en-q1"]["reasons"]["no_scaffolding"] == "holds the text of our prompts: '(user said:'"
    assert rejected["u-zh-q2"]["no_internal_ids"] is False
    assert "964dce135dad7fe3" in rejected["u-zh-q2"]["reasons"]["no_internal_ids"]
    assert funnel.failed_checks["no_scaffolding"] == funnel.failed_checks["no_internal_ids"] == 1
    accepted = [q for row in by_user.values() for q in row["queries"]]
    assert len(accepted) == 4
    assert all(q["checks"]["no_scaffolding"] and q["checks"]["no_internal_ids"] for q in accepted)
    assert all({"no_scaffolding", "no_internal_ids"} <= set(q["checks"]["enforced"]) for q in accepted)

    stats = compute_stats(sources_in(tmp_path / "out"))
    for name in ("no_scaffolding", "no_internal_ids"):
        assert stats["checks"][name] == {"passed": 5, "of": 6, "rate": round(5 / 6, 4), "enforced": True}


def test_a_moment_naming_a_memory_id_fails_its_query():
    from test_queries import review, situation

    checked = judge_checks(
        persona(english_user()), situation(text="After m1, their sister cancelled again."), EN_MESSAGES[0],
        review(), None,
    )  # fmt: skip
    assert checked.no_internal_ids is False and checked.passed is False
    assert checked.reasons["no_internal_ids"] == "the moment names an internal id: 'm1'"


# --- infer-persona through the fake server -------------------------------------------------------

CONTRADICTING = "A high level of openness: keeps trying new hobbies."


class PersonaScript:
    """Grounded traits and a Big Five whose openness rationale says high beside "medium",
    fixed on a re-ask when `fixes` (else repeated)."""

    def __init__(self, fixes: bool):
        self.fixes = fixes
        self.requests = 0

    def __call__(self, body: dict, number: int):
        self.requests += 1
        reask = REASK_START in body["messages"][-1]["content"]
        openness = "Keeps trying new hobbies." if reask and self.fixes else CONTRADICTING
        levels = {t: level("medium", [], "Evidence is thin.") for t in BIG_FIVE}
        levels["openness"] = level("medium", ["m2"], openness)
        traits = [{"aspect": "stress_response", "statement": "Worries before exams.", "evidence": ["m1"]}]
        depth = {"has_depth": True, "reason": "Shares worries."}
        return reply({"depth": depth, "topics": ["exams"], "traits": traits, "big_five": levels})


def run_personas(tmp_path, script: PersonaScript, **options):
    users = tmp_path / "filtered.jsonl"
    write_jsonl(users, [make_user("u1", [memory("m1"), memory("m2")]).model_dump(mode="json")])
    output = tmp_path / "personas.jsonl"
    with FakeOpenAI(responder=script) as server:
        report = infer_personas(
            users,
            output,
            settings_for(server, tmp_path / "work"),
            console=Console(file=io.StringIO()),
            **options,
        ).report
        assert server.errors == []
    rows = read_jsonl(output) if output.exists() else []
    failures = read_jsonl(tmp_path / "infer-persona.failures.jsonl")
    return report, rows, failures


def test_infer_persona_asks_again_for_a_contradicting_level_and_records_the_checks(tmp_path):
    script = PersonaScript(fixes=True)
    _, rows, failures = run_personas(tmp_path, script)
    assert script.requests == 2 and failures == []
    (row,) = rows
    assert row["enforced"] == list(PERSONA_CHECKS)
    assert row["big_five"]["openness"]["rationale"] == "Keeps trying new hobbies."
    assert row["big_five"]["openness"]["checks"] == {"no_internal_ids": True, "level_matches_rationale": True}
    assert row["traits"][0]["checks"] == {"no_internal_ids": True}


def test_infer_persona_fails_a_user_whose_levels_stay_contradicting(tmp_path):
    _, rows, failures = run_personas(tmp_path, PersonaScript(fixes=False))
    assert rows == []
    (failure,) = failures
    assert failure["user_id"] == "u1" and failure["kind"] == "level_matches_rationale"


def test_infer_persona_relaxed_keeps_the_level_and_stats_count_the_persona_checks(tmp_path):
    script = PersonaScript(fixes=False)
    _, rows, failures = run_personas(tmp_path, script, enforce=["no_internal_ids"])
    assert script.requests == 1 and failures == []
    (row,) = rows
    assert row["enforced"] == ["no_internal_ids"]
    assert row["big_five"]["openness"]["checks"]["level_matches_rationale"] is False
    assert row["big_five"]["openness"]["reasons"] == {
        "level_matches_rationale": "the rationale says 'high level of openness', the level is medium"
    }

    stats = compute_stats(sources_in(tmp_path))
    assert stats["persona_checks"] == {
        # one trait statement and five rationales; five levels
        "no_internal_ids": {"passed": 6, "of": 6, "rate": 1.0, "enforced": True},
        "level_matches_rationale": {"passed": 4, "of": 5, "rate": 0.8, "enforced": False},
    }
    assert json.dumps(stats)  # JSON-ready, as stats.json is written
