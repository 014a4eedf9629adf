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
import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from personaemp.aio import sync_twin
from personaemp.errors import InputError, UnitError
from personaemp.evaluation.criteria import pick_queries, query_units, with_room
from personaemp.llm.step import Step
from personaemp.prompts import Prompt, load_prompt

STAGE = "respond"
CONTEXTS = ("none", "memory", "memory-summary", "rag", "mismatch", "persona")
RESPOND = Step("respond", None, prompt="respond")
SUMMARY = Step("summary", None, prompt="summary", temperature=0.0)
STEPS = (RESPOND, SUMMARY)
# Tokens at least: room for a thinking policy (Qwen3-8B, the paper's base, reasons long).
ROOM = {RESPOND.name: 4096, SUMMARY.name: 4096}
# Words, and single characters of scripts written without spaces (CJK, Thai...), so the
# lexical similarity works in any language the users write in.
_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\u0e00-\u0e7f]|[^\W_]+", re.UNICODE)


def split_file(splits: Path, split: str, part: str) -> Path:
    path = splits / split / f"{part}.jsonl"
    if not path.exists():
        raise InputError(f"{path}: no such split file", "run `personaemp split` first, or check --splits")
    return path


def tokens(text: str) -> list[str]:
    return [token.lower() for token in _TOKEN.findall(text)]


def most_similar(query: str, memories: Sequence[dict], k: int) -> list[dict]:
    """The k memories sharing the most rare words with the query (idf-weighted overlap over
    the user's memories), in their original order; ties keep the earlier memory."""
    if len(memories) <= k:
        return list(memories)
    bags = [Counter(tokens(m["value"])) for m in memories]
    frequency = Counter(token for bag in bags for token in bag)
    wanted = set(tokens(query))

    def score(bag: Counter) -> float:
        return sum(math.log(1 + len(bags) / frequency[token]) for token in wanted & bag.keys())

    ranked = sorted(range(len(memories)), key=lambda i: (-score(bags[i]), i))[:k]
    return [memories[i] for i in sorted(ranked)]


def listed(memories: Sequence[dict]) -> str:
    return "\n".join(f"{n}. {m['value']}" for n, m in enumerate(memories, 1)) or "(nothing)"


def context_text(unit: dict, context: str, rag_k: int, summary: str | None = None) -> str:
    if context == "none":
        return ""
    if context == "persona":
        return f"What you know about the user:\n{unit['profile'] or '(nothing)'}\n\nThe user writes:\n"
    if context == "memory-summary":
        return f"What you know about the user:\n{summary or '(nothing)'}\n\nThe user writes:\n"
    memories = most_similar(unit["query"], unit["memories"], rag_k) if context == "rag" else unit["memories"]
    return f"What you remember about the user:\n{listed(memories)}\n\nThe user writes:\n"


def build_messages(unit: dict, context: str, rag_k: int, prompt: Prompt, summary: str | None = None):
    return prompt.render(context=context_text(unit, context, rag_k, summary), query=unit["query"])


def mismatched(units: list[dict], seed: int, path: Path) -> dict[str, str]:
    """user id -> the other user whose memories stand in for theirs: a seeded shuffle of the
    users, each given the next one's memories (a cycle, so never their own)."""
    users = sorted({unit["user_id"] for unit in units})
    if len(users) < 2:
        raise InputError(f"{path}: --context mismatch needs two users or more, found {len(users)}")
    random.Random(seed).shuffle(users)
    return {user: users[(i + 1) % len(users)] for i, user in enumerate(users)}


def policy_units(splits: Path, split: str, part: str, context: str, mismatch_seed: int):
    """(the split file, its query units, `view`): `view(unit)` is (the unit as the policy sees
    it, the user whose memories it carries under --context mismatch, else None). Respond and
    export build their prompts from it."""
    if context not in CONTEXTS:
        raise InputError(f"--context takes {', '.join(CONTEXTS)}, not {context!r}")
    input_path = split_file(splits, split, part)
    units = query_units(input_path, "pass a split file written by `personaemp split`")
    stand_in = mismatched(units, mismatch_seed, input_path) if context == "mismatch" else {}
    memories_of = {unit["user_id"]: unit["memories"] for unit in units}

    def view(unit: dict) -> tuple[dict, str | None]:
        if context != "mismatch":
            return unit, None
        other = stand_in[unit["user_id"]]
        return {**unit, "memories": memories_of[other]}, other

    return input_path, units, view


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
    """A response to every query of `splits/<split>/<part>.jsonl`; returns the stage report."""
    from personaemp.llm.run import arun_llm_stage

    input_path, units, policy_view = policy_units(splits, split, part, context, mismatch_seed)
    selected = pick_queries(units, input_path, limit, None)
    settings = with_room(settings, ROOM)
    prompt = load_prompt(RESPOND.prompt)
    summary_prompt = load_prompt(SUMMARY.prompt)
    hashes = {
        RESPOND.name: prompt.hash,
        **({SUMMARY.name: summary_prompt.hash} if context == "memory-summary" else {}),
    }

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
            row = {"query_id": unit["query_id"], "user_id": unit["user_id"]}
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

    return await arun_llm_stage(
        STAGE,
        units,
        make_work,
        settings=settings,
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
        console=console,
        failures=failures_file(output_path),
        chain=[*([(SUMMARY, 1)] if context == "memory-summary" else []), (RESPOND, 1)],
    )


write_responses = sync_twin(awrite_responses)


def failures_file(output: Path) -> Path:
    """`<output name>.failures.jsonl`: each system's responses keep their own failures."""
    return output.with_name(f"{output.stem}.failures.jsonl")
