"""`personaemp respond`: a policy model's response to every query of a split (LLM, free text).

What the policy sees is the `context`:
  none            the query alone (Table 2's "w/o memory")
  memory          the user's memories, numbered, then the query (the paper's policy input)
  memory-summary  two calls: the policy summarises the user from the memories, then answers
                  with only that summary (Table 1's "Memory" baseline)
  rag             the k memories most similar to the query (lexical; the paper's k = 3)
  mismatch        the memories of another user of the same split part, chosen by seed,
                  never the user's own (Table 2's mismatched memory)
  persona         the inferred persona, then the query (not a paper baseline: the judge
                  reads the same persona)
It never sees the situation. Reasoning (`<think>...</think>`, reasoning_content) is set
aside before the response is stored, so the judge reads only what the user would; a reply
cut while reasoning (nothing visible, even after the re-asks with more room) is written
with `response: null` and `cut_in_reasoning: true`, to be counted, not dropped.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from personaemp.aio import sync_twin
from personaemp.errors import UnitError
from personaemp.evaluation.criteria import pick_queries
from personaemp.instruments.criteria import query_hash, with_room
from personaemp.instruments.policy import (
    RESPOND,
    ROOM,
    SUMMARY,
    build_messages,
    listed,
    policy_units,
    rag_saw_everything,
)
from personaemp.prompts import load_prompt
from personaemp.summaries import print_run_report

STAGE = "respond"
STEPS = (RESPOND, SUMMARY)


async def awrite_responses(
    splits: Path,
    output_path: Path,
    settings,
    *,
    split: str = "random",
    part: str = "test",
    context: str = "memory",
    rag_k: int = 3,
    mismatch_seed: int = 0,
    limit: int | None = None,
    retry_failed: bool = False,
    console=None,
):
    """A response to every query of `splits/<split>/<part>.jsonl`; returns the StageResult
    (`.report`: the run report)."""
    from personaemp.llm.ray_executor import shared_per
    from personaemp.llm.stage import LLMStage, arun_llm_stage
    from personaemp.results import of_llm_stage

    input_path, units, policy_view = policy_units(splits, split, part, context, mismatch_seed)
    selected = pick_queries(units, input_path, limit, None)
    settings = with_room(settings, ROOM)
    prompt = load_prompt(RESPOND.prompt)
    summary_prompt = load_prompt(SUMMARY.prompt)
    hashes = {
        RESPOND.name: prompt.hash,
        **({SUMMARY.name: summary_prompt.hash} if context == "memory-summary" else {}),
    }

    @shared_per("user_id")  # on Ray too: a user's queries on one worker, which summarises once
    def make_work(engine):
        summaries: dict[str, asyncio.Future] = {}  # one summary call per user, shared by their queries

        async def summarise(unit: dict) -> str:
            if settings.estimate:  # each query counted as its own summary: a bound from above
                return (
                    await engine.text(SUMMARY, summary_prompt.render(memories=listed(unit["memories"])))
                ).value
            if unit["user_id"] not in summaries:
                messages = summary_prompt.render(memories=listed(unit["memories"]))
                summaries[unit["user_id"]] = asyncio.ensure_future(engine.text(SUMMARY, messages))
            return (await summaries[unit["user_id"]]).value

        async def work(unit: dict) -> dict:
            row = {"query_id": unit["query_id"], "user_id": unit["user_id"], "query_hash": query_hash(unit)}
            summary = None
            unit, other = policy_view(unit)
            if other is not None:
                row["memories_of"] = other
            if context == "memory-summary":
                summary = row["summary"] = await summarise(unit)
            try:
                reply = await engine.text(RESPOND, build_messages(unit, context, rag_k, prompt, summary))
                response, finish, cut_in_reasoning = reply.value, reply.parsed, False
            except UnitError as error:
                if error.kind != "truncated":
                    raise
                # Nothing visible even with more room: what the user would see is nothing.
                response, finish, cut_in_reasoning = None, "length", True
            provenance = engine.provenance(hashes)
            return {
                **row,
                "response": response,
                "model": engine.model,
                "context": context,
                "truncated": finish == "length",  # cut by max_tokens; judged on the visible text
                "cut_in_reasoning": cut_in_reasoning,
                "provenance": provenance.model_dump(mode="json"),
            }

        return work

    plan = LLMStage(
        STAGE,
        units,
        make_work,
        key="query_id",
        output=output_path,
        fingerprint=lambda engine: (
            f"{engine.fingerprint(RESPOND, prompt.hash)}|{context}"
            + (f"|{rag_k}" if context == "rag" else "")
            + (f"|seed{mismatch_seed}" if context == "mismatch" else "")
            + (f"|{engine.fingerprint(SUMMARY, summary_prompt.hash)}" if context == "memory-summary" else "")
        ),
        selected=selected,
        full=selected is None,
        input_path=input_path,
        retry_failed=retry_failed,
        failures=failures_file(output_path),
        steps=[*([SUMMARY] if context == "memory-summary" else []), RESPOND],
        notes={
            "rag": rag_saw_everything(
                [u for u in units if selected is None or u["query_id"] in selected], rag_k
            )
        }
        if context == "rag"
        else {},  # fmt: skip
    )
    report = await arun_llm_stage(plan, settings=settings, console=console)
    return of_llm_stage(report)


write_responses = sync_twin(awrite_responses)


def failures_file(output: Path) -> Path:
    """`<output name>.failures.jsonl`: each system's responses keep their own failures."""
    return output.with_name(f"{output.stem}.failures.jsonl")


# --- from options (the command and pe.*) ----------------------------------------------------------


async def from_options(options, console, settings, retry=False):
    """`personaemp respond` on its options."""
    return await awrite_responses(
        options.splits, options.output_path, settings, split=options.split, part=options.part,
        context=options.context, rag_k=options.rag_k, mismatch_seed=options.mismatch_seed,
        limit=options.limit, retry_failed=retry, console=console,
    )  # fmt: skip


def print_summary(result, console) -> None:
    """`personaemp respond`'s summary: its run report (its last line says what it wrote)."""
    print_run_report(result, console)
