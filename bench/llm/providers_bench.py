"""Both LLM stages, with default options, against every provider profile of the test server.

The shipped sample is filtered (16 users), then infer-persona and gen-queries run against
the fake server in each provider profile (tests/fake_openai.py: OpenAI json_schema,
DeepSeek, MiniMax <think>, MiniMax without the opening tag, vLLM reasoning fields, fenced
JSON, llama-cpp-python). One bad reply is queued first so every profile sees a re-ask.
Prints, per profile: the structured mode `auto` ended on, units done/failed per stage,
requests, re-asks, reasoning tokens, and failures by kind (none may be about the protocol).

    .venv/bin/python bench/llm/providers_bench.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from fake_openai import PROFILES, FakeOpenAI, reply  # noqa: E402

from personaemp.dataset.filter import filter_users  # noqa: E402
from personaemp.dataset.persona import infer_personas  # noqa: E402
from personaemp.dataset.queries import generate_queries  # noqa: E402
from personaemp.llm.settings import LLMSettings  # noqa: E402

SAMPLE = ROOT / "data" / "raw" / "alpsbench_sample" / "task1"


def run_profile(profile: str, filtered: Path, folder: Path) -> list[str]:
    quiet = Console(quiet=True)
    with FakeOpenAI(profile=profile) as server:
        server.queue(reply({"not": "a persona"}))
        settings = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=folder / "work")
        personas = infer_personas(filtered, folder / "personas.jsonl", settings, console=quiet).report
        queries = generate_queries(
            folder / "personas.jsonl", folder / "queries.jsonl", settings, console=quiet
        ).report
    failures = {**personas.outcome.failures_by_kind, **queries.outcome.failures_by_kind}
    return [
        profile,
        personas.structured["used"],
        f"{personas.outcome.done}/{personas.outcome.units}",
        f"{queries.outcome.done}/{queries.outcome.units}",
        str(personas.totals["requests"] + queries.totals["requests"]),
        str(personas.totals["reasks"] + queries.totals["reasks"]),
        str(personas.totals["reasoning_tokens"] + queries.totals["reasoning_tokens"]),
        ", ".join(f"{kind} {n}" for kind, n in failures.items()) or "none",
    ]


def main() -> None:
    console = Console(width=150)
    table = Table(title="LLM stages with default options, per provider profile")
    for column in ("profile", "auto ->", "personas done", "queries done", "requests", "re-asks",
                   "reasoning tok", "failures"):  # fmt: skip
        table.add_column(column)
    with tempfile.TemporaryDirectory() as tmp:
        filtered = Path(tmp) / "filtered.jsonl"
        filter_users(str(SAMPLE), filtered, console=Console(quiet=True))
        for profile in PROFILES:
            folder = Path(tmp) / profile
            folder.mkdir()
            table.add_row(*run_profile(profile, filtered, folder))
    console.print(table)


if __name__ == "__main__":
    main()
