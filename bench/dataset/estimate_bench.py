"""What a build would cost before it runs: `run` with `[llm] estimate`, scaled to the paper.

Filters the 1,200 real sessions of ../shared/alpsbench, takes a quick look at the first
--look users through both LLM stages against the fake server scripted as a capable model
(cost_bench.py: its replies have a capable model's sizes), then estimates the whole run
(nothing sent) and, after it, runs it to compare. Tokens are characters / 4. The last line
scales the estimate per filtered user to the paper's 2,780 users, at DeepSeek-V3's list
prices ($0.27 / $1.10 per million tokens, cache misses) as an example.

    .venv/bin/python bench/dataset/estimate_bench.py [--look 10]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path[:0] = [str(ROOT / "bench" / "dataset")]  # the benches it borrows from

from cost_bench import responder as capable  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402

from personaemp.config import load_config  # noqa: E402
from personaemp.dataset.filter import filter_users  # noqa: E402
from personaemp.dataset.persona import infer_personas  # noqa: E402
from personaemp.dataset.queries import generate_queries  # noqa: E402
from personaemp.llm.settings import LLMSettings  # noqa: E402
from personaemp.pipeline import run_pipeline  # noqa: E402

PAPER_USERS = 2780
PRICES = (0.27, 1.10)


def spent(report) -> int:
    return sum(s["prompt_tokens"] + s["completion_tokens"] for s in report.steps.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--look", type=int, default=10)
    parser.add_argument("--source", type=Path, default=ROOT.parent / "shared" / "alpsbench" / "task1")
    args = parser.parse_args()
    quiet = Console(quiet=True)
    with tempfile.TemporaryDirectory() as folder, FakeOpenAI(responder=capable(random.Random(7))) as server:
        processed = Path(folder) / "processed"
        config = Path(folder) / "p.toml"
        config.write_text(
            f'[paths]\ninput = "{args.source}"\nprocessed = "{processed}"\n'
            f'[llm]\nbase_url = ["{server.base_url}"]\nmodel = "fake"\nconcurrency = 32\n'
            f"price_in = {PRICES[0]}\nprice_out = {PRICES[1]}\n[split]\nood = false\n",
            encoding="utf-8",
        )
        options = load_config(config)
        work = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=processed / ".personaemp")
        processed.mkdir()
        kept = filter_users(args.source, processed / "filtered.jsonl", console=quiet).report.kept
        infer_personas(
            processed / "filtered.jsonl", processed / "personas.jsonl", work, limit=args.look, console=quiet
        )
        generate_queries(processed / "personas.jsonl", processed / "queries.jsonl", work, console=quiet)
        estimating = options.model_copy(update={"llm": options.llm.model_copy(update={"estimate": True})})
        before = server.count
        estimate = run_pipeline(estimating, quiet)
        assert server.count == before
        parts = [r.estimate for r in estimate.reports.values()]
        tokens_in = sum(p["prompt_tokens"] for p in parts)
        tokens_out = sum(p["completion_tokens"] for p in parts)
        cost = sum(p["cost"] for p in parts)
        done = run_pipeline(options, quiet)
        used = spent(done.reports["infer-persona"]) + spent(done.reports["gen-queries"])
    remaining = kept - args.look
    guessed = tokens_in + tokens_out
    print(f"filtered users: {kept}; quick look: {args.look}; estimated for the other {remaining}")
    print(
        f"estimate: {tokens_in:,} in + {tokens_out:,} out = {guessed:,} tokens, ${cost:.2f} (0 requests sent)"
    )
    print(f"then spent: {used:,} tokens ({(guessed - used) / used:+.1%} off)")
    per_user = guessed / remaining
    scale_in, scale_out = tokens_in / remaining * PAPER_USERS, tokens_out / remaining * PAPER_USERS
    paper_cost = (scale_in * PRICES[0] + scale_out * PRICES[1]) / 1e6
    print(
        f"paper scale ({PAPER_USERS:,} users): {per_user:,.0f} tokens per user -> {scale_in:,.0f} in + "
        f"{scale_out:,.0f} out, about ${paper_cost:.2f} at ${PRICES[0]}/${PRICES[1]} per million"
    )


if __name__ == "__main__":
    main()
