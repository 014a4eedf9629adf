"""`personaemp respond`: a policy model's response to every query of a split (LLM, free text).

What the policy sees is the `context`:
  none     the query alone
  memory   the user's memories, numbered, then the query (the paper's policy input)
  persona  the inferred persona, then the query
  rag      the k memories most similar to the query (lexical), then the query
It never sees the situation. Reasoning (`<think>...</think>`, reasoning_content) is set
aside before the response is stored, so the judge reads only what the user would.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from personaemp.aio import sync_twin
from personaemp.errors import InputError
from personaemp.llm.step import Step
from personaemp.prompts import Prompt, load_prompt
from personaemp.stages.criteria import pick_queries, query_units

STAGE = "respond"
CONTEXTS = ("none", "memory", "persona", "rag")
RESPOND = Step("respond", None, prompt="respond")
STEPS = (RESPOND,)
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


def context_text(unit: dict, context: str, rag_k: int) -> str:
    if context == "none":
        return ""
    if context == "persona":
        return f"What you know about the user:\n{unit['profile'] or '(nothing)'}\n\nThe user writes:\n"
    memories = (
        unit["memories"] if context == "memory" else most_similar(unit["query"], unit["memories"], rag_k)
    )
    listed = "\n".join(f"{n}. {m['value']}" for n, m in enumerate(memories, 1))
    return f"What you remember about the user:\n{listed or '(nothing)'}\n\nThe user writes:\n"


def build_messages(unit: dict, context: str, rag_k: int, prompt: Prompt) -> list[dict]:
    return prompt.render(context=context_text(unit, context, rag_k), query=unit["query"])


async def awrite_responses(
    splits: Path,
    output_path: Path,
    settings,
    *,
    split: str = "random",
    part: str = "test",
    context: str = "memory",
    rag_k: int = 3,
    limit: int | None = None,
    retry_failed: bool = False,
    console=None,
):
    """A response to every query of `splits/<split>/<part>.jsonl`; returns the stage report."""
    from personaemp.llm.run import arun_llm_stage

    if context not in CONTEXTS:
        raise InputError(f"--context takes {', '.join(CONTEXTS)}, not {context!r}")
    input_path = split_file(splits, split, part)
    units = query_units(input_path, "pass a split file written by `personaemp split`")
    selected = pick_queries(units, input_path, limit, None)
    prompt = load_prompt(RESPOND.prompt)

    def make_work(engine):
        async def work(unit: dict) -> dict:
            reply = await engine.text(RESPOND, build_messages(unit, context, rag_k, prompt))
            provenance = engine.provenance({RESPOND.name: prompt.hash})
            return {
                "query_id": unit["query_id"],
                "user_id": unit["user_id"],
                "response": reply.value,
                "model": engine.model,
                "context": context,
                "truncated": reply.parsed == "length",  # cut by max_tokens; still judged as written
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
        ),
        selected=selected,
        full=selected is None,
        input_path=input_path,
        retry_failed=retry_failed,
        console=console,
        failures=failures_file(output_path),
        chain=[(RESPOND, 1)],
    )


write_responses = sync_twin(awrite_responses)


def failures_file(output: Path) -> Path:
    """`<output name>.failures.jsonl`: each system's responses keep their own failures."""
    return output.with_name(f"{output.stem}.failures.jsonl")
