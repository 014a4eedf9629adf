"""What a failed judgment is paid, per fallback: a GRPO-like batch (groups of rollouts of one
query) scored by PereGRM against the fake endpoint, a share of the rollouts' judgments made
to fail (unreadable replies), the same batch under each fallback. Prints the mean reward and
B of the judged rollouts and of the failed ones, and how many failed rollouts outscore the
lowest judged rollout of their group (what GRPO's advantage would pay them for).

    .venv/bin/python bench/training/reward_fallback_bench.py [--groups 16] [--size 8] [--fail 0.2]
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fake_openai import FakeOpenAI, invalid_json_content  # noqa: E402

from personaemp.evaluation.evaluate import BYSTANDER_ASPECTS  # noqa: E402
from personaemp.llm.settings import LLMSettings  # noqa: E402
from personaemp.training.reward import FALLBACKS, PereGRM, Rollout  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--fail", type=float, default=0.2)
    args = parser.parse_args()
    rng = random.Random(0)
    rollouts = [(g, n) for g in range(args.groups) for n in range(args.size)]
    failing = {f"g{g}r{n}" for g, n in rollouts if rng.random() < args.fail}
    # judged values spread as real ones: scores 1-5, bystander aspects 0-20 (mean B ~0.4)
    scores = {f"g{g}r{n}": (rng.randint(1, 5), rng.randint(2, 5), rng.randint(1, 5)) for g, n in rollouts}
    points = {f"g{g}r{n}": [rng.randint(0, 16) for _ in BYSTANDER_ASPECTS] for g, n in rollouts}

    def responder(body, number):
        text = str(body["messages"])
        rid = re.search(r"<<(g\d+r\d+)>>", text).group(1)
        if rid in failing:
            return invalid_json_content()
        props = body["response_format"]["json_schema"]["schema"]["properties"]
        if "content_effectiveness" in props:
            return dict(zip(BYSTANDER_ASPECTS, points[rid], strict=True))
        dimension = ["resonation", "expression", "reception"].index(
            re.search(r"Dimension: (\w+)", text).group(1)
        )
        return {"criteria": ["c"], "analysis": "a", "score": scores[rid][dimension]}

    batch = [
        Rollout(query_id=f"q{g}", query=f"query {g}: I failed again.", completion=f"reply <<g{g}r{n}>>",
                situation="s", profile="p", memories=[{"memory_id": "m1", "value": "v"}])
        for g, n in rollouts
    ]  # fmt: skip
    print(f"{len(batch)} rollouts in {args.groups} groups, {len(failing)} with every judgment failing")
    with FakeOpenAI(responder=responder) as server, tempfile.TemporaryDirectory() as work:
        for fallback in FALLBACKS:
            settings = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=Path(work))
            result = PereGRM(settings, fallback=fallback).score(batch)
            rows = result.rows
            judged = [r for r in rows if not r["fallbacks"]]
            failed = [r for r in rows if r["fallbacks"]]
            paid = 0
            for g in range(args.groups):
                group = rows[g * args.size : (g + 1) * args.size]
                floor = min((r["reward"] for r in group if not r["fallbacks"]), default=None)
                paid += sum(1 for r in group if r["fallbacks"] and floor is not None and r["reward"] > floor)
            mean_b = statistics.fmean(r["bystander"] for r in rows)
            print(f"{fallback:>8}: mean reward {statistics.fmean(r['reward'] for r in rows):.3f} "
                  f"(judged {statistics.fmean(r['reward'] for r in judged):.3f}, failed "
                  f"{statistics.fmean(r['reward'] for r in failed):.3f}); mean B {mean_b:.3f} "
                  f"(judged {statistics.fmean(r['bystander'] for r in judged):.3f}); "
                  f"failed rollouts above their group's lowest judged: {paid} of {len(failed)}")  # fmt: skip


if __name__ == "__main__":
    main()
