"""`personaemp infer-persona`: evidence-grounded personas and Big Five levels.

One LLM step per user (PERSONA_STEP below: a messages builder, a reply schema and a parser):
the depth gate, topics, traits citing memory ids and the five Big Five levels citing memory
ids, in one reply. One request, not two: a second request would send the user's memories
again after another task, where no provider's prefix cache serves them, and the fixed part
of the two tasks together passes OpenAI's 1,024-token cacheable minimum where neither did.
A user the gate turns away needs no levels (`big_five` may be null); an eligible user's
reply without them is re-asked (`no_big_five`), and under require_depth=False, where every
user with a grounded trait is eligible, the schema requires them.
Cited ids are constrained by the schema (an enum of the user's memory ids) and then
checked anyway: a trait with no valid evidence is dropped; a reply left with none is
re-asked, and the user fails as `ungrounded` if it stays so. The profile text later
stages read is built from grounded traits only.

Then the persona checks (PERSONA_CHECKS, personaemp/checks.py), recorded on every trait and
Big Five level: `no_internal_ids` (a statement or rationale names no memory, session or user
id, no block key) and `level_matches_rationale` (a rationale states no other level for its
trait). A reply failing an enforced one is refused and re-asked with the reason, like an
ungrounded one; the user fails with the check's name if every attempt does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.markup import escape

from personaemp import checks
from personaemp.aio import sync_twin
from personaemp.errors import InputError, some
from personaemp.io import ErrorPolicy, StageRows, iter_jsonl, read_stage_rows
from personaemp.llm.step import RejectedReply, Step, edit_schema, id_choice
from personaemp.prompts import Prompt, prompts_per_variant
from personaemp.records import (
    BIG_FIVE,
    Aspect,
    BigFive,
    Grounding,
    Level,
    Persona,
    Trait,
    TraitLevel,
    User,
)
from personaemp.render import (
    render_memories,
    render_turns,
)
from personaemp.shards import failures_path, sharded_pick
from personaemp.summaries import print_run_report
from personaemp.vocabulary import PERSONA_CHECKS

STAGE = "infer-persona"


# --- reply models (the JSON the model must return) ---------------------------------------


class DepthCheck(BaseModel):
    has_depth: bool
    reason: str = Field(description="one sentence")


class TraitReply(BaseModel):
    aspect: Aspect
    statement: str
    evidence: list[str] = Field(min_length=1)


class LevelReply(BaseModel):
    level: Level
    evidence: list[str]
    rationale: str


class BigFiveReply(BaseModel):
    openness: LevelReply
    conscientiousness: LevelReply
    extraversion: LevelReply
    agreeableness: LevelReply
    neuroticism: LevelReply


class PersonaReply(BaseModel):
    depth: DepthCheck
    topics: list[str] = Field(max_length=5)
    traits: list[TraitReply] = Field(max_length=8)
    big_five: BigFiveReply | None  # after the traits: the levels are read with them in view


# version 2: the Big Five levels come in the persona reply (version 1 asked a second step).
PERSONA_STEP = Step("persona", PersonaReply, prompt="persona", version=2)
STEPS = (PERSONA_STEP,)

# Checked on every trait statement and Big Five rationale, and enforced unless `enforce`
# names fewer (level_matches_rationale: Big Five levels only): vocabulary.PERSONA_CHECKS.


def persona_checks(enforce: Sequence[str] | None) -> tuple[str, ...]:
    """The persona checks to enforce: `enforce`'s (None: all of them)."""
    if enforce is None:
        return PERSONA_CHECKS
    unknown = set(enforce) - set(PERSONA_CHECKS)
    if unknown or not enforce:
        named = f"not {some(sorted(unknown))}" if unknown else "at least one"
        raise InputError(f"--enforce takes {', '.join(PERSONA_CHECKS)}: {named}")
    return tuple(name for name in PERSONA_CHECKS if name in enforce)


def _checked(results: dict[str, tuple[bool, str]]) -> dict[str, Any]:
    """A trait's or level's `checks` and `reasons` fields from check -> (passed, reason)."""
    return {
        "checks": {name: ok for name, (ok, _) in results.items()},
        "reasons": {name: reason for name, (ok, reason) in results.items() if not ok},
    }


# What a reply refused for a check is told to do (the engine quotes it in the re-ask).
_FIX = {
    "no_internal_ids": "cite memory ids in evidence only, never in the text",
    "level_matches_rationale": "make the level and its rationale agree",
}


def _refuse(failed: list[tuple[str, str, str]], enforce: Sequence[str]) -> None:
    """RejectedReply (the engine re-asks) for the first enforced check that failed: (check, where, why)."""
    for name, where, reason in failed:
        if name in enforce:
            raise RejectedReply(name, f"{where}: {reason}; {_FIX[name]}")


# --- rendering ------------------------------------------------------------------------------


def profile_text(traits: Sequence[Trait]) -> str:
    return "\n".join(f"- {t.aspect.replace('_', ' ')}: {t.statement}" for t in traits)


def _ids_enum(schema: dict[str, Any], definition: str, ids: list[str], shared: bool) -> dict[str, Any]:
    """`schema` with `evidence` items of `definition` narrowed to this user's memory ids
    (unless `shared`: see id_choice)."""
    path = ("$defs", definition, "properties", "evidence", "items")
    return edit_schema(schema, path, id_choice(ids, shared))


# --- the step: persona and Big Five ---------------------------------------------------------


def build_persona_messages(user: User, prompt: Prompt) -> list[dict[str, str]]:
    return prompt.render(memories=render_memories(user.memories), turns=render_turns(user))


def persona_schema(user: User, shared: bool = False, levels_required: bool = False) -> dict[str, Any]:
    """The step's schema, trait and level citations narrowed to the user's memory ids;
    `levels_required` (require_depth=False: every grounded user is eligible): `big_five`
    may not be null, so an endpoint that enforces the schema always writes the levels."""
    ids = [m.memory_id for m in user.memories]
    schema = _ids_enum(PERSONA_STEP.schema, "TraitReply", ids, shared)
    schema = _ids_enum(schema, "LevelReply", ids, shared)
    if levels_required:
        schema = edit_schema(schema, ("properties", "big_five"), {"$ref": "#/$defs/BigFiveReply"})
    return schema


@dataclass
class PersonaParse:
    eligible: bool
    gate_reason: str
    topics: list[str]
    traits: list[Trait]
    grounding: Grounding = field(default_factory=Grounding)
    big_five: BigFive | None = None


def parse_persona(
    user: User, reply: PersonaReply, require_depth: bool = True, enforce: Sequence[str] = PERSONA_CHECKS
) -> PersonaParse:
    """Keep only traits and level citations with evidence among the user's memories; count
    what was removed.

    `require_depth=False` (an ablation, and the embedded demo model's setting) keeps users
    the depth check turned away when they have grounded traits; gate_reason says so. A user
    turned away gets no levels, whatever the reply holds.
    Raises RejectedReply("ungrounded") when no trait is left, RejectedReply("no_big_five")
    when an eligible user's reply has no levels, and RejectedReply(check) when a statement
    or a rationale fails an `enforce`d persona check."""
    known = {m.memory_id for m in user.memories}
    ids = checks.user_ids(user)
    grounding = Grounding(traits_proposed=len(reply.traits))
    reason = reply.depth.reason
    if not reply.depth.has_depth:
        if require_depth:
            return PersonaParse(False, reason, reply.topics, [], grounding)
        reason = f"depth check not enforced (it said no: {reason})"
    traits = []
    for proposed in reply.traits:
        evidence = list(dict.fromkeys(i for i in proposed.evidence if i in known))
        grounding.citations_dropped += len(set(proposed.evidence)) - len(evidence)
        statement = proposed.statement.strip()
        if evidence and statement:
            results = {"no_internal_ids": checks.internal_ids(statement, ids)}
            traits.append(
                Trait(aspect=proposed.aspect, statement=statement, evidence=evidence, **_checked(results))
            )
        else:
            grounding.traits_dropped += 1
    if not traits:
        raise RejectedReply(
            "ungrounded", f"none of the {len(reply.traits)} traits cites one of the user's memory ids"
        )
    if reply.big_five is None:
        raise RejectedReply("no_big_five", "big_five is null for a user who is kept: give the five levels")
    big_five, dropped, level_failed = _levels(reply.big_five, known, ids)
    grounding.citations_dropped += dropped
    failed = [
        (name, f"the statement of trait {number} ({trait.aspect})", reason)
        for number, trait in enumerate(traits, 1)
        for name, reason in trait.reasons.items()
    ]
    _refuse([*failed, *level_failed], enforce)
    return PersonaParse(True, reason, reply.topics, traits, grounding, big_five)


def _levels(
    reply: BigFiveReply, known: set[str], ids: list[str]
) -> tuple[BigFive, int, list[tuple[str, str, str]]]:
    """Levels citing only `known` memory ids, each checked (`ids`: the user's, checks.user_ids);
    returns the record, the citations dropped and the checks that failed as (check, where, why)."""
    levels, dropped, failed = {}, 0, []
    for trait in BIG_FIVE:
        proposed: LevelReply = getattr(reply, trait)
        evidence = list(dict.fromkeys(i for i in proposed.evidence if i in known))
        dropped += len(set(proposed.evidence)) - len(evidence)
        rationale = proposed.rationale.strip()
        results = {
            "no_internal_ids": checks.internal_ids(rationale, ids),
            "level_matches_rationale": checks.level_matches_rationale(trait, proposed.level, rationale),
        }
        levels[trait] = TraitLevel(
            level=proposed.level,
            evidence=evidence,
            rationale=rationale,
            thin_evidence=not evidence,
            **_checked(results),
        )
        failed += [(name, f"{trait}'s rationale", reason) for name, reason in levels[trait].reasons.items()]
    return BigFive(**levels), dropped, failed


# --- the stage -----------------------------------------------------------------------------


@dataclass
class PersonaSummary:
    users_in: int
    eligible: int = 0
    ineligible: int = 0
    traits_kept: int = 0
    traits_dropped: int = 0
    citations_dropped: int = 0
    thin_levels: int = 0  # Big Five levels with no valid evidence


def read_rows(path: Path) -> StageRows:
    """The rows of a stage file, each validated as a user (ids and offsets; rows read when iterated)."""
    return read_stage_rows(path, User)[0]


async def ainfer_personas(input_path: Path, output_path: Path, settings, *, console=None, **options):
    """Infer a persona for every user of `input_path`; returns the StageResult (`.report`:
    the run report, `.summary`: the PersonaSummary), as `pe.infer_personas` does.

    `options` are persona_stage's: `limit`/`users` compute only some users (the output keeps
    the other current rows); `full` says whether such a run's report stands for the build
    (`run` with a limit: yes; a quick look from the command line, the default: no); `shard`
    ("I/N"): only part I of N of the users, into its own files (see personaemp/shards.py);
    `retry_failed`, `require_depth`, `enforce`."""
    from personaemp.llm.stage import arun_llm_stage
    from personaemp.results import of_llm_stage

    plan = persona_stage(input_path, output_path, **options)
    report = await arun_llm_stage(plan, settings=settings, console=console)
    return of_llm_stage(report, summarize(plan.output, plan.picked()))


infer_personas = sync_twin(ainfer_personas)


def persona_stage(
    input_path: Path,
    output_path: Path,
    *,
    limit: int | None = None,
    users: Sequence[str] | None = None,
    retry_failed: bool = False,
    full: bool | None = None,
    require_depth: bool = True,
    enforce: Sequence[str] | None = None,
    shard: str | None = None,
    stream=None,
):
    """The stage as an LLMStage: its input (read lazily), its work per user, its fingerprint.

    `stream`: the input's rows as the filter writes them (`run`, streaming.FilterFeed),
    instead of reading `input_path`; every user then, no shard. `enforce`: the persona
    checks a reply must pass (None: all)."""
    from personaemp.llm.stage import LLMStage

    enforce = persona_checks(enforce)
    if stream is not None:
        if limit is not None or users or shard:
            raise ValueError("a streamed input is every user: no limit, users or shard")
        name, rows, selected = STAGE, stream, None
    else:
        rows = read_rows(input_path)
        name, output_path, rows, selected = sharded_pick(
            STAGE, output_path, rows, shard, input_path, limit=limit, users=users
        )

    loaded = prompts_per_variant(STEPS)

    def fingerprint(engine) -> str:
        made_with = loaded(engine.prompt_variant)[1]
        steps = [engine.fingerprint(step, made_with[step.name]) for step in STEPS]
        return "|".join([*steps, f"depth={require_depth}", f"enforce={','.join(enforce)}"])

    def make_work(engine):
        prompts, made_with = loaded(engine.prompt_variant)

        async def work(row: dict) -> dict:
            user = User.model_validate(row)
            result = await engine.call(
                PERSONA_STEP,
                build_persona_messages(user, prompts["persona"]),
                schema=persona_schema(user, engine.shared_schemas, levels_required=not require_depth),
                parse=lambda reply: parse_persona(user, reply, require_depth, enforce),
            )
            parsed = result.parsed
            persona = Persona(
                **user.model_dump(),
                eligible=parsed.eligible,
                gate_reason=parsed.gate_reason,
                topics=parsed.topics,
                traits=parsed.traits,
                profile=profile_text(parsed.traits),
                big_five=parsed.big_five,
                grounding=parsed.grounding,
                enforced=list(enforce),
                provenance=engine.provenance(made_with),
            )
            return {**row, **persona.model_dump(mode="json")}

        return work

    return LLMStage(
        name, rows, make_work, "user_id", output_path,
        fingerprint=fingerprint,
        steps=STEPS, selected=selected, full=full, input_path=input_path, retry_failed=retry_failed,
        failures=failures_path(output_path, STAGE),
    )  # fmt: skip


def summarize(output_path: Path, wanted: set[str]) -> PersonaSummary:
    """Counts over the finished personas of the `wanted` users (this run's and earlier runs')."""
    summary = PersonaSummary(users_in=len(wanted))
    if not output_path.exists():
        return summary
    for _, _, row in iter_jsonl(output_path, ErrorPolicy("fail")):
        if str(row["user_id"]) not in wanted:
            continue
        persona = Persona.model_validate(row)
        if persona.eligible:
            summary.eligible += 1
        else:
            summary.ineligible += 1
        summary.traits_kept += len(persona.traits)
        summary.traits_dropped += persona.grounding.traits_dropped
        summary.citations_dropped += persona.grounding.citations_dropped
        if persona.big_five:
            summary.thin_levels += sum(getattr(persona.big_five, t).thin_evidence for t in BIG_FIVE)
    return summary


# --- from options (the command, pe.* and `run`) ---------------------------------------------------


def persona_args(options, retry: bool) -> dict[str, Any]:
    """infer-persona's arguments from its options (PersonaOptions), for the command and `run`'s chain."""
    return {
        "limit": options.limit, "users": options.users, "retry_failed": retry,
        "require_depth": options.require_depth, "enforce": options.enforce, "shard": options.shard,
    }  # fmt: skip


async def from_options(options, console, settings, retry=False, full=None):
    """`personaemp infer-persona` on its options."""
    return await ainfer_personas(
        options.input, options.output, settings, **persona_args(options, retry), full=full, console=console
    )


def print_summary(result, console) -> None:
    """`personaemp infer-persona`'s summary: the run report, then the personas' counts."""
    if not print_run_report(result, console):
        return
    summary = result.summary
    console.print(
        f"personas: {summary.eligible} eligible + {summary.ineligible} failed the depth gate "
        f"(kept, eligible: false) of {summary.users_in} users · traits kept {summary.traits_kept}, "
        f"dropped for lack of valid evidence {summary.traits_dropped} · citations of unknown "
        f"memories removed {summary.citations_dropped} · Big Five levels on thin evidence "
        f"{summary.thin_levels}"
    )


def print_persona(path, user_id: str, console) -> None:
    """One persona with each trait and level next to the memories it cites, for auditing."""
    from personaemp.records import BIG_FIVE, Persona

    for _, _, row in iter_jsonl(path, ErrorPolicy("fail")):
        if str(row.get("user_id")) == user_id:
            persona = Persona.model_validate(row)
            break
    else:
        raise InputError(
            f"{path}: no persona for user {user_id!r}",
            f"run `personaemp infer-persona --users {user_id}` first, or check the id",
        )
    memories = {m.memory_id: m for m in persona.memories}

    def cite(ids: list[str]) -> str:
        return "\n".join(f"    [dim]{i}[/] {escape(memories[i].value)}" for i in ids if i in memories)

    console.print(
        f"[bold]{escape(persona.user_id)}[/] · language {persona.language} · eligible {persona.eligible}"
    )
    console.print(f"gate: {escape(persona.gate_reason)}")
    console.print(f"topics: {escape(', '.join(persona.topics))}")
    for trait in persona.traits:
        console.print(f"[bold]{trait.aspect}[/]: {escape(trait.statement)}")
        console.print(cite(trait.evidence))
    if persona.big_five:
        for name in BIG_FIVE:
            level = getattr(persona.big_five, name)
            thin = " [yellow](thin evidence)[/]" if level.thin_evidence else ""
            console.print(f"[bold]{name}[/] {level.level}{thin}: {escape(level.rationale)}")
            if level.evidence:
                console.print(cite(level.evidence))
    console.print(
        f"[dim]model {persona.provenance.model} ({persona.provenance.endpoint_kind}) · prompts "
        f"{persona.provenance.prompts} · {persona.provenance.created_at}[/]"
    )
