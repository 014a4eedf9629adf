"""What the shared layout costs in fidelity: both layouts on the same responses, side by side.

The same queries and the same responses (Table 1's three policies: none, memory-summary,
rag) are judged twice, once per layout of the criteria and judge requests: paper (the
default: each request holds only its dimension's standard, before the context and the
reply, as the authors' prompts) and shared (the three standards in a task every request
shares, the dimension named last). Per layout and judge (fixed, dynamic@1) it prints each
system's dimension means and Avg, how strongly the dimensions move together (Pearson's r
over the judged responses: a halo shows as higher r and a smaller Res-Rec spread), and the
systems' ranking; then Kendall's tau between the two layouts' rankings and the per-response
rank correlation per dimension.

By default every model is the test server's scripted one (tests/fake_openai.py): its scores
do not read the prompt, so the figures only show the plumbing works. Give a real judge to
measure: --base-url URL --model NAME (key from $OPENAI_API_KEY); the queries and responses
are still made by the test server, so only the judging differs.

    PYTHONPATH=$PWD .venv/bin/python bench/evaluation/layout_ab_bench.py [--base-url URL --model NAME]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console

BENCH = Path(__file__).resolve().parents[1]  # bench/
sys.path.insert(0, str(BENCH.parent / "tests"))
sys.path[:0] = [
    str(BENCH / "build"),
    str(BENCH / "evaluation"),
    str(BENCH / "llm"),
]  # the benches it borrows from

from cost_bench import queries_from  # noqa: E402
from eval_bench import scripted  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402
from prefix_cache_bench import SAMPLE, SYSTEMS, layout_free  # noqa: E402

import personaemp  # noqa: E402
from personaemp.dataset.split import split_users  # noqa: E402
from personaemp.evaluation.criteria import write_criteria  # noqa: E402
from personaemp.evaluation.evaluate import evaluate  # noqa: E402
from personaemp.evaluation.respond import write_responses  # noqa: E402
from personaemp.instruments.judges import JudgeOptions, kendall_tau, spearman  # noqa: E402
from personaemp.llm.settings import LLMSettings  # noqa: E402
from personaemp.prompts import LAYOUTS  # noqa: E402
from personaemp.records import DIMENSIONS  # noqa: E402

SHORT = {"resonation": "Res", "expression": "Exp", "reception": "Rec"}


def pearson(a: list[float], b: list[float]) -> float | None:
    if len(a) < 2 or statistics.pstdev(a) == 0 or statistics.pstdev(b) == 0:
        return None
    return statistics.correlation(a, b)


def judged(scores_file: Path) -> dict[str, dict[str, float]]:
    """unit id -> scores, the judged responses with all three dimensions."""
    rows = [json.loads(line) for line in scores_file.read_text().splitlines() if line.strip()]
    return {r["unit_id"]: r["scores"] for r in rows if r["status"] == "judged" and len(r["scores"]) == 3}


def run(source: Path, judge: LLMSettings | None) -> dict:
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    found: dict = {}
    with (
        tempfile.TemporaryDirectory() as folder,
        FakeOpenAI(responder=layout_free(scripted(random.Random(7))), profile="openai") as server,
    ):
        work = Path(folder)
        made = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=work / "w", concurrency=1)
        queries_from(source, work, made, console=quiet)
        split_users(work / "queries.jsonl", work / "splits", ood=False, test_size=0.3)
        for system in SYSTEMS:
            write_responses(work / "splits", work / f"{system}.jsonl", made, context=system, console=quiet)
        settings = judge or made
        for layout, dynamic in itertools.product(LAYOUTS, (False, True)):
            criteria = work / f"criteria-{layout}.jsonl"
            if not criteria.exists():
                write_criteria(work / "queries.jsonl", criteria, settings, layout=layout, console=quiet)
            name = f"{layout}-{'dynamic' if dynamic else 'fixed'}"
            evaluation = evaluate(
                work / "splits", [work / f"{system}.jsonl" for system in SYSTEMS], work / f"{name}.json",
                settings, criteria_file=criteria, options=JudgeOptions(dynamic=dynamic, layout=layout),
                console=quiet,
            ).summary  # fmt: skip
            found[name] = (evaluation, judged(Path(evaluation["scores_file"])))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--source", type=Path, default=SAMPLE)
    parser.add_argument("--base-url", help="a real judge's endpoint (default: the test server)")
    parser.add_argument("--model", help="the real judge's model")
    args = parser.parse_args()
    judge = None
    if args.base_url:
        judge = LLMSettings(base_urls=[args.base_url], model=args.model, work_dir=Path(".personaemp-ab"))
    print(f"personaemp from {Path(personaemp.__file__).parent.parent}")
    print("judge: " + (f"{args.model} at {args.base_url}" if judge else "the test server (plumbing only)"))
    found = run(args.source, judge)
    out: dict = {}
    for mode in ("fixed", "dynamic"):
        for layout in LAYOUTS:
            evaluation, scores = found[f"{layout}-{mode}"]
            systems = evaluation["systems"]
            columns = [scores[u] for u in sorted(scores)]
            r = {
                f"{SHORT[a]}~{SHORT[b]}": pearson([s[a] for s in columns], [s[b] for s in columns])
                for a, b in itertools.combinations(DIMENSIONS, 2)
            }
            ranking = sorted(systems, key=lambda s: -systems[s]["avg"])
            out[f"{layout}-{mode}"] = {"systems": systems, "r": r, "ranking": ranking}
            print(f"\n{mode} · layout {layout} · {len(columns)} judged responses")
            for system in SYSTEMS:
                entry = systems[system]
                means = " ".join(f"{SHORT[d]} {entry['dimensions'][d]:.2f}" for d in DIMENSIONS)
                spread = entry["dimensions"]["resonation"] - entry["dimensions"]["reception"]
                print(
                    f"  {system:15s} {means} · Avg {entry['avg']:.2f} · Res-Rec {spread:+.2f} "
                    f"(n={entry['n']})"
                )
            print(
                "  between dimensions, Pearson's r: "
                + ", ".join(f"{k} {'—' if v is None else f'{v:.2f}'}" for k, v in r.items())
            )
            print(f"  ranking by Avg: {' > '.join(ranking)}")
        paper, shared = (found[f"{layout}-{mode}"] for layout in LAYOUTS)
        tau = kendall_tau(
            [paper[0]["systems"][s]["avg"] for s in SYSTEMS],
            [shared[0]["systems"][s]["avg"] for s in SYSTEMS],
        )
        both = sorted(paper[1].keys() & shared[1].keys())
        rho = {
            SHORT[d]: spearman([paper[1][u][d] for u in both], [shared[1][u][d] for u in both])
            for d in DIMENSIONS
        }
        out[f"{mode} paper~shared"] = {"kendall_tau": tau, "spearman_per_response": rho}
        print(
            f"{mode}: paper vs shared, Kendall's tau of the rankings "
            f"{'—' if tau is None else f'{tau:.2f}'}; per-response rank correlation "
            + ", ".join(f"{k} {'—' if v is None else f'{v:.2f}'}" for k, v in rho.items())
        )
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
