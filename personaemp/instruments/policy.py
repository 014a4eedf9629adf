"""What a policy sees: the query with a context (none, memories, a summary, RAG, a
mismatched user's memories, the persona). `respond` and the training files (export)
build the same prompts."""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from personaemp.errors import InputError
from personaemp.instruments.criteria import query_units
from personaemp.llm.step import Step
from personaemp.prompts import Prompt
from personaemp.splits import split_file
from personaemp.vocabulary import CONTEXTS  # what a policy may see, declared once

# Greedy, as the paper's appendix decodes for its evaluations (--step respond.temperature=X
# to sample).
RESPOND = Step("respond", None, prompt="respond", temperature=0.0)


SUMMARY = Step("summary", None, prompt="summary", temperature=0.0)


# Tokens at least: room for a thinking policy (Qwen3-8B, the paper's base, reasons long).
ROOM = {RESPOND.name: 4096, SUMMARY.name: 4096}


# Words, and single characters of scripts written without spaces (CJK, Thai...), so the
# lexical similarity works in any language the users write in.
_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\u0e00-\u0e7f]|[^\W_]+", re.UNICODE)


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


def rag_saw_everything(units: Sequence[dict], rag_k: int) -> dict[str, Any]:
    """How many queries' RAG context is every memory of their user (k or fewer memories):
    on short histories the RAG row then repeats the memory row."""
    every = sum(len(unit["memories"]) <= rag_k for unit in units)
    share = every / len(units) if units else 0.0
    return {
        "text": f"rag: {every} of {len(units)} queries ({share:.0%}) saw every memory of their user "
        f"(k = {rag_k}); for those the RAG row equals the memory row",
        "queries": len(units),
        "every_memory": every,
        "k": rag_k,
    }


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
