"""`personaemp criteria`: fixed evaluation criteria for every accepted query (LLM).

For each query and each PERM dimension (resonation, expression, reception) the model
writes 4-6 weighted criteria from the user's memories, persona, the situation and the
query, without seeing any response: baseline emotional-intelligence criteria and
persona-informed ones, none rewarding a mere call-back to a memory (the authors'
`evaluation/prepare_criteria.py` asks for the same; its wording is not reused). Weights
are normalised to sum to 100 (what the model wrote is kept as `given_weight`).
`evaluate` then scores every system against the same criteria, as the paper does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from personaemp.aio import sync_twin
from personaemp.errors import InputError, some
from personaemp.instruments.criteria import (
    CRITERIA,
    ROOM,
    build_messages,
    definitions_hash,
    normalise,
    query_hash,
    query_units,
    with_room,
)
from personaemp.prompts import LAYOUTS, load_prompt
from personaemp.records import DIMENSIONS
from personaemp.shared_options import DEFAULT_LAYOUT
from personaemp.summaries import print_run_report

STAGE = "criteria"


STEPS = (CRITERIA,)


# --- the units: one per accepted query ---------------------------------------------------------


def pick_queries(units: list[dict], path: Path, limit: int | None, users: Sequence[str] | None):
    """The query ids a quick look works on (the queries of `users`, then the first `limit`)."""
    if limit is None and not users:
        return None
    chosen = units
    if users:
        wanted = {str(u) for u in users}
        missing = wanted - {u["user_id"] for u in units}
        if missing:
            raise InputError(
                f"{path}: no queries of user {some(sorted(missing))}",
                "check the ids: only users with accepted queries in --input have criteria to write",
            )
        chosen = [u for u in units if u["user_id"] in wanted]
    return {u["query_id"] for u in (chosen[:limit] if limit is not None else chosen)}


# --- one call per dimension --------------------------------------------------------------------


async def awrite_criteria(
    input_path: Path,
    output_path: Path,
    settings,
    *,
    limit: int | None = None,
    users: Sequence[str] | None = None,
    retry_failed: bool = False,
    full: bool | None = None,
    layout: str = DEFAULT_LAYOUT,
    console=None,
):
    """Criteria for every accepted query of `input_path`; returns the StageResult (`.report`:
    the run report). `layout`: the authors' ("paper": each request holds its dimension's
    standard only) or "shared"."""
    from personaemp.llm.stage import LLMStage, arun_llm_stage
    from personaemp.results import of_llm_stage

    units = query_units(input_path, "pass gen-queries' output (queries.jsonl) or a split file")
    selected = pick_queries(units, input_path, limit, users)
    settings = with_room(settings, ROOM)
    if layout not in LAYOUTS:
        raise InputError(f"--layout takes {', '.join(LAYOUTS)}, not {layout!r}")
    prompt = load_prompt(CRITERIA.prompt)

    def make_work(engine):
        async def work(unit: dict) -> dict:
            criteria = {}
            for dimension in DIMENSIONS:
                messages = build_messages(unit, dimension, prompt, layout)
                reply = await engine.call(CRITERIA, messages, parse=normalise)
                criteria[dimension] = [c.model_dump(mode="json") for c in reply.parsed]
            provenance = engine.provenance({CRITERIA.name: prompt.hash})
            return {
                "query_id": unit["query_id"],
                "user_id": unit["user_id"],
                "query_hash": query_hash(unit),
                "criteria": criteria,
                "layout": layout,
                "provenance": provenance.model_dump(mode="json"),
            }

        return work

    plan = LLMStage(
        STAGE,
        units,
        make_work,
        key="query_id",
        output=output_path,
        fingerprint=lambda engine: "|".join(
            [engine.fingerprint(CRITERIA, prompt.hash), definitions_hash(), layout]
        ),
        selected=selected,
        full=full,
        input_path=input_path,
        retry_failed=retry_failed,
        steps=[CRITERIA],
        calls={CRITERIA.name: len(DIMENSIONS)},
    )
    report = await arun_llm_stage(plan, settings=settings, console=console)
    return of_llm_stage(report)


write_criteria = sync_twin(awrite_criteria)


# --- from options (the command and pe.*) ----------------------------------------------------------


async def from_options(options, console, settings, retry=False):
    """`personaemp criteria` on its options."""
    return await awrite_criteria(
        options.input, options.output, settings, limit=options.limit, users=options.users,
        retry_failed=retry, layout=options.layout, console=console,
    )  # fmt: skip


def print_summary(result, console) -> None:
    """`personaemp criteria`'s summary: its run report (its last line says what it wrote)."""
    print_run_report(result, console)
