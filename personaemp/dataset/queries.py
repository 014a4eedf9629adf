"""`personaemp gen-queries`: situations, each with the user's message, then consistency checks.

Two LLM requests per eligible user, each over all of the user's situations so the
profile and memories are sent once per request, not once per query:
  situations -> moments before a request, each with a category (ES/HEQ/SS), memory ids
                and the message the user sends then, in their language and voice (one
                request: a second one would send the profile again after another task,
                which no prefix cache serves)
  checks     -> an LLM judge per message (EQ needed, consistent, fits the persona,
                category, language), then deterministic checks (personaemp/checks.py);
                a request of its own, so the judge is not the writer's own reply
Only queries that pass every check are kept; the others are kept apart with reasons.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from pydantic import BaseModel
from rich.table import Table

from personaemp import checks
from personaemp.aio import sync_twin
from personaemp.errors import InputError, some
from personaemp.instruments.query_check import (
    CHECK,
    CHECKS,
    SituationReply,
    build_check_messages,
    judge_checks,
    reviews_schema,
)
from personaemp.io import ErrorPolicy, StageRows, atomic_output, iter_jsonl, read_stage_rows
from personaemp.language import LANGUAGE_NAMES
from personaemp.llm.step import Step, edit_schema, id_choice
from personaemp.prompts import COMPACT, Prompt, prompts_per_variant
from personaemp.records import (
    CATEGORIES,
    Persona,
    Query,
    Situation,
    category_definitions,
)
from personaemp.render import render_memories, render_turns
from personaemp.shards import failures_path, sharded_pick
from personaemp.summaries import print_run_report

STAGE = "gen-queries"


# --- reply models ----------------------------------------------------------------------------


class SituationsReply(BaseModel):
    situations: list[SituationReply]


# version 2: each moment carries the user's message (the query step is gone)
SITUATIONS = Step("situations", SituationsReply, prompt="situations", version=2)
STEPS = (SITUATIONS, CHECK)


# --- request 1: situations and their messages ------------------------------------------------


@dataclass(frozen=True)
class QueryOptions:
    categories: tuple[str, ...] = CATEGORIES
    per_category: int = 1
    enforce: tuple[str, ...] = CHECKS  # checks a query must pass; the others are only recorded

    def __post_init__(self) -> None:
        unknown_checks = set(self.enforce) - set(CHECKS)
        if unknown_checks:
            raise InputError(f"--enforce takes {', '.join(CHECKS)}, not {some(sorted(unknown_checks))}")
        unknown = set(self.categories) - set(CATEGORIES)
        if unknown or not self.categories:
            raise InputError(f"--categories takes ES, HEQ and/or SS, not {some(sorted(unknown))}")
        if self.per_category < 1:
            raise InputError("--per-category must be at least 1")


def build_situation_messages(persona: Persona, options: QueryOptions, prompt: Prompt) -> list[dict]:
    return prompt.render(
        language=LANGUAGE_NAMES.get(persona.language or "", persona.language or "the user's language"),
        profile=persona.profile,
        memories=render_memories(persona.memories),
        turns=render_turns(persona),
        per_category=str(options.per_category),
        categories=", ".join(options.categories),
        category_definitions=category_definitions(options.categories),
    )


def situations_schema(
    persona: Persona, options: QueryOptions, one_each: bool = False, shared: bool = False
) -> dict[str, Any]:
    """The reply's schema, memory ids and categories narrowed to this user and these options.
    `one_each` (the compact prompt, for the embedded model, which otherwise writes one moment
    and stops): exactly per_category moments of each category, in order."""
    item = ("$defs", "SituationReply", "properties")
    ids = id_choice([m.memory_id for m in persona.memories], shared)
    schema = edit_schema(SITUATIONS.schema, (*item, "memory_ids", "items"), ids)
    schema = edit_schema(schema, (*item, "category"), {"type": "string", "enum": list(options.categories)})
    count = options.per_category * len(options.categories)
    if not one_each:
        return edit_schema(schema, ("properties", "situations"), maxItems=count)
    moment = schema["$defs"]["SituationReply"]
    fixed = [
        {**moment, "properties": {**moment["properties"], "category": {"type": "string", "enum": [category]}}}
        for category in options.categories
        for _ in range(options.per_category)
    ]
    listed = {key: value for key, value in schema["properties"]["situations"].items() if key != "items"}
    listed.update(prefixItems=fixed, minItems=count, maxItems=count)  # llama.cpp reads `items` first
    return edit_schema(schema, ("properties", "situations"), listed)


def parse_situations(
    persona: Persona, reply: SituationsReply, options: QueryOptions
) -> tuple[list[SituationReply], Counter]:
    """Situations with valid ids, in allowed categories, at most per_category each, their
    messages stripped; a kept one whose message is blank is counted (no_query_written)
    and stays in the list, so each kept moment keeps its number (the query id's)."""
    known = {m.memory_id for m in persona.memories}
    kept, dropped, per = [], Counter(), Counter()
    for situation in reply.situations:
        ids = list(dict.fromkeys(i for i in situation.memory_ids if i in known))
        if situation.category not in options.categories:
            dropped["category_not_requested"] += 1
        elif not ids:
            dropped["no_valid_memory"] += 1
        elif per[situation.category] >= options.per_category:
            dropped["over_per_category"] += 1
        else:
            per[situation.category] += 1
            message = situation.message.strip()
            if not message:
                dropped["no_query_written"] += 1
            kept.append(situation.model_copy(update={"memory_ids": ids, "message": message}))
    return kept, dropped


# --- the stage -------------------------------------------------------------------------------


def read_personas(path: Path) -> tuple[StageRows, int]:
    """Eligible persona rows (and how many ineligible ones were skipped)."""
    return read_stage_rows(
        path, Persona, keep=lambda persona: persona.eligible and bool(persona.traits), kind="persona"
    )


async def agenerate_queries(input_path: Path, output_path: Path, settings, *, console=None, **options):
    """Queries for every eligible persona; returns the StageResult (`.report`: the run
    report, `.summary`: the QueryFunnel), as `pe.generate_queries` does.

    `options` are queries_stage's (`options`, `limit`, `users`, `retry_failed`, `full`,
    `shard`, as for `infer_personas`)."""
    from personaemp.llm.stage import arun_llm_stage
    from personaemp.results import of_llm_stage

    plan = queries_stage(input_path, output_path, **options)
    report = await arun_llm_stage(plan, settings=settings, console=console)
    if report.estimate is not None:  # nothing was written: no funnel to update
        return of_llm_stage(report, QueryFunnel(users_in=len(plan.units), ineligible_skipped=plan.skipped))
    return of_llm_stage(report, funnel(plan))


generate_queries = sync_twin(agenerate_queries)


def queries_stage(
    input_path: Path,
    output_path: Path,
    *,
    options: QueryOptions | None = None,
    limit: int | None = None,
    users: Sequence[str] | None = None,
    retry_failed: bool = False,
    full: bool | None = None,
    shard: str | None = None,
    chained: bool = False,
):
    """The stage as an LLMStage. `chained`: its input is still being written (by
    infer-persona in the same run, see `handoff`), so it is not read now."""
    from personaemp.llm.stage import LLMStage

    options = options or QueryOptions()
    rows, ineligible, selected, name = [], 0, None, STAGE
    if not chained:
        rows, ineligible = read_personas(input_path)
        name, output_path, rows, selected = sharded_pick(
            STAGE,
            output_path,
            rows,
            shard,
            input_path,
            limit=limit,
            users=users,
            label="eligible persona for",
        )

    stage_options = f"{','.join(options.categories)}|{options.per_category}|{','.join(options.enforce)}"

    loaded = prompts_per_variant(STEPS)

    def fingerprint(engine) -> str:
        made_with = loaded(engine.prompt_variant)[1]
        return "|".join([*(engine.fingerprint(step, made_with[step.name]) for step in STEPS), stage_options])

    def make_work(engine):
        prompts, made_with = loaded(engine.prompt_variant)

        async def work(row: dict) -> dict:
            persona = Persona.model_validate(row)
            accepted, rejected, dropped = await queries_for(engine, persona, options, prompts, made_with)
            return {
                **row,
                "queries": [q.model_dump(mode="json") for q in accepted],
                "rejected_queries": [q.model_dump(mode="json") for q in rejected],
                "situation_counts": dict(dropped),
            }

        return work

    return LLMStage(
        name, rows, make_work, "user_id", output_path,
        fingerprint=fingerprint,
        steps=STEPS, selected=selected, full=full, input_path=input_path, retry_failed=retry_failed,
        skipped=ineligible, failures=failures_path(output_path, STAGE),
    )  # fmt: skip


def handoff(row: dict) -> dict | None:
    """A persona row just written, as this stage reads it from the file (None: not eligible)."""
    # The row was made from a validated Persona just now: its fields are read, not checked again.
    row = msgspec.json.decode(msgspec.json.encode(row))
    return row if row.get("eligible") and row.get("traits") else None


def funnel(plan) -> QueryFunnel:
    """The funnel of the stage's users, once it has run (rewrites rejected.jsonl)."""
    if not plan.units:  # chained: the input is complete now
        plan.units, plan.skipped = read_personas(plan.input_path)
    result = write_rejected_and_count(plan.output, plan.output.with_name("rejected.jsonl"), plan.picked())
    result.ineligible_skipped = plan.skipped
    return result


async def queries_for(engine, persona: Persona, options: QueryOptions, prompts, hashes):
    """One user's accepted and rejected queries, and situation counts ("kept", and the
    dropped ones by reason)."""
    reply = await engine.call(
        SITUATIONS,
        build_situation_messages(persona, options, prompts["situations"]),
        schema=situations_schema(
            persona, options, one_each=engine.prompt_variant == COMPACT, shared=engine.shared_schemas
        ),
        parse=lambda value: parse_situations(persona, value, options),
    )
    situations, dropped = reply.parsed
    dropped["kept"] = len(situations)
    numbers = [n for n, situation in enumerate(situations, 1) if situation.message]
    if not numbers:
        return [], [], dropped
    chosen = [situations[n - 1] for n in numbers]
    texts = [situation.message for situation in chosen]
    reply = await engine.call(
        CHECK,
        build_check_messages(persona, chosen, texts, prompts["check"]),
        schema=reviews_schema(len(texts)),
    )
    reviews = {}
    for review in reply.value.reviews:
        reviews.setdefault(review.message, review)
    repeats = checks.duplicates(texts)
    provenance = engine.provenance(hashes)
    accepted, rejected = [], []
    for index, (situation, text, number) in enumerate(zip(chosen, texts, numbers, strict=True)):
        query = Query(
            query_id=f"{persona.user_id}-q{number}",
            category=situation.category,
            situation=Situation(topic=situation.topic, text=situation.text, memory_ids=situation.memory_ids),
            query=text,
            memory_ids=situation.memory_ids,
            checks=judge_checks(
                persona,
                situation,
                text,
                reviews.get(index + 1),
                numbers[repeats[index]] if index in repeats else None,
                options.enforce,
            ),
            provenance=provenance,
        )
        (accepted if query.checks.passed else rejected).append(query)
    return accepted, rejected, dropped


@dataclass
class QueryFunnel:
    users_in: int
    ineligible_skipped: int = 0
    users_done: int = 0
    situations: int = 0
    situations_dropped: Counter = field(default_factory=Counter)
    generated: int = 0
    accepted: Counter = field(default_factory=Counter)  # per category
    rejected: Counter = field(default_factory=Counter)  # per category
    failed_checks: Counter = field(default_factory=Counter)  # per check
    accepted_per_user: list[int] = field(default_factory=list)

    def per_user(self) -> tuple[float, int, int]:
        counts = self.accepted_per_user or [0]
        return sum(counts) / len(counts), min(counts), max(counts)


def write_rejected_and_count(output: Path, rejected_path: Path, wanted: set[str]) -> QueryFunnel:
    """rejected.jsonl (one line per rejected query of every user in the output, with the
    user id) and the funnel counts of the `wanted` users."""
    funnel = QueryFunnel(users_in=len(wanted))
    with atomic_output(rejected_path) as handle:
        if not output.exists():
            return funnel
        for _, _, row in iter_jsonl(output, ErrorPolicy("fail")):
            if str(row["user_id"]) not in wanted:
                for query in row.get("rejected_queries", []):
                    handle.write(checks_line(row["user_id"], query))
                continue
            funnel.users_done += 1
            accepted, rejected = row.get("queries", []), row.get("rejected_queries", [])
            counts = dict(row.get("situation_counts", {}))
            funnel.situations += counts.pop("kept", 0)
            funnel.situations_dropped.update(counts)
            funnel.generated += len(accepted) + len(rejected)
            funnel.accepted.update(q["category"] for q in accepted)
            funnel.rejected.update(q["category"] for q in rejected)
            funnel.accepted_per_user.append(len(accepted))
            for query in rejected:
                funnel.failed_checks.update(name for name in query["checks"]["reasons"])
                handle.write(checks_line(row["user_id"], query))
    return funnel


def checks_line(user_id: str, query: dict) -> bytes:
    return msgspec.json.encode({"user_id": user_id, **query}) + b"\n"


# --- from options (the command, pe.* and `run`) ---------------------------------------------------


def queries_args(options, retry: bool) -> dict[str, Any]:
    """gen-queries' arguments from its options (QueriesOptions), for the command and `run`'s chain."""
    enforce = {"enforce": tuple(options.enforce)} if options.enforce is not None else {}
    picked = QueryOptions(categories=tuple(options.categories), per_category=options.per_category, **enforce)
    return {
        "options": picked, "limit": options.limit, "users": options.users, "retry_failed": retry,
        "shard": options.shard,
    }  # fmt: skip


async def from_options(options, console, settings, retry=False, full=None):
    """`personaemp gen-queries` on its options."""
    return await agenerate_queries(
        options.input, options.output, settings, **queries_args(options, retry), full=full, console=console
    )


def print_summary(result, console) -> None:
    """`personaemp gen-queries`' summary: the run report, then the funnel."""
    if print_run_report(result, console):
        print_funnel(result.summary, console)


def print_funnel(funnel, console) -> None:
    """The gen-queries funnel: users, situations, queries and checks."""
    table = Table(title="gen-queries funnel", title_justify="left")
    table.add_column("step")
    table.add_column("count", justify="right")
    table.add_row("eligible users in", str(funnel.users_in))
    table.add_row("  ineligible personas skipped", str(funnel.ineligible_skipped))
    table.add_row("users with a result", str(funnel.users_done))
    table.add_row("situations kept", str(funnel.situations))
    for reason, count in sorted(funnel.situations_dropped.items()):
        table.add_row(f"  situations dropped: {reason}", str(count))
    table.add_row("queries generated", str(funnel.generated))
    for check, count in sorted(funnel.failed_checks.items()):
        table.add_row(f"  failed {check}", str(count))
    for category in ("ES", "HEQ", "SS"):
        table.add_row(
            f"{category}: accepted / rejected",
            f"{funnel.accepted.get(category, 0)} / {funnel.rejected.get(category, 0)}",
        )
    accepted = sum(funnel.accepted.values())
    table.add_row("[bold]accepted[/]", f"[bold]{accepted}[/]")
    console.print(table)
    mean, low, high = funnel.per_user()
    console.print(f"accepted per user: mean {mean:.2f}, min {low}, max {high}")
