"""`personaemp agreement` on a build of the shipped sample against the fake endpoint.

Builds the sample (filter -> ... -> push --dry-run) with the capable fake model of
bench/dataset/cost_bench.py, lets two simulated reviewers label a review sample as the page posts
labels (each agrees with the judge's verdict with probability --agree, accepts what the
build accepted likewise, finds a trait supported with probability 0.8), re-runs the check
step with a second fake judge (another seed, another model name), and prints the figures
and the card's Quality section. The figures describe the fake judge and simulated people:
they show the machinery, not a real judge's quality.

    .venv/bin/python bench/review/agreement_bench.py [--size 40] [--agree 0.85]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import SAMPLE_TASK1, order_free_responder  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402
from rich.console import Console  # noqa: E402

from personaemp.config import llm_settings  # noqa: E402
from personaemp.dataset.card import quality_section, table  # noqa: E402
from personaemp.pipeline import run_pipeline  # noqa: E402
from personaemp.registry import RunOptions  # noqa: E402
from personaemp.review.agreement import agreement_table, compute_agreement, rejudge  # noqa: E402
from personaemp.review.page import LLM_CHECKS, make_event, open_session  # noqa: E402
from personaemp.shared_options import LLMOptions, PathsOptions  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=40)
    parser.add_argument("--agree", type=float, default=0.85)
    args = parser.parse_args()
    console = Console(width=160)
    with tempfile.TemporaryDirectory() as tmp:
        processed = Path(tmp) / "processed"
        with FakeOpenAI(responder=order_free_responder()) as fake, open(Path(tmp) / "log", "w") as log:
            options = RunOptions(
                paths=PathsOptions(input=str(SAMPLE_TASK1), processed=processed),
                llm=LLMOptions(base_url=[fake.base_url], model="fake"),
            )
            run_pipeline(options, Console(file=log))
        queries = processed / "queries.jsonl"
        session = open_session(queries, processed / "labels.jsonl", args.size, 0)
        rng = random.Random(1)
        for reviewer in ("ana", "bo"):
            for item in session.items:

                def post(field, value, item=item, reviewer=reviewer):
                    body = {
                        "reviewer": reviewer,
                        "query_id": item["query_id"],
                        "field": field,
                        "value": value,
                    }
                    session.labels.append(make_event(body, session.by_id))

                same = rng.random() < args.agree
                post("query", "accept" if item["accepted"] == same else "reject")
                for check in LLM_CHECKS:
                    post(f"check:{check}", "agree" if rng.random() < args.agree else "disagree")
                for t in range(len(item["traits"])):
                    post(f"trait:{t}", "supported" if rng.random() < 0.8 else "unsupported")
        with (
            FakeOpenAI(responder=order_free_responder(seed=8)) as second,
            open(Path(tmp) / "log2", "w") as log,
        ):
            settings = llm_settings(
                LLMOptions(
                    base_url=[second.base_url], model="fake-judge-2", work_dir=processed / ".personaemp"
                )
            )
            rejudge(queries, processed / "second_judge.jsonl", settings, Console(file=log))
        report = compute_agreement(queries, processed / "labels.jsonl", processed / "second_judge.jsonl")
        print(f"{report['queries']} generated queries; sample of {len(session.items)}, two reviewers\n")
        agreement_table(report, console)
        print()
        print(quality_section(report, table))


if __name__ == "__main__":
    main()
