"""What Table 1 costs at the paper's scale, per system, from `--estimate`.

Builds real users the way eval_bench.py does (AlpsBench sessions from ../shared/alpsbench,
the fake server scripted at a capable model's reply sizes), splits them random and OOD,
then asks `--estimate` (nothing sent) what each command of the Table-1 recipe would send:
criteria for the test queries, respond per system (none, memory-summary, rag) and evaluate
per system and judge (fixed, and fixed + bystander). The figures per test query are then
scaled to the paper's test sets: 5,463 queries, 10% of the users in each test part (random
9:1; OOD: the cluster closest to 10%), about 546 queries per split. Tokens are characters
/ 4; a reply the cache has not seen yet counts 300 tokens (a thinking policy writes more:
--step respond.max_tokens bounds it). memory-summary is counted as one summary per query
by --estimate; it is sent once per user (the paper: 5,463 queries from 2,780 users).

    .venv/bin/python bench/evaluation/table1_cost_bench.py [--users 60]
"""

from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "bench" / "dataset"), str(ROOT / "bench" / "evaluation")]

from benchlib import fake_endpoint, parser  # noqa: E402
from cost_bench import queries_from  # noqa: E402
from eval_bench import scripted  # noqa: E402

from personaemp.dataset.split import split_users  # noqa: E402
from personaemp.evaluation.criteria import write_criteria  # noqa: E402
from personaemp.evaluation.evaluate import evaluate  # noqa: E402
from personaemp.evaluation.respond import write_responses  # noqa: E402
from personaemp.instruments.judges import JudgeOptions  # noqa: E402

PAPER_QUERIES, PAPER_USERS = 5463, 2780
PER_SPLIT = round(PAPER_QUERIES * 0.1)  # test queries per split


def figures(report) -> tuple[int, int, int]:
    found = report.estimate
    return (
        sum(s["calls"] for s in found["steps"].values()),
        found["prompt_tokens"],
        found["completion_tokens"],
    )


def main() -> None:
    args = parser(__doc__, users=60).parse_args()
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    with fake_endpoint(scripted(random.Random(7))) as (work, live):
        dry = dataclasses.replace(live, estimate=True, work_dir=work / "dry")  # an empty cache
        queries_from(args.source, work, live, limit=args.users, console=quiet)
        split_users(work / "queries.jsonl", work / "splits", ood=True, test_size=0.1)
        test = work / "splits" / "random" / "test.jsonl"
        queries = sum(len(__import__("json").loads(line)["queries"]) for line in test.open())
        scale = PER_SPLIT / queries
        rows = []

        def add(what: str, report, per_split: bool = True) -> None:
            calls, tin, tout = figures(report)
            factor = scale * (2 if per_split else 1)
            rows.append((what, calls * factor, tin * factor, tout * factor))

        add(
            "criteria (fixed, per test query; shared by every system)",
            write_criteria(test, work / "c.jsonl", dry, console=quiet).report,
        )
        write_criteria(test, work / "criteria.jsonl", live, console=quiet)
        for context in ("none", "memory-summary", "rag"):
            add(
                f"respond --context {context}",
                write_responses(
                    work / "splits", work / "x.jsonl", dry, context=context, console=quiet
                ).report,
            )
            write_responses(work / "splits", work / f"{context}.jsonl", live, context=context, console=quiet)
        for bystander in (False, True):
            report = evaluate(
                work / "splits", [work / "none.jsonl"], work / "e.json", dry,
                criteria_file=work / "criteria.jsonl", options=JudgeOptions(bystander=bystander),
                console=quiet,
            ).report  # fmt: skip
            add(f"evaluate, one system, one judge (fixed{' + bystander' if bystander else ''})", report)
        print(
            f"{queries} test queries measured ({args.users} users), scaled to {PER_SPLIT} per split, 2 splits"
        )
        print(f"{'command':62s} {'requests':>9s} {'tokens in':>11s} {'tokens out':>11s}")
        for what, calls, tin, tout in rows:
            print(f"{what:62s} {calls:9.0f} {tin:11.0f} {tout:11.0f}")
        respond = {what: (c, i, o) for what, c, i, o in rows}
        judge = respond["evaluate, one system, one judge (fixed)"]
        for context in ("none", "memory-summary", "rag"):
            c, i, o = respond[f"respond --context {context}"]
            print(f"Table 1 per system ({context}), 2 judges: {c + 2 * judge[0]:.0f} requests, "
                  f"{i + 2 * judge[1]:.0f} tokens in, {o + 2 * judge[2]:.0f} tokens out")  # fmt: skip


if __name__ == "__main__":
    main()
