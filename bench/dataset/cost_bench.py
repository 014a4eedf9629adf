"""What a query costs: tokens per accepted query over infer-persona + gen-queries.

Runs `filter` on ../shared/alpsbench, then infer-persona and gen-queries on the first
100 kept users against the fake OpenAI server, whose scripted replies are shaped like a
capable model's (sizes included) and pass the gates about 90% of the time. Tokens are
counted as characters / 4 over every prompt and reply of every step (persona with its Big Five,
situations with their messages, checks), so the figure does not depend on an endpoint's tokenizer.
Target: <= 5,000 tokens per accepted query, Big Five included.

    .venv/bin/python bench/dataset/cost_bench.py [--users 100]
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]

from benchlib import fake_endpoint, parser  # noqa: E402

from personaemp.dataset.filter import filter_users  # noqa: E402
from personaemp.dataset.persona import infer_personas  # noqa: E402
from personaemp.dataset.queries import LANGUAGE_NAMES, generate_queries  # noqa: E402
from personaemp.language import detect_language  # noqa: E402

# One message per category and language; other languages reuse the user's own messages.
SENTENCES = {
    "en": {
        "ES": "I keep replaying what happened ({topic}) and I feel awful. Is it normal to be this upset?",
        "HEQ": "My sister snapped at me again ({topic}). How do I tell her it hurt without starting a fight?",
        "SS": "I need to ask my manager for time off ({topic}). How should I phrase it so it lands well?",
    },
    "zh": {
        "ES": "关于{topic}的事我一直放不下，心里特别难受，这样正常吗？",
        "HEQ": "我和家人又因为{topic}吵起来了，我该怎么开口才不会让关系更僵？",
        "SS": "我想跟领导提{topic}这件事，怎么说才显得得体又有说服力？",
    },
    "ru": {
        "ES": "Никак не могу отпустить то, что случилось ({topic}), мне очень тяжело. Это нормально?",
        "HEQ": "Мы снова поссорились из-за {topic}. Как сказать о своих чувствах без скандала?",
        "SS": "Мне нужно попросить начальника о {topic}. Как лучше сформулировать просьбу?",
    },
}
ASPECTS = ["emotional_traits", "stress_response", "social_context", "values_motivations"]
# What a trait is about: a real model writes each user's profile in its own words, so a later
# request that carries the profile shares no prefix with another user's (one fixed sentence for
# every user let the provider's cache serve the profile across users: cost counted too low).
SUBJECTS = (
    "money", "the new job", "their mother's health", "exams", "a move abroad", "an old friend",
    "the team lead", "their partner", "a long-distance relationship", "their son's school",
    "a side project", "the wedding plans", "a lawsuit", "their weight", "the visa", "a breakup",
    "their father", "the flatmates", "a promotion", "public speaking", "the thesis", "a loan",
    "the in-laws", "their sister", "a diagnosis", "night shifts", "the startup", "the neighbours",
    "a custody case", "their grades", "the band", "a debt", "their boss", "the exchange year",
    "the twins", "an audition", "their stammer", "a pet's illness", "the church group", "a fine",
)  # fmt: skip
WAYS = (
    "at work", "at home", "online", "with family", "with friends", "late at night",
    "before deadlines", "in groups", "when alone", "after conflicts", "on weekends",
    "in class", "with strangers", "at meetings", "over the phone", "in public",
    "on holidays", "in the mornings", "after bad news", "when tired", "with their partner",
    "with colleagues", "in new places", "under criticism", "when praised",
)  # fmt: skip


def trait_statements(request_text: str, count: int) -> list[str]:
    """`count` trait sentences of one user's profile, worded for that user: drawn from the
    request's data blocks (its text when it has none), apart from the run's other draws, so a
    user gets the same profile whichever provider's format the request has."""
    about = sorted(BLOCK.findall(request_text)) or request_text
    rng = random.Random(hashlib.sha256(json.dumps(about, ensure_ascii=False).encode()).hexdigest())
    picked = rng.sample([(s, w) for s in SUBJECTS for w in WAYS], count)
    return [
        f"About {subject} {way}, tends to worry how others see their choices and looks for "
        "reassurance before acting."
        for subject, way in picked
    ]


def _enum(schema: dict, definition: str, field: str, prompt: str) -> list[str]:
    """The ids a reply may cite: the schema's enum, else (a schema shared by every user) the
    memory ids listed in the prompt, as a capable model reads them."""
    listed = schema["$defs"][definition]["properties"][field]["items"].get("enum")
    return listed or list(dict.fromkeys(re.findall(r"^\[(m\d+)\]", prompt, re.MULTILINE))) or ["m1"]


def _user_draw(prompt: str) -> float:
    """A number in [0, 1) fixed by the user's memory lines in the prompt: whether a user is
    deep does not hang on the order the requests of a run draw from the shared rng, so two
    layouts of the build are compared on the same deep users."""
    lines = "\n".join(re.findall(r"^\[m\d+\] .*$", prompt, re.MULTILINE))
    return int.from_bytes(hashlib.sha256(lines.encode()).digest()[:8], "big") / 2**64


MEMORY_LABELS = (
    "Social_Relationships/Family",
    "States_Experiences/Mental_State",
    "Thoughts/Opinions/Negative",
)


def memories_reply(schema: dict, prompt: str, rng: random.Random) -> dict:
    """extract-memories: up to three memories, each citing one of the user's messages (the
    ids the schema allows, the first line of their text in the prompt) with a quote from it."""
    allowed = schema["$defs"]["EvidenceReply"]["properties"]["turn"].get("enum")
    lines = dict(re.findall(r"^\[(t\d+)\] (.+)$", prompt, re.MULTILINE))
    ids = [i for i in (allowed or lines) if i in lines]
    picked = sorted(rng.sample(ids, min(3, len(ids))), key=lambda i: int(i[1:]))
    return {
        "memory_items": [
            {
                "type": "direct",
                "label": MEMORY_LABELS[n % len(MEMORY_LABELS)],
                "label_suggestion": None,
                "value": "Wrote about " + " ".join(lines[i].split()[:8]),
                "evidence": {"turn": i, "quote": lines[i].strip()[:80]},
                "confidence": 0.8,
                "emotion": "worry" if n == 1 else None,
                "time_scope": "long_term",
            }
            for n, i in enumerate(picked)
        ],
        "intents_ranked": [
            {"intent_category": "Emotional Support", "intent_subtype": "talking things through"}
        ],
    }


BLOCK = re.compile(r"<(\w+)-[0-9a-f]{16}>\n(.*?)\n</\1-[0-9a-f]{16}>", re.DOTALL)


def user_message(asked: str, category: str, number: int) -> str:
    """The message of a user's moment `number`, in the language the request names: SENTENCES
    for it, else a new sentence of the user's own words. Drawn from the user's profile and
    messages and the moment's number, not from the request: the same message whichever
    request writes it (a checkout's situations reply, or an older one's query step)."""
    # The language as the task names it, outside the data blocks (a memory may say "in English.").
    visible = BLOCK.sub("", asked)
    language = next((c for c, n in LANGUAGE_NAMES.items() if f"in {n}." in visible), "en")
    user = sorted({(name, text) for name, text in BLOCK.findall(asked) if name in ("profile", "turns")})
    rng = random.Random(json.dumps([user, number], ensure_ascii=False))
    if language not in SENTENCES:
        # The user's own messages, once each (not the profile's lines: those are in English).
        lines = [line for name, text in user if name == "turns" for line in text.splitlines()]
        said = " ".join(dict.fromkeys(re.findall(r"^- (.{20,})$", "\n".join(lines), re.MULTILINE)))
        own = [word for word in said.split() if re.fullmatch(r"[^\W\d_]+[.,!?]?", word)]  # words, no formulas
        if own:  # in their language: a new sentence from their words
            return " ".join(rng.sample(own, min(len(own), 16))) + "?"
        language = "en"
    return SENTENCES[language][category].format(topic=f"#{rng.randint(0, 999)}")


def responder(rng: random.Random):
    def answer(body: dict, number: int):
        schema = body["response_format"]["json_schema"]["schema"]
        prompt = body["messages"][-1]["content"]
        asked = "\n".join(m["content"] for m in body["messages"])
        properties = schema["properties"]
        if "memory_items" in properties:
            return memories_reply(schema, prompt, rng)
        if "depth" in properties:
            ids = _enum(schema, "TraitReply", "evidence", asked)
            deep = _user_draw(asked) < 0.9
            traits = [
                {
                    "aspect": ASPECTS[i % len(ASPECTS)],
                    "statement": statement,
                    "evidence": rng.sample(ids, min(2, len(ids))),
                }
                for i, statement in enumerate(trait_statements(asked, 3) if deep else [])
            ]
            reason = "The memories show recurring personal concerns and reactions to them."
            levels = {  # the Big Five, for deep users only (the prompt allows null otherwise)
                trait: {
                    "level": rng.choice(["low", "medium", "high"]),
                    "evidence": rng.sample(ids, 1),
                    "rationale": "Their reactions in the cited memory point this way.",
                }
                for trait in schema["$defs"].get("BigFiveReply", {}).get("properties", {})
                if deep
            }
            answer = {
                "depth": {"has_depth": deep, "reason": reason},
                "topics": ["family", "work stress", "self-doubt"],
                "traits": traits,
            }
            if "BigFiveReply" not in schema["$defs"]:
                return answer  # a checkout before issue 52 asks the levels in a request of its own
            return {**answer, "big_five": levels if deep else None}
        if "openness" in properties:  # that request
            ids = _enum(schema, "LevelReply", "evidence", asked)
            return {
                trait: {
                    "level": rng.choice(["low", "medium", "high"]),
                    "evidence": rng.sample(ids, 1),
                    "rationale": "Their reactions in the cited memory point this way.",
                }
                for trait in properties
            }
        if "situations" in properties:  # each moment with the user's message
            ids = _enum(schema, "SituationReply", "memory_ids", asked)
            categories = schema["$defs"]["SituationReply"]["properties"]["category"]["enum"]
            moments = [
                {
                    "category": category,
                    "topic": f"{category.lower()} topic",
                    "text": f"{category} moment: after another tense evening the user replays a "
                    "conversation with someone close and wonders how to handle the next one.",
                    "memory_ids": rng.sample(ids, 1),
                }
                for category in categories
            ]
            if "message" not in schema["$defs"]["SituationReply"]["properties"]:
                return {"situations": moments}  # a checkout with a query step of its own
            for n, moment in enumerate(moments, 1):
                moment["message"] = user_message(asked, moment["category"], n)
            return {"situations": moments}
        if "messages" in properties:  # the query step of a checkout before issue 52
            moments = re.findall(r"^\d+\. \[(\w+)\]", prompt, re.MULTILINE)
            return {
                "messages": [
                    {"situation": n, "text": user_message(asked, category, n)}
                    for n, category in enumerate(moments, 1)
                ]
            }
        if "reviews" in properties:
            texts = re.findall(r"^\d+\. \(moment: (\w+) moment.*?\) (.*)$", prompt, re.MULTILINE)
            # Since issue 52 the schema lets the reason be null, and asks it only for a failure.
            nullable = "null" in json.dumps(schema["$defs"]["ReviewReply"]["properties"]["reason"])
            reviews = []
            for n, (category, text) in enumerate(texts, 1):
                support, consistent = rng.random() < 0.95, rng.random() < 0.97
                if not nullable:
                    reason = "Fits the moment and the user."
                elif support and consistent:
                    reason = None
                else:
                    reason = "It reads as a factual request, not one that needs empathy."
                reviews.append({
                    "message": n, "emotional_support": support, "logical_consistency": consistent,
                    "role_awareness": True, "category": category,
                    "language": detect_language(text) or "en", "reason": reason,
                })  # fmt: skip
            return {"reviews": reviews}
        return {}

    return answer


def queries_from(source: Path, work: Path, settings, *, limit: int | None = None, console=None):
    """filter, infer-persona (the first `limit` users) and gen-queries into `work`, as the
    benches start: (the persona report, the queries report, the funnel)."""
    filter_users(str(source), work / "filtered.jsonl", console=console)
    personas = infer_personas(
        work / "filtered.jsonl", work / "personas.jsonl", settings, limit=limit, console=console
    ).report
    made = generate_queries(work / "personas.jsonl", work / "queries.jsonl", settings, console=console)
    queries, funnel = made.report, made.summary
    return personas, queries, funnel


def main() -> None:
    args = parser(__doc__, users=100).parse_args()
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    with fake_endpoint(responder(random.Random(7))) as (work, settings):
        persona_report, query_report, funnel = queries_from(
            args.source, work, settings, limit=args.users, console=quiet
        )
        steps = {**persona_report.steps, **query_report.steps}
    accepted = sum(funnel.accepted.values())
    print(f"users: {args.users} filtered users in, {funnel.users_in} eligible personas")
    print(f"queries: {funnel.generated} generated, {accepted} accepted {dict(funnel.accepted)}")
    print(f"failed checks: {dict(funnel.failed_checks)}")
    total = 0
    for name, stats in steps.items():
        tokens = (stats["prompt_chars"] + stats["completion_chars"]) / 4
        total += tokens
        share = tokens / max(accepted, 1)
        print(f"  {name:10s} {stats['calls']:4d} calls {tokens:9.0f} tokens {share:7.0f} per accepted query")
    print(f"tokens per accepted query: {total / max(accepted, 1):.0f} (target <= 5000, Big Five included)")
    print(json.dumps({"tokens_per_accepted_query": round(total / max(accepted, 1))}))


if __name__ == "__main__":
    main()
