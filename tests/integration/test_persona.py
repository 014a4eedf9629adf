"""`infer-persona`: golden prompts, reply schemas, grounding rules, the stage through the fake
OpenAI server (tests/fake_openai.py) and the CLI (`infer-persona`, `--show`)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_KEPT, SAMPLE_TASK1, read_jsonl, write_jsonl
from fake_openai import FakeOpenAI, reply, schema_for_request
from pydantic import ValidationError
from rich.console import Console
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.filter import filter_users
from personaemp.dataset.persona import (
    PERSONA_STEP,
    STEPS,
    PersonaReply,
    build_persona_messages,
    infer_personas,
    parse_persona,
    persona_schema,
    profile_text,
    read_rows,
    summarize,
)
from personaemp.errors import InputError
from personaemp.io import pick_units
from personaemp.llm.engine import REASK
from personaemp.llm.settings import LLMSettings
from personaemp.llm.step import RejectedReply
from personaemp.prompts import fence, load_prompt, prompts_dir
from personaemp.records import BIG_FIVE, Persona, Trait, User
from personaemp.render import (
    EVIDENCE_TEXT,
    MEMORY_TEXT,
    TURN_TEXT,
    TURN_WINDOW,
    render_memories,
    render_turns,
)

REASK_START = REASK.split("{error}")[0]


# --- helpers ---------------------------------------------------------------------------------


def make_user(
    user_id: str = "u1", memories: list[dict] | None = None, turns: list[dict] | None = None
) -> User:
    return User.model_validate(
        {
            "user_id": user_id,
            "source": {"format": "raw", "path": "hand-made.json"},
            "turns": turns or [],
            "memories": memories or [],
        }
    )


def memory(memory_id: str, value: str = "Worries about their exams", **extra) -> dict:
    return {"memory_id": memory_id, "label": "Emotional_State/Stress", "value": value, **extra}


def section(name: str, title: str) -> str:
    """The `## title` section of prompts/<name>.md, read independently of the loader."""
    text = (REPO / "prompts" / f"{name}.md").read_text(encoding="utf-8")
    _, found, rest = text.partition(f"## {title}\n")
    assert found, f"prompts/{name}.md has no '## {title}'"
    return rest.split("\n## ", 1)[0].strip()


def test_a_checkout_reads_the_prompts_from_its_top_level_prompts_folder(monkeypatch):
    """The design card's layout: prompts/ beside personaemp/, no stale copies in the package."""
    monkeypatch.delenv("PERSONAEMP_PROMPTS", raising=False)
    assert Path(str(prompts_dir())) == REPO / "prompts"
    assert load_prompt("persona").system.template == section("shared", "preamble")
    assert load_prompt("persona").user.template == section("persona", "task")
    assert not list((REPO / "personaemp" / "prompts").glob("*.md"))


def persona_reply(
    traits: list[dict], has_depth: bool = True, topics=("work",), big_five: dict | None = ...
) -> PersonaReply:
    """A reply; its Big Five: five thin medium levels unless given (None: null)."""
    return PersonaReply.model_validate(
        {
            "depth": {"has_depth": has_depth, "reason": "Talks about an ongoing worry."},
            "topics": list(topics),
            "traits": traits,
            "big_five": {name: level() for name in BIG_FIVE} if big_five is ... else big_five,
        }
    )


def trait(evidence: list[str], statement: str = "Feels pressure keenly.", aspect="emotional_traits") -> dict:
    return {"aspect": aspect, "statement": statement, "evidence": evidence}


def level(value: str = "medium", evidence: list[str] | None = None, rationale="Evidence is thin.") -> dict:
    return {"level": value, "evidence": evidence or [], "rationale": rationale}


def filtered_users(folder: Path) -> Path:
    """The users the filter keeps from the shipped sample, as filtered.jsonl under `folder`."""
    output = folder / "filtered.jsonl"
    report = filter_users(str(SAMPLE_TASK1), output, console=Console(file=io.StringIO())).report
    assert report.kept == SAMPLE_KEPT
    return output


def quiet() -> Console:
    return Console(file=io.StringIO())


def settings_for(server: FakeOpenAI, work: Path, **overrides) -> LLMSettings:
    values = dict(base_urls=[server.base_url], model="fake", work_dir=work, api_key="sk-test", max_retries=0)
    values.update(overrides)
    return LLMSettings(**values)


# --- golden prompt rendering -------------------------------------------------------------------

LONG_VALUE = "Feels overwhelmed by work,\n   lies awake at night; " + "w" * 300
LONG_EVIDENCE = "I can't sleep,\tmy boss\n keeps adding tasks " + "e" * 200


def golden_user() -> User:
    turns = [
        {"role": "user", "text": "Old short question about recipes."},
        {"role": "assistant", "text": "ASSISTANT-ONE " * 40},
        {"role": "user", "text": "Second: " + "b" * 400},
        {"role": "assistant", "text": "ASSISTANT-TWO"},
        {"role": "user", "text": "Third: " + "c" * 400},
        {"role": "user", "text": "Fifth: " + "d" * 400},
        {"role": "assistant", "text": "ASSISTANT-THREE " * 30},
        {"role": "user", "text": "Newest:\n\n   " + "n" * 400},
        {"role": "assistant", "text": "ASSISTANT-LAST"},
    ]
    memories = [
        memory("m1", LONG_VALUE, evidence_text=LONG_EVIDENCE),
        {
            "memory_id": "m2",
            "label": "UNMAPPED",
            "label_suggestion": "Hobbies/Gardening",
            "value": "Grows tomatoes on the balcony to relax",
        },
        {
            "memory_id": "m3",
            "label": "Social_Relationships/Family",
            "label_suggestion": "Ignored/Suggestion",
            "value": "Has a difficult relationship with their sister",
            "evidence_text": "My sister and I argued again",
        },
    ]
    return make_user("golden", memories, turns)


# Written out by hand: whitespace collapsed, value clipped to 240 chars (239 + "…"), evidence
# to 160 (159 + "…"), the UNMAPPED label replaced by its suggestion, no quote without evidence.
GOLDEN_MEMORIES = (
    "[m1] Emotional_State/Stress: Feels overwhelmed by work, lies awake at night; "
    + "w" * 191
    + "…"
    + " (user said: \"I can't sleep, my boss keeps adding tasks "
    + "e" * 117
    + '…")\n'
    + "[m2] Hobbies/Gardening: Grows tomatoes on the balcony to relax\n"
    + '[m3] Social_Relationships/Family: Has a difficult relationship with their sister (user said: "My '
    'sister and I argued again")'
)
# Newest four user turns, each clipped to 300 chars: 4 x 300 = 1200 = TURN_WINDOW exactly, so the
# oldest (short) turn no longer fits; assistant turns never appear.
GOLDEN_TURNS = (
    "- Second: " + "b" * 291 + "…\n"
    "- Third: " + "c" * 292 + "…\n"
    "- Fifth: " + "d" * 292 + "…\n"
    "- Newest: " + "n" * 291 + "…"
)


def block(name: str, heading: str, text: str, key: str) -> str:
    return f"{heading}:\n<{name}-{key}>\n{text}\n</{name}-{key}>"


def test_persona_messages_golden():
    messages = build_persona_messages(golden_user(), load_prompt("persona"))
    key = fence({"memories": GOLDEN_MEMORIES, "turns": GOLDEN_TURNS}, shared=("memories",))["fence"]
    # The shared preamble, the step's task, then the user's context as data blocks: what the
    # requests share comes first, for the provider's prefix cache (the engine sends the two user
    # turns as one, with the reply's schema between them when it states one).
    assert messages == [
        {"role": "system", "content": section("shared", "preamble")},
        {"role": "user", "content": section("persona", "task")},
        {
            "role": "user",
            "content": block("memories", "Memories", GOLDEN_MEMORIES, key)
            + "\n\n"
            + block("turns", "The user's own recent messages", GOLDEN_TURNS, key),
        },
    ]


def test_one_step_asks_for_the_persona_and_the_big_five():
    """The Big Five levels come in the persona reply: one step, one prompt (main and compact)
    that asks for them after the traits, and a schema whose `big_five` follows the traits."""
    assert STEPS == (PERSONA_STEP,) and PERSONA_STEP.version == 2
    assert list(PERSONA_STEP.schema["properties"]) == ["depth", "topics", "traits", "big_five"]
    assert not (REPO / "prompts" / "big_five.md").exists()
    assert not (REPO / "prompts" / "compact" / "big_five.md").exists()
    for variant in (None, "compact"):
        task = load_prompt("persona", variant=variant).user.template
        assert "big_five" in task and all(trait in task for trait in BIG_FIVE), variant


def test_rendering_bounds():
    user = golden_user()
    lines = render_memories(user.memories).splitlines()
    value = lines[0].split(": ", 1)[1].split(' (user said: "')[0]
    quote = lines[0].split(' (user said: "')[1].removesuffix('")')
    assert len(value) == MEMORY_TEXT and value.endswith("…")
    assert len(quote) == EVIDENCE_TEXT and quote.endswith("…")

    turns = render_turns(user).splitlines()
    texts = [t.removeprefix("- ") for t in turns]
    assert all(len(t) <= TURN_TEXT for t in texts)
    assert sum(len(t) for t in texts) <= TURN_WINDOW
    assert texts[-1].startswith("Newest: ") and texts[0].startswith("Second: ")  # newest last
    assert "ASSISTANT" not in render_turns(user)

    # Values at the limits are kept whole.
    exact = make_user(memories=[memory("m1", "v" * MEMORY_TEXT, evidence_text="q" * EVIDENCE_TEXT)])
    assert (
        render_memories(exact.memories)
        == f'[m1] Emotional_State/Stress: {"v" * 240} (user said: "{"q" * 160}")'
    )


def test_unmapped_without_suggestion_keeps_its_label():
    user = make_user(memories=[{"memory_id": "m7", "label": "UNMAPPED", "value": "Likes rain"}])
    assert render_memories(user.memories) == "[m7] UNMAPPED: Likes rain"


@pytest.mark.parametrize(
    "turns",
    [[], [{"role": "assistant", "text": "Hello, how can I help?"}]],
    ids=["no-turns", "assistant-only"],
)
def test_no_user_turns_render_none(turns):
    user = make_user(memories=[memory("m1")], turns=turns)
    assert render_turns(user) == "(none)"
    content = build_persona_messages(user, load_prompt("persona"))[-1]["content"]
    assert re.search(r"The user's own recent messages:\n<turns-(\w+)>\n\(none\)\n</turns-\1>$", content)


# --- per-user schemas --------------------------------------------------------------------------


def test_schemas_narrow_evidence_to_the_users_memory_ids():
    original_persona = PERSONA_STEP.schema
    alice = make_user("alice", [memory("m1"), memory("m2"), memory("m3")])
    bob = make_user("bob", [memory("x9")])

    # One schema per user: trait and level citations both narrowed.
    alice_persona = alice_big_five = persona_schema(alice)
    bob_persona = bob_big_five = persona_schema(bob)

    def trait_items(schema):
        return schema["$defs"]["TraitReply"]["properties"]["evidence"]["items"]

    def level_items(schema):
        return schema["$defs"]["LevelReply"]["properties"]["evidence"]["items"]

    assert trait_items(alice_persona) == {"type": "string", "enum": ["m1", "m2", "m3"]}
    assert level_items(alice_big_five) == {"type": "string", "enum": ["m1", "m2", "m3"]}
    assert trait_items(bob_persona) == {"type": "string", "enum": ["x9"]}
    assert level_items(bob_big_five) == {"type": "string", "enum": ["x9"]}
    # Everything else is the model's own schema (min 1 citation per trait, aspects, levels).
    assert alice_persona["$defs"]["TraitReply"]["properties"]["evidence"]["minItems"] == 1
    level_enum = alice_big_five["$defs"]["LevelReply"]["properties"]["level"]["enum"]
    assert level_enum == ["low", "medium", "high"]
    restored = json.loads(json.dumps(bob_persona))
    for name in ("TraitReply", "LevelReply"):
        restored["$defs"][name]["properties"]["evidence"]["items"] = {"type": "string"}
    assert restored == original_persona
    # The levels may be null (a user the gate turns away), unless required: under
    # require_depth=False every grounded user is eligible and must get them.
    assert original_persona["properties"]["big_five"] == {
        "anyOf": [{"$ref": "#/$defs/BigFiveReply"}, {"type": "null"}]
    }
    required = persona_schema(alice, levels_required=True)
    assert required["properties"]["big_five"] == {"$ref": "#/$defs/BigFiveReply"}
    assert {**required, "properties": alice_persona["properties"]} == alice_persona
    # Neither the step's schema nor the first user's schema were changed by later calls.
    assert PERSONA_STEP.schema == original_persona
    assert original_persona["properties"]["big_five"]["anyOf"][1] == {"type": "null"}
    # Shared (OpenAI's cache rule): one schema for every user, ids checked after the reply.
    assert persona_schema(alice, shared=True) == persona_schema(bob, shared=True)
    assert trait_items(persona_schema(alice, shared=True)) == {"type": "string"}
    assert level_items(persona_schema(alice, shared=True)) == {"type": "string"}
    assert trait_items(original_persona) == {"type": "string"}
    assert trait_items(alice_persona)["enum"] == ["m1", "m2", "m3"]


# --- parse_persona -------------------------------------------------------------------------------

THREE = make_user("three", [memory("m1"), memory("m2"), memory("m3")])


def test_parse_persona_keeps_valid_traits():
    reply_ = persona_reply(
        [
            trait(["m1"], "  Gets anxious before exams.  "),
            trait(["m2", "m3"], "Leans on friends.", "social_context"),
        ],
        topics=("exams", "friends"),
    )
    parsed = parse_persona(THREE, reply_)
    assert parsed.eligible is True and parsed.gate_reason == "Talks about an ongoing worry."
    assert parsed.topics == ["exams", "friends"]
    checked = {"checks": {"no_internal_ids": True}}
    assert parsed.traits == [
        Trait(aspect="emotional_traits", statement="Gets anxious before exams.", evidence=["m1"], **checked),
        Trait(aspect="social_context", statement="Leans on friends.", evidence=["m2", "m3"], **checked),
    ]
    assert (parsed.grounding.traits_proposed, parsed.grounding.traits_dropped) == (2, 0)
    assert parsed.grounding.citations_dropped == 0


def test_parse_persona_removes_unknown_ids_and_traits_left_without_evidence():
    reply_ = persona_reply(
        [
            trait(["m1", "m99", "m2"], "Keeps going under pressure.", "stress_response"),
            trait(["m42", "m43"], "HALLUCINATED trait."),
            trait(["m3"], "Values honesty.", "values_motivations"),
        ]
    )
    parsed = parse_persona(THREE, reply_)
    assert [t.statement for t in parsed.traits] == ["Keeps going under pressure.", "Values honesty."]
    assert parsed.traits[0].evidence == ["m1", "m2"]
    assert parsed.grounding.traits_proposed == 3
    assert parsed.grounding.traits_dropped == 1
    assert parsed.grounding.citations_dropped == 3  # m99, m42, m43
    assert "HALLUCINATED" not in profile_text(parsed.traits)


def test_parse_persona_deduplicates_ids():
    parsed = parse_persona(THREE, persona_reply([trait(["m2", "m1", "m2", "m1", "m2"])]))
    assert parsed.traits[0].evidence == ["m2", "m1"]
    assert parsed.grounding.citations_dropped == 0


def test_parse_persona_blank_statement_is_dropped():
    parsed = parse_persona(THREE, persona_reply([trait(["m1"], "   "), trait(["m2"], "Kind.")]))
    assert [t.statement for t in parsed.traits] == ["Kind."]
    assert parsed.grounding.traits_dropped == 1


def test_parse_persona_all_ungrounded_is_rejected():
    """Rejected, not a unit error yet: the engine re-asks with the reason first."""
    reply_ = persona_reply([trait(["m77"]), trait(["m78", "m79"], "Other.")])
    with pytest.raises(RejectedReply) as caught:
        parse_persona(THREE, reply_)
    assert caught.value.kind == "ungrounded"
    assert "2 traits" in str(caught.value)


def test_parse_persona_empty_traits_with_depth_is_ungrounded():
    with pytest.raises(RejectedReply) as caught:
        parse_persona(THREE, persona_reply([]))
    assert caught.value.kind == "ungrounded"


def test_parse_persona_gate_false_is_ineligible_not_an_error():
    reply_ = PersonaReply.model_validate(
        {
            "depth": {"has_depth": False, "reason": "Only asks for film recommendations."},
            "topics": ["films"],
            "traits": [trait(["m1"], "Should be ignored.")],
            "big_five": {name: level("high", ["m1"], "Ignored too.") for name in BIG_FIVE},
        }
    )
    parsed = parse_persona(THREE, reply_)
    assert parsed.eligible is False
    assert parsed.gate_reason == "Only asks for film recommendations."
    assert parsed.traits == [] and parsed.big_five is None  # levels given anyway are not kept
    assert parse_persona(THREE, persona_reply([], has_depth=False, big_five=None)).eligible is False


def test_parse_persona_without_required_depth_keeps_grounded_traits():
    reply_ = PersonaReply.model_validate(
        {
            "depth": {"has_depth": False, "reason": "Only asks for films."},
            "topics": ["films"],
            "traits": [trait(["m1"], "Likes calm evenings."), trait(["m9"], "Unsupported.")],
            "big_five": {name: level() for name in BIG_FIVE},
        }
    )
    parsed = parse_persona(THREE, reply_, require_depth=False)
    assert parsed.eligible is True
    assert parsed.gate_reason == "depth check not enforced (it said no: Only asks for films.)"
    assert [t.statement for t in parsed.traits] == ["Likes calm evenings."]
    assert parsed.grounding.traits_dropped == 1
    assert parsed.big_five is not None and parsed.big_five.openness.level == "medium"
    # Kept, so it needs levels: a reply without them is re-asked.
    with pytest.raises(RejectedReply) as caught:
        parse_persona(THREE, reply_.model_copy(update={"big_five": None}), require_depth=False)
    assert caught.value.kind == "no_big_five"
    empty = PersonaReply.model_validate(
        {"depth": {"has_depth": False, "reason": "Nothing."}, "topics": [], "traits": [], "big_five": None}
    )
    with pytest.raises(RejectedReply) as caught:
        parse_persona(THREE, empty, require_depth=False)
    assert caught.value.kind == "ungrounded"


def test_parse_persona_refuses_an_eligible_reply_without_levels():
    """The gate said yes, so the user is eligible and later stages need its levels: a reply
    with `big_five: null` is re-asked with the reason, not kept without them."""
    with pytest.raises(RejectedReply) as caught:
        parse_persona(THREE, persona_reply([trait(["m1"])], big_five=None))
    assert caught.value.kind == "no_big_five" and "five levels" in str(caught.value)


# --- the Big Five levels of the reply ------------------------------------------------------------


def big_five_reply(traits=None, **levels: dict) -> PersonaReply:
    """A persona reply with one grounded trait (or `traits`) and these levels (else medium)."""
    chosen = {name: levels.get(name, level()) for name in BIG_FIVE}
    return persona_reply(traits or [trait(["m2"])], big_five=chosen)


def test_parse_big_five_keeps_valid_ids_and_marks_thin_levels():
    reply_ = big_five_reply(
        openness=level("high", ["m1", "m99", "m1"], "  Tries new hobbies.  "),
        conscientiousness=level("low", ["m98"], "Misses deadlines."),
        neuroticism=level("high", ["m3"], "Worries a lot."),
    )
    parsed = parse_persona(THREE, reply_)
    big_five, dropped = parsed.big_five, parsed.grounding.citations_dropped
    assert dropped == 2  # m99, m98
    assert big_five.openness.level == "high"
    assert big_five.openness.evidence == ["m1"] and big_five.openness.rationale == "Tries new hobbies."
    assert big_five.openness.thin_evidence is False
    assert big_five.conscientiousness.evidence == [] and big_five.conscientiousness.thin_evidence is True
    assert big_five.conscientiousness.level == "low"
    assert big_five.neuroticism.evidence == ["m3"] and big_five.neuroticism.thin_evidence is False
    for name in ("extraversion", "agreeableness"):
        assert getattr(big_five, name).thin_evidence is True and getattr(big_five, name).level == "medium"


@pytest.mark.parametrize("bad", ["very high", "High", "moderate", "", 3])
def test_big_five_reply_rejects_levels_outside_low_medium_high(bad):
    with pytest.raises(ValidationError) as caught:
        big_five_reply(agreeableness=level(bad))
    assert any(e["loc"][:3] == ("big_five", "agreeableness", "level") for e in caught.value.errors())


# --- the stage through the fake server -----------------------------------------------------------


def request_ids(body: dict) -> list[str]:
    schema = schema_for_request(body)
    assert list(schema["properties"]) == ["depth", "topics", "traits", "big_five"]  # the one step
    return schema["$defs"]["TraitReply"]["properties"]["evidence"]["items"].get("enum", [])


REASK_START = REASK.split("{error}")[0]


class Script:
    """Scripted replies per user: the user is recognised by its rendered memories in the prompt."""

    def __init__(self, input_path: Path, plans: dict[str, str] | None = None):
        self.users = [User.model_validate(row) for row in read_jsonl(input_path)]
        self.rendered = {u.user_id: render_memories(u.memories) for u in self.users}
        assert len(set(self.rendered.values())) == len(self.users)
        self.plans = plans or {}
        self.answers: dict[str, list] = {}  # per user, the replies it was given, in order

    def user_of(self, body: dict) -> str:
        content = body["messages"][1]["content"]
        content = content.split(f"\n\n{REASK_START}")[0]  # a re-ask quotes the bad reply after it
        found = [
            uid
            for uid, text in self.rendered.items()
            if re.search(
                rf"\n\nMemories:\n<memories-(\w+)>\n{re.escape(text)}\n</memories-\1>(\n\n|$)", content
            )
        ]
        assert len(found) == 1, content[:200]
        return found[0]

    def __call__(self, body: dict, number: int):
        user = self.user_of(body)
        plan = self.plans.get(user, "valid")
        # The ids the schema narrows to; a schema shared by every user (OpenAI's cache rule)
        # lists none, and a model reads them in the prompt: the user's own.
        ids = request_ids(body) or [m.memory_id for u in self.users if u.user_id == user for m in u.memories]
        reask = REASK_START in body["messages"][-1]["content"]
        content = persona_content(plan, ids, reask)
        self.answers.setdefault(user, []).append(content)
        return reply(content)

    def requests_of(self, server: FakeOpenAI, user_id: str) -> list[dict]:
        return [r.body for r in server.chat_requests if self.user_of(r.body) == user_id]


def persona_content(plan: str, ids: list[str], reask: bool = False):
    depth = {"has_depth": True, "reason": "Shares ongoing worries and how they cope."}
    traits = [
        {"aspect": "emotional_traits", "statement": "Feels things deeply.", "evidence": [ids[0]]},
        {"aspect": "social_context", "statement": "Relies on people close to them.", "evidence": ids},
    ]
    if plan == "gate":
        depth = {"has_depth": False, "reason": "Only factual questions."}
        traits = []
    elif plan == "hallucinated":
        traits = [
            {"aspect": "stress_response", "statement": "Pushes through.", "evidence": [ids[0], "m99"]},
            {"aspect": "sensitivities", "statement": "HALLUCINATED trait.", "evidence": ["m42"]},
            {"aspect": "values_motivations", "statement": "Values honesty.", "evidence": [ids[-1]]},
        ]
    elif plan == "ungrounded":
        traits = [
            {"aspect": "emotional_traits", "statement": "Invented.", "evidence": ["m77"]},
            {"aspect": "social_context", "statement": "Invented too.", "evidence": ["m78"]},
        ]
    elif plan == "empty":
        traits = []
    elif plan == "list":
        return traits  # the right items, the wrong shape
    levels = None if plan == "gate" else big_five_content(plan, ids, reask)
    return {"depth": depth, "topics": ["daily life", "people"], "traits": traits, "big_five": levels}


def big_five_content(plan: str, ids: list[str], reask: bool) -> dict:
    levels = {
        "openness": level("high", [ids[0]], "Curious about new things."),
        "conscientiousness": level("medium", [], "Evidence is thin."),
        "extraversion": level("low", [], "Evidence is thin."),
        "agreeableness": level("medium", [], "Evidence is thin."),
        "neuroticism": level("high", [ids[-1]], "Worries a lot."),
    }
    if plan == "hallucinated":
        levels["openness"]["evidence"] = [ids[0], "m99"]
        levels["conscientiousness"]["evidence"] = ["m98"]
    if plan == "bad_level_always" or (plan == "bad_level_once" and not reask):
        levels["neuroticism"]["level"] = "very high"
    return levels


PLANS = ["valid", "gate", "hallucinated", "ungrounded", "bad_level_once", "bad_level_always", "list", "empty"]
FAILING = {
    "ungrounded": "ungrounded",
    "empty": "ungrounded",
    "bad_level_always": "invalid",
    "list": "invalid",
}


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory):
    """One run over the 16 sample users: the first 8 each get one plan, the rest valid replies."""
    folder = tmp_path_factory.mktemp("stage")
    input_path = filtered_users(folder)
    users = [row["user_id"] for row in read_jsonl(input_path)]
    plans = dict(zip(users, PLANS, strict=False))
    script = Script(input_path, plans)
    output = folder / "personas.jsonl"
    with FakeOpenAI(responder=script) as server:
        made = infer_personas(input_path, output, settings_for(server, folder / "work"), console=quiet())
        report, summary = made.report, made.summary
    assert server.errors == []
    return {
        "input": input_path,
        "output": output,
        "folder": folder,
        "users": users,
        "plans": plans,
        "script": script,
        "server": server,
        "report": report,
        "summary": summary,
        "rows": {row["user_id"]: row for row in read_jsonl(output)},
        "failures": {row["user_id"]: row for row in read_jsonl(folder / "infer-persona.failures.jsonl")},
        "inputs": {row["user_id"]: row for row in read_jsonl(input_path)},
    }


def user_with(run, plan: str) -> str:
    return next(uid for uid, p in run["plans"].items() if p == plan)


def test_stage_outcome_balances_and_rows_follow_input_order(scripted_run):
    run = scripted_run
    outcome = run["report"].outcome
    assert outcome.balanced
    assert (outcome.units, outcome.done, outcome.failed) == (16, 12, 4)
    assert (outcome.done_before, outcome.failed_before) == (0, 0)
    assert dict(outcome.failures_by_kind) == {"ungrounded": 2, "invalid": 2}
    failing = {user_with(run, plan) for plan in FAILING}
    assert list(run["rows"]) == [u for u in run["users"] if u not in failing]
    assert set(run["failures"]) == failing
    assert run["report"].model == "fake" and run["report"].endpoint_kind == "remote"
    saved = json.loads((run["folder"] / "work" / "run_report.json").read_text())["stages"]["infer-persona"]
    assert (saved["units"], saved["done"], saved["failed"]) == (16, 12, 4)


def test_request_counts_per_user(scripted_run):
    run, script, server = scripted_run, scripted_run["script"], scripted_run["server"]
    expected = {  # persona requests (the levels in the same reply); max_reasks = 2
        "valid": 1,
        "gate": 1,
        "hallucinated": 1,
        "ungrounded": 3,  # an ungrounded reply is re-asked like an invalid one
        "bad_level_once": 2,  # a bad level re-asks the whole reply
        "bad_level_always": 3,
        "list": 3,
        "empty": 3,
    }
    for uid in run["users"]:
        plan = run["plans"].get(uid, "valid")
        assert len(script.requests_of(server, uid)) == expected[plan], (uid, plan)
    assert server.count == 9 * 1 + 1 + 1 + 3 + 2 + 3 + 3 + 3
    steps = run["report"].steps
    assert set(steps) == {"persona"} and steps["persona"]["requests"] == server.count
    assert steps["persona"]["reasks"] == 2 + 1 + 2 + 2 + 2


def test_one_request_per_user_and_the_big_five_comes_from_it(scripted_run):
    """One request per valid user, not a second one for the Big Five: the levels its row
    holds are the ones that request's reply gave."""
    run, script, server = scripted_run, scripted_run["script"], scripted_run["server"]
    valid = [uid for uid in run["users"] if run["plans"].get(uid, "valid") == "valid"]
    assert len(valid) == 9
    for uid in valid:
        [body] = script.requests_of(server, uid)
        assert body["response_format"]["json_schema"]["schema"]["properties"]["big_five"]
        [answer] = script.answers[uid]
        answered, row = answer["big_five"], run["rows"][uid]
        assert {t: row["big_five"][t]["level"] for t in BIG_FIVE} == {
            t: answered[t]["level"] for t in BIG_FIVE
        }
        assert {t: row["big_five"][t]["rationale"] for t in BIG_FIVE} == {
            t: answered[t]["rationale"] for t in BIG_FIVE
        }


def as_sent(messages: list[dict]) -> list[dict]:
    """A rendered prompt as a json_schema request carries it: its two user turns as one."""
    system, task, context = messages
    return [system, {"role": "user", "content": f"{task['content']}\n\n{context['content']}"}]


def test_requests_carry_the_users_ids_and_messages(scripted_run):
    script, server = scripted_run["script"], scripted_run["server"]
    persona_prompt = load_prompt("persona")
    for user in script.users:
        bodies = script.requests_of(server, user.user_id)
        assert bodies[0]["messages"] == as_sent(build_persona_messages(user, persona_prompt))
        assert bodies[0]["model"] == "fake"
        # Trait and level citations narrowed to the user's ids; the levels may be null.
        assert bodies[0]["response_format"]["json_schema"]["schema"] == persona_schema(user)


def test_valid_rows_are_grounded_with_profile_big_five_and_provenance(scripted_run):
    run = scripted_run
    hashes = {"persona": load_prompt("persona").hash}
    for uid, row in run["rows"].items():
        persona = Persona.model_validate(row)
        source = run["inputs"][uid]
        # The row extends the input row.
        for key, value in source.items():
            assert row[key] == value, key
        assert len(row["input_hash"]) == 16
        ids = {m.memory_id for m in persona.memories}
        for t in persona.traits:
            assert t.evidence and set(t.evidence) <= ids
        assert persona.profile == profile_text(persona.traits)
        assert persona.provenance.model == "fake"
        assert persona.provenance.endpoint_kind == "remote"
        assert persona.provenance.prompts == hashes
        assert persona.provenance.created_at
        if run["plans"].get(uid, "valid") == "gate":
            continue
        assert persona.eligible is True
        assert persona.gate_reason == "Shares ongoing worries and how they cope."
        assert persona.topics == ["daily life", "people"]
        assert persona.big_five is not None
        for name in BIG_FIVE:
            lv = getattr(persona.big_five, name)
            assert set(lv.evidence) <= ids
            assert lv.thin_evidence == (not lv.evidence)
        assert persona.big_five.openness.level == "high"
        assert persona.big_five.extraversion.level == "low"


def test_valid_user_row(scripted_run):
    run = scripted_run
    uid = user_with(run, "valid")
    persona = Persona.model_validate(run["rows"][uid])
    ids = [m.memory_id for m in persona.memories]
    assert [(t.aspect, t.statement, t.evidence) for t in persona.traits] == [
        ("emotional_traits", "Feels things deeply.", [ids[0]]),
        ("social_context", "Relies on people close to them.", ids),
    ]
    assert persona.profile == (
        "- emotional traits: Feels things deeply.\n- social context: Relies on people close to them."
    )
    assert persona.grounding.model_dump() == {
        "traits_proposed": 2,
        "traits_dropped": 0,
        "citations_dropped": 0,
    }
    assert persona.big_five.neuroticism.evidence == [ids[-1]]
    assert persona.big_five.conscientiousness.thin_evidence is True


def test_gate_false_row_is_kept_ineligible_without_big_five(scripted_run):
    run = scripted_run
    uid = user_with(run, "gate")
    row = run["rows"][uid]
    assert row["eligible"] is False
    assert row["gate_reason"] == "Only factual questions."
    assert row["traits"] == [] and row["profile"] == "" and row["big_five"] is None
    assert len(run["script"].requests_of(run["server"], uid)) == 1


def test_hallucinated_ids_are_dropped_and_counted(scripted_run):
    run = scripted_run
    uid = user_with(run, "hallucinated")
    persona = Persona.model_validate(run["rows"][uid])
    ids = [m.memory_id for m in persona.memories]
    assert [(t.statement, t.evidence) for t in persona.traits] == [
        ("Pushes through.", [ids[0]]),
        ("Values honesty.", [ids[-1]]),
    ]
    assert "HALLUCINATED" not in persona.profile
    # persona: m99 and m42; big five: m99 (openness) and m98 (conscientiousness)
    assert persona.grounding.model_dump() == {
        "traits_proposed": 3,
        "traits_dropped": 1,
        "citations_dropped": 4,
    }
    assert persona.big_five.openness.evidence == [ids[0]]
    assert persona.big_five.conscientiousness.evidence == []
    assert persona.big_five.conscientiousness.thin_evidence is True


@pytest.mark.parametrize("plan", ["ungrounded", "empty"])
def test_ungrounded_users_are_failures_not_rows(scripted_run, plan):
    run = scripted_run
    uid = user_with(run, plan)
    assert uid not in run["rows"]
    failure = run["failures"][uid]
    assert failure["kind"] == "ungrounded"
    raw = json.loads(failure["raw"])
    if plan == "ungrounded":
        assert [t["evidence"] for t in raw["traits"]] == [["m77"], ["m78"]]
    else:
        assert raw["traits"] == []
    assert len(run["script"].requests_of(run["server"], uid)) == 3


def test_wrong_level_string_is_reasked_then_accepted(scripted_run):
    run = scripted_run
    uid = user_with(run, "bad_level_once")
    first, second = run["script"].requests_of(run["server"], uid)
    assert len(first["messages"]) == len(second["messages"]) == 2
    assert second["messages"][0] == first["messages"][0]
    original, reask = first["messages"][1]["content"], second["messages"][1]["content"]
    assert reask.startswith(f"{original}\n\n{REASK_START}")
    quoted = reask.split("<<<\n")[1].split("\n>>>")[0]
    assert json.loads(quoted)["big_five"]["neuroticism"]["level"] == "very high"
    assert "big_five.neuroticism.level" in reask
    row = run["rows"][uid]
    assert row["eligible"] is True and row["big_five"]["neuroticism"]["level"] == "high"


def test_wrong_level_string_every_time_fails_invalid(scripted_run):
    run = scripted_run
    uid = user_with(run, "bad_level_always")
    bodies = run["script"].requests_of(run["server"], uid)
    assert len(bodies) == 3
    assert all(REASK_START in b["messages"][-1]["content"] for b in bodies[1:])
    failure = run["failures"][uid]
    assert failure["kind"] == "invalid"
    assert json.loads(failure["raw"])["big_five"]["neuroticism"]["level"] == "very high"
    assert "big_five.neuroticism.level" in failure["error"]


def test_reply_in_the_wrong_shape_is_reasked_then_fails(scripted_run):
    run = scripted_run
    uid = user_with(run, "list")
    bodies = run["script"].requests_of(run["server"], uid)
    assert len(bodies) == 3
    reask = bodies[1]["messages"][-1]["content"]
    assert REASK_START in reask
    assert isinstance(json.loads(reask.split("<<<\n")[1].split("\n>>>")[0]), list)
    failure = run["failures"][uid]
    assert failure["kind"] == "invalid"
    assert isinstance(json.loads(failure["raw"]), list)


def test_summary_counts_match_the_rows(scripted_run):
    run = scripted_run
    summary = run["summary"]
    assert summary.users_in == 16
    assert (summary.eligible, summary.ineligible) == (11, 1)
    # 10 users with the two valid traits + the hallucinated user's 2 kept traits
    assert summary.traits_kept == 10 * 2 + 2
    assert summary.traits_dropped == 1
    assert summary.citations_dropped == 4
    assert summary.thin_levels == 11 * 3
    again = summarize(run["output"], {row["user_id"] for row in read_jsonl(run["input"])})
    assert again == summary
    rows = [Persona.model_validate(r) for r in run["rows"].values()]
    assert summary.traits_kept == sum(len(p.traits) for p in rows)
    assert summary.eligible + summary.ineligible + run["report"].outcome.failed == summary.users_in


# --- re-runs, options ----------------------------------------------------------------------------


def test_rerun_makes_no_new_requests_and_cache_serves_a_fresh_output(tmp_path):
    input_path = filtered_users(tmp_path)
    users = [row["user_id"] for row in read_jsonl(input_path)]
    script = Script(input_path, {users[0]: "gate", users[1]: "ungrounded", users[2]: "bad_level_once"})
    output = tmp_path / "personas.jsonl"
    failures = tmp_path / "infer-persona.failures.jsonl"
    with FakeOpenAI(responder=script) as server:
        settings = settings_for(server, tmp_path / "work")
        made = infer_personas(input_path, output, settings, console=quiet())
        first, summary = made.report, made.summary
        sent = server.count
        rows = read_jsonl(output)
        assert (first.outcome.done, first.outcome.failed) == (15, 1)

        made = infer_personas(input_path, output, settings, console=quiet())
        again, summary_again = made.report, made.summary
        assert server.count == sent
        assert (again.outcome.done_before, again.outcome.failed_before) == (15, 1)
        assert (again.outcome.done, again.outcome.failed) == (0, 0) and again.outcome.balanced
        assert read_jsonl(output) == rows
        assert summary_again == summary

        # Without the checkpoint files every valid reply (re-asks included) comes from the
        # cache; the bad ones are never served, so those requests are sent again: the
        # ungrounded user's three and bad_level_once's first request.
        output.unlink()
        failures.unlink()
        made = infer_personas(input_path, output, settings, console=quiet())
        cached, summary_cached = made.report, made.summary
        assert server.count == sent + 4
        assert (cached.outcome.done, cached.outcome.failed) == (15, 1) and cached.outcome.balanced
        assert cached.totals["requests"] == 4
        assert cached.totals["cache_hits"] == sent - 4
        assert summary_cached == summary

        def stable(row):
            return {**row, "provenance": {**row["provenance"], "created_at": None}}

        assert [stable(r) for r in read_jsonl(output)] == [stable(r) for r in rows]
    assert server.errors == []


def test_limit_and_users_options(tmp_path):
    input_path = filtered_users(tmp_path)
    users = [row["user_id"] for row in read_jsonl(input_path)]
    script = Script(input_path)
    with FakeOpenAI(responder=script) as server:
        settings = settings_for(server, tmp_path / "work")
        made = infer_personas(input_path, tmp_path / "limit.jsonl", settings, limit=3, console=quiet())
        report, summary = made.report, made.summary
        assert [r["user_id"] for r in read_jsonl(tmp_path / "limit.jsonl")] == users[:3]
        assert report.outcome.units == 3 and summary.users_in == 3
        assert {script.user_of(r.body) for r in server.chat_requests} == set(users[:3])

        before = server.count
        picked = [users[9], users[4]]
        made = infer_personas(input_path, tmp_path / "picked.jsonl", settings, users=picked, console=quiet())
        report, summary = made.report, made.summary
        assert [r["user_id"] for r in read_jsonl(tmp_path / "picked.jsonl")] == [users[4], users[9]]
        assert report.outcome.units == 2 and summary.eligible == 2
        assert {script.user_of(r.body) for r in server.chat_requests[before:]} == set(picked)

        before = server.count
        with pytest.raises(InputError, match="no user nobody-here"):
            infer_personas(
                input_path, tmp_path / "bad.jsonl", settings, users=[users[0], "nobody-here"], console=quiet()
            )
        assert server.count == before
        assert not (tmp_path / "bad.jsonl").exists()
    assert server.errors == []


def test_read_rows_rejects_a_row_that_is_not_a_user(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"user_id": "u1"}])
    with pytest.raises(InputError, match=r"bad.jsonl:1: not a user row"):
        read_rows(path)


# --- CLI -----------------------------------------------------------------------------------------


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"OPENAI_API_KEY": "sk-cli-test"})


def test_cli_infer_persona_and_show(tmp_path):
    input_path = filtered_users(tmp_path)
    users = [row["user_id"] for row in read_jsonl(input_path)]
    script = Script(input_path, {users[1]: "gate"})
    output = tmp_path / "out" / "personas.jsonl"
    work = tmp_path / "work"
    with FakeOpenAI(responder=script) as server:
        result = invoke(
            "infer-persona",
            "--input",
            input_path,
            "--output",
            output,
            "--base-url",
            server.base_url,
            "--model",
            "fake",
            "--work-dir",
            work,
            "--max-retries",
            "0",
        )
        assert result.exit_code == 0, result.output
        assert server.count == 16  # one request per user, the gated one's included
        auth = {r.headers.get("authorization") for r in server.chat_requests}
        assert auth == {"Bearer sk-cli-test"}
    stderr = result.stderr
    assert "infer-persona: 16 units = 16 done + 0 done earlier + 0 failed + 0 failed earlier" in stderr
    assert "infer-persona · fake (remote)" in stderr
    assert "personas: 15 eligible + 1 failed the depth gate (kept, eligible: false) of 16 users" in stderr
    assert "traits kept 30" in stderr
    assert f"wrote {output}" in stderr
    assert result.stdout == ""
    assert len(read_jsonl(output)) == 16
    assert (work / "run_report.json").is_file()
    assert "sk-cli-test" not in (work / "run_report.json").read_text()

    # --show: each trait, then the text of each memory it cites.
    shown = users[0]
    result = invoke("infer-persona", "--output", output, "--show", shown)
    assert result.exit_code == 0, result.output
    persona = Persona.model_validate(next(r for r in read_jsonl(output) if r["user_id"] == shown))
    values = {m.memory_id: m.value for m in persona.memories}
    lines = result.stdout.splitlines()
    assert lines[0].startswith(shown) and "eligible True" in lines[0]
    for t in persona.traits:
        at = lines.index(f"{t.aspect}: {t.statement}")
        cited = [line.strip() for line in lines[at + 1 : at + 1 + len(t.evidence)]]
        assert cited == [f"{i} {values[i]}" for i in t.evidence]
    assert "openness high: Curious about new things." in lines
    assert "conscientiousness medium (thin evidence): Evidence is thin." in lines
    assert persona.provenance.prompts["persona"] in result.stdout

    # The ineligible user shows its gate reason and no traits.
    result = invoke("infer-persona", "--output", output, "--show", users[1])
    assert result.exit_code == 0, result.output
    assert "eligible False" in result.stdout and "gate: Only factual questions." in result.stdout

    result = invoke("infer-persona", "--output", output, "--show", "no-such-user")
    assert result.exit_code == 2
    assert "Error:" in result.stderr and "no-such-user" in result.stderr
    assert "Traceback" not in result.output


def test_cli_missing_input_exits_2(tmp_path):
    missing = tmp_path / "nope" / "filtered.jsonl"
    result = invoke(
        "infer-persona",
        "--input",
        missing,
        "--output",
        tmp_path / "personas.jsonl",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "fake",
        "--work-dir",
        tmp_path / "work",
    )
    assert result.exit_code == 2
    assert result.stderr.startswith("Error:") and "no such file" in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "personas.jsonl").exists()


def test_cli_show_without_output_file_exits_2(tmp_path):
    result = invoke("infer-persona", "--output", tmp_path / "none.jsonl", "--show", "u1")
    assert result.exit_code == 2
    assert "Error:" in result.stderr and "no such file" in result.stderr


def test_cli_users_and_limit_options(tmp_path):
    input_path = filtered_users(tmp_path)
    users = [row["user_id"] for row in read_jsonl(input_path)]
    script = Script(input_path)
    with FakeOpenAI(responder=script) as server:
        common = ["--base-url", server.base_url, "--model", "fake", "--work-dir", tmp_path / "work"]
        picked = tmp_path / "picked.jsonl"
        result = invoke(
            "infer-persona", "-i", input_path, "-o", picked, "--users", users[5], "--users", users[2], *common
        )
        assert result.exit_code == 0, result.output
        assert [r["user_id"] for r in read_jsonl(picked)] == [users[2], users[5]]
        assert "infer-persona: 2 units = 2 done" in result.stderr

        limited = tmp_path / "limited.jsonl"
        result = invoke("infer-persona", "-i", input_path, "-o", limited, "--limit", "2", *common)
        assert result.exit_code == 0, result.output
        assert [r["user_id"] for r in read_jsonl(limited)] == users[:2]

        before = server.count
        result = invoke("infer-persona", "-i", input_path, "-o", limited, "--users", "ghost", *common)
        assert result.exit_code == 2
        assert result.stderr.startswith("Error:") and "no user ghost" in result.stderr
        assert server.count == before


# --- behaviour found wrong while writing these tests (see the report of this test file) ------------


def test_pick_units_limit_with_users_does_not_call_a_present_user_missing(tmp_path):
    """`--limit 1 --users A --users B`: B is in the file, so no "no user B" error."""
    input_path = filtered_users(tmp_path)
    users = read_rows(input_path).ids
    assert users == [row["user_id"] for row in read_rows(input_path)]
    assert pick_units(users, input_path, limit=1, users=[users[5], users[3]]) == {users[3]}
    assert pick_units(users, input_path) is None
    with pytest.raises(InputError, match="--limit must be at least 1"):
        pick_units(users, input_path, limit=0)


def test_quick_look_with_users_keeps_the_other_finished_personas(tmp_path):
    """A `--users X` quick look into the same output must not delete the other users' personas."""
    input_path = filtered_users(tmp_path)
    users = [row["user_id"] for row in read_jsonl(input_path)]
    output = tmp_path / "personas.jsonl"
    with FakeOpenAI(responder=Script(input_path)) as server:
        settings = settings_for(server, tmp_path / "work")
        infer_personas(input_path, output, settings, console=quiet())
        assert len(read_jsonl(output)) == 16
        infer_personas(input_path, output, settings, users=[users[4]], console=quiet())
    assert [r["user_id"] for r in read_jsonl(output)] == users


def test_ungrounded_failure_records_the_raw_reply_text(tmp_path):
    """DESIGN.md: failures.jsonl holds the *last raw response*, not a re-serialised parse."""
    user_row = {
        "user_id": "u1",
        "source": {"format": "raw", "path": "hand-made.json"},
        "turns": [{"role": "user", "text": "I feel low."}],
        "memories": [memory("m1")],
    }
    input_path = write_jsonl(tmp_path / "filtered.jsonl", [user_row])
    raw = (
        '{"depth": {"has_depth": true, "reason": "Feels low."}, "topics": ["mood"], '
        '"traits": [{"aspect": "emotional_traits", "statement": "Sad.", "evidence": ["m9"]}], '
        '"big_five": null, "note": "m9 is about the breakup"}'
    )
    with FakeOpenAI(responder=lambda body, number: reply(raw)) as server:
        report = infer_personas(
            input_path, tmp_path / "personas.jsonl", settings_for(server, tmp_path / "work"), console=quiet()
        ).report
    assert dict(report.outcome.failures_by_kind) == {"ungrounded": 1}
    [failure] = read_jsonl(tmp_path / "infer-persona.failures.jsonl")
    assert failure["raw"] == raw


def cites_m1(body: dict, number: int):
    trait = {"aspect": "stress_response", "statement": "Worries before exams.", "evidence": ["m1"]}
    level = {"level": "medium", "evidence": ["m1"], "rationale": "Some signs of it."}
    return {
        "depth": {"has_depth": True, "reason": "personal"}, "topics": ["exams"], "traits": [trait],
        "big_five": dict.fromkeys(BIG_FIVE, level),
    }  # fmt: skip


def test_under_openais_cache_rule_every_user_gets_the_same_untitled_schema(tmp_path):
    """OpenAI bills the response schema as the prompt's prefix: a schema narrowed to each
    user's ids kept every request from its cache. Under cache_rule = "openai" the schema is
    the step's own for every user (parse drops an id the user does not have); with the default
    rule the ids are narrowed as before."""
    rows = [
        make_user(name, [memory(f"m{i}") for i in range(1, count + 1)])
        for name, count in (("a", 2), ("b", 3))
    ]
    source = tmp_path / "filtered.jsonl"
    source.write_text("".join(u.model_dump_json() + "\n" for u in rows), encoding="utf-8")
    schemas = {}
    for rule in ("openai", "deepseek"):
        # Cites m1, which both users have (the default reply would invent ids: nothing narrows them).
        with FakeOpenAI(responder=cites_m1, prefix_cache="openai") as server:
            settings = LLMSettings(
                base_urls=[server.base_url], model="fake", work_dir=tmp_path / rule, cache_rule=rule
            )
            infer_personas(source, tmp_path / f"{rule}.jsonl", settings, console=quiet())
            schemas[rule] = [
                json.dumps(r.body["response_format"]["json_schema"]["schema"], sort_keys=True)
                for r in server.chat_requests
                if "depth" in r.body["response_format"]["json_schema"]["schema"]["properties"]
            ]
    assert len(schemas["openai"]) == 2 and len(set(schemas["openai"])) == 1, "one request per user"
    assert len(set(schemas["deepseek"])) == 2  # narrowed to each user's ids
    assert '"title"' not in schemas["openai"][0]
