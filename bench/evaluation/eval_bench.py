"""What judging costs: tokens per evaluated response, fixed criteria vs dynamic @k.

Builds real users and queries the way cost_bench.py does (filter on ../shared/alpsbench,
infer-persona and gen-queries against the fake server's scripted "capable model"), splits
them, writes the fixed criteria, has a policy answer the random test queries with their
memories, then evaluates those responses fixed, dynamic@1 and dynamic@8, each with and
without the bystander judge. Judge replies are scripted at a capable judge's length
(a 50-word analysis; 5 criteria of about 20 words for dynamic). Tokens are characters / 4
of every prompt and reply, so the figure does not depend on a tokenizer.

    .venv/bin/python bench/evaluation/eval_bench.py [--users 60]
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "bench" / "dataset")]  # benchlib, cost_bench

from benchlib import fake_endpoint, parser  # noqa: E402
from cost_bench import queries_from  # noqa: E402
from cost_bench import responder as capable  # noqa: E402

from personaemp.dataset.split import split_users  # noqa: E402
from personaemp.evaluation.criteria import write_criteria  # noqa: E402
from personaemp.evaluation.evaluate import evaluate  # noqa: E402
from personaemp.evaluation.respond import write_responses  # noqa: E402
from personaemp.instruments.judges import JudgeOptions  # noqa: E402

ANALYSIS = " ".join(
    ["The reply names the failed exam and the sister, but it lectures instead of listening."] * 3
)
CRITERION = (
    "Acknowledges the specific loss the user describes, in their own terms, before any advice is given."
)
RESPONSE = " ".join(
    ["I'm really sorry this happened; it makes sense that you feel shaken after all that."] * 4
)


def scripted(rng: random.Random):
    base = capable(rng)

    def answer(body: dict, number: int):
        text = json.dumps(body["messages"])
        if "response_format" not in body and "Answer in json" not in text:
            return RESPONSE  # the policy
        fmt = body.get("response_format") or {}
        properties = ((fmt.get("json_schema") or {}).get("schema") or {}).get("properties", {})
        if "score" in properties:  # a judge: fixed, or dynamic with its own criteria first
            reply = {"analysis": ANALYSIS, "score": rng.randint(2, 5)}
            if "criteria" in properties:
                reply = {"criteria": [CRITERION] * 5, **reply}
            return reply
        if "criteria" in properties:  # the criteria writer
            return {
                "criteria": [
                    {"name": f"criterion {i}", "weight": 20, "description": CRITERION} for i in range(5)
                ]
            }
        if "content_effectiveness" in properties:  # the bystander
            return {name: rng.randint(10, 20) for name in properties}
        return base(body, number)

    return answer


def main() -> None:
    args = parser(__doc__, users=60).parse_args()
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    with fake_endpoint(scripted(random.Random(7))) as (work, settings):
        queries_from(args.source, work, settings, limit=args.users, console=quiet)
        split_users(work / "queries.jsonl", work / "splits", ood=False, test_size=0.3)
        write_criteria(work / "queries.jsonl", work / "criteria.jsonl", settings, console=quiet)
        write_responses(work / "splits", work / "memory.jsonl", settings, context="memory", console=quiet)
        print(
            f"{'mode':22s} {'responses':>9s} {'requests':>8s} {'tok in':>9s} {'tok out':>8s} "
            f"{'per response':>12s}"
        )
        for dynamic, samples in ((False, 1), (True, 1), (True, 8)):
            for bystander in (False, True):
                steps = {"judge_dynamic": {"temperature": 0.7}} if samples > 1 else {}
                judge = dataclasses.replace(settings, steps=steps)
                options = JudgeOptions(dynamic=dynamic, samples=samples, bystander=bystander)
                made = evaluate(
                    work / "splits",
                    [work / "memory.jsonl"],
                    work / "eval" / f"{dynamic}{samples}{bystander}.json",
                    judge,
                    criteria_file=work / "criteria.jsonl",
                    options=options,
                    console=quiet,
                )
                report, evaluation = made.report, made.summary
                n = evaluation["systems"]["memory"]["judged"]
                chars_in = sum(s["prompt_chars"] for s in report.steps.values())
                chars_out = sum(s["completion_chars"] for s in report.steps.values())
                calls = sum(s["calls"] for s in report.steps.values())
                mode = evaluation["mode"] + (" + bystander" if bystander else "")
                per = (chars_in + chars_out) / 4 / max(n, 1)
                print(f"{mode:22s} {n:9d} {calls:8d} {chars_in / 4:9.0f} {chars_out / 4:8.0f} {per:12.0f}")
        criteria_stats = json.loads((work / "w" / "run_report.json").read_text())["stages"]["criteria"][
            "steps"
        ]
        criteria_tokens = sum(s["prompt_chars"] + s["completion_chars"] for s in criteria_stats.values()) / 4
        queries = sum(1 for _ in (work / "criteria.jsonl").open())
        print(
            f"fixed criteria, written once per query for every system: {criteria_tokens / queries:.0f} "
            "tokens per query"
        )


if __name__ == "__main__":
    main()
