"""How much of the pipeline's input a provider's prefix cache serves, and what input costs.

Runs the whole pipeline on the shared sample (data/raw/alpsbench_sample: filter,
infer-persona, gen-queries, split 7:3, criteria, respond with Table 1's three policies
(none, memory-summary, rag), evaluate them with the fixed judge and the bystander) against
the fake OpenAI server. Its scripted replies are shaped like a capable model's
(cost_bench.py, eval_bench.py; each policy answer differs) and it emulates a provider's
prefix cache (tests/fake_openai.py, `prefix_cache`):
- DeepSeek-like: json_schema refused (so json_object, the schema in the prompt), 64-token
  blocks; priced at DeepSeek's list prices ($0.28 per million input tokens, $0.028 a hit);
- OpenAI-like: json_schema (the schema is part of the cached prefix), nothing under 1,024
  tokens, then 128-token steps; priced at gpt-4.1's ($2.00, $0.50 cached).
Tokens are the server's (characters / 4 of the prompt as the cache sees it). Requests go
one at a time, so the scripted replies, and the figures, are the same run after run. Each
endpoint is measured with both layouts of the criteria and judge requests: paper (the
default, the authors' order) and shared (the three standards in a shared task).

The figures are counted by the server, so the bench measures any checkout: run it with
`PYTHONPATH=/work/main` for the layout before (main), with this checkout for the one after.

    PYTHONPATH=$PWD .venv/bin/python bench/llm/prefix_cache_bench.py
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import sys
import tempfile
from pathlib import Path

from rich.console import Console

BENCH = Path(__file__).resolve().parents[1]  # bench/
sys.path.insert(0, str(BENCH.parent / "tests"))
sys.path[:0] = [str(BENCH / "build"), str(BENCH / "evaluation")]  # the benches it borrows from

from cost_bench import queries_from  # noqa: E402
from eval_bench import RESPONSE, scripted  # noqa: E402
from fake_openai import FakeOpenAI, schema_from_messages  # noqa: E402

import personaemp  # noqa: E402
from personaemp.dataset.split import split_users  # noqa: E402
from personaemp.evaluation.criteria import write_criteria  # noqa: E402
from personaemp.evaluation.evaluate import evaluate  # noqa: E402
from personaemp.evaluation.respond import write_responses  # noqa: E402
from personaemp.instruments.judges import JudgeOptions  # noqa: E402
from personaemp.llm.settings import LLMSettings  # noqa: E402
from personaemp.prompts import LAYOUTS  # noqa: E402

SAMPLE = BENCH.parent / "data" / "raw" / "alpsbench_sample" / "task1"
SYSTEMS = ("none", "memory-summary", "rag")  # Table 1's policies (table1_cost_bench.py)
ENDPOINTS = {  # name: (fake profile, cache rule, $ per million input tokens: miss, hit)
    "DeepSeek-like": ("deepseek", "deepseek", 0.28, 0.028),
    "OpenAI-like": ("openai", "openai", 2.00, 0.50),
}


def layout_free(answer):
    """The scripted model, whatever the layout: it reads the schema from the prompt when the
    response format carries none, and the step's instructions from any message."""

    def respond(body: dict, number: int):
        text = "\n".join(m.get("content") or "" for m in body["messages"])
        if "response_format" not in body and "Answer in json" not in text:
            # A policy: each system answers each query in its own words (identical replies
            # would be judged once, from the reply cache).
            words = hashlib.sha256(text.encode()).hexdigest()[:8]
            return f"{RESPONSE} ({words})"
        view = dict(body)
        fmt = body.get("response_format") or {}
        schema = (fmt.get("json_schema") or {}).get("schema") or schema_from_messages(body["messages"])
        if schema is not None:
            view["response_format"] = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
        view["messages"] = [{"role": "system", "content": text}, body["messages"][-1]]
        return answer(view, number)

    return respond


def run(profile: str, rule: str, source: Path, layout: str) -> dict:
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    with (
        tempfile.TemporaryDirectory() as folder,
        FakeOpenAI(
            responder=layout_free(scripted(random.Random(7))), profile=profile, prefix_cache=rule
        ) as server,
    ):
        work = Path(folder)
        settings = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=work / "w", concurrency=1)
        _, _, funnel = queries_from(source, work, settings, console=quiet)
        split_users(work / "queries.jsonl", work / "splits", ood=False, test_size=0.3)
        write_criteria(
            work / "queries.jsonl", work / "criteria.jsonl", settings, layout=layout, console=quiet
        )
        for system in SYSTEMS:
            write_responses(
                work / "splits", work / f"{system}.jsonl", settings, context=system, console=quiet
            )
        evaluate(
            work / "splits", [work / f"{system}.jsonl" for system in SYSTEMS], work / "eval.json", settings,
            criteria_file=work / "criteria.jsonl", options=JudgeOptions(bystander=True, layout=layout),
            console=quiet,
        )  # fmt: skip
        assert not server.errors, server.errors
        return {
            "requests": server.count,
            "prompt_tokens": server.prompt_tokens,
            "cached_tokens": server.cached_tokens,
            "accepted": sum(funnel.accepted.values()),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--source", type=Path, default=SAMPLE)
    args = parser.parse_args()
    print(f"personaemp from {Path(personaemp.__file__).parent.parent}")
    results = {}
    for (name, (profile, rule, miss, hit)), layout in itertools.product(ENDPOINTS.items(), LAYOUTS):
        figures = run(profile, rule, args.source, layout)
        prompt, cached = figures["prompt_tokens"], figures["cached_tokens"]
        cost = ((prompt - cached) * miss + cached * hit) / 1e6
        figures.update(
            cached_share=round(cached / prompt, 4),
            input_dollars=round(cost, 6),
            input_dollars_per_accepted_query=round(cost / max(figures["accepted"], 1), 8),
        )
        results[f"{name} {layout}"] = figures
        print(
            f"{name:14s} {layout:6s} {figures['requests']:5d} requests · {prompt:9,} prompt tokens · "
            f"{cached / prompt:6.1%} from the prefix cache · {figures['accepted']} accepted queries · "
            f"input ${cost:.4f} = ${cost / max(figures['accepted'], 1):.6f} per accepted query "
            f"(${miss:g} a miss, ${hit:g} a hit, per million)"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
