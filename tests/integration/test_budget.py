"""--max-cost: the run stops before its spend could pass the budget, and resumes after.

Real files and the fake server, which reports usage for every reply; prices of $1 per
token make the dollars easy to follow.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from conftest import SAMPLE_TASK1, read_jsonl
from fake_openai import FakeOpenAI, default_content, reply
from rich.console import Console

from personaemp.dataset.filter import filter_users
from personaemp.dataset.persona import infer_personas
from personaemp.errors import InputError
from personaemp.llm.engine import BudgetReached
from personaemp.llm.settings import LLMSettings
from personaemp.shared_options import LLMOptions

QUIET = Console(quiet=True)
PRICES = {"price_in": 1e6, "price_out": 1e6}  # $1 per token
BILLED: list[int] = []  # what each answered request cost, in tokens (= dollars here)


def priced(body: dict, number: int):
    """The fake's own reply, with its usage (characters / 4, as a tokenizer roughly gives)
    written down, so the test knows what was spent."""
    content = default_content(body)
    prompt = -(-sum(len(m["content"]) for m in body["messages"]) // 4)
    completion = -(-len(content) // 4)
    BILLED.append(prompt + completion)
    return reply(content, usage={"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion})  # fmt: skip


def settings(server: FakeOpenAI, work: Path, **extra) -> LLMSettings:
    return LLMSettings(base_urls=[server.base_url], model="fake", work_dir=work, max_tokens=200,
                       concurrency=1, **PRICES, **extra)  # fmt: skip


def test_the_spend_stays_under_the_budget_and_a_larger_one_finishes_the_rest(tmp_path):
    filtered = tmp_path / "filtered.jsonl"
    filter_users(SAMPLE_TASK1, filtered, console=QUIET)
    BILLED.clear()
    with FakeOpenAI(responder=priced) as server:
        full = infer_personas(
            filtered, tmp_path / "all.jsonl", settings(server, tmp_path / "w1"), console=QUIET
        ).report
        whole, requests = full.cost, server.count
    assert full.outcome.done == 16 and whole == sum(BILLED) and len(BILLED) == requests

    budget = whole / 2
    BILLED.clear()
    with FakeOpenAI(responder=priced) as server:
        with pytest.raises(BudgetReached, match=r"--max-cost") as stop:
            infer_personas(filtered, tmp_path / "p.jsonl", settings(server, tmp_path / "w2", max_cost=budget),
                           console=QUIET)  # fmt: skip
        first = server.count
        assert sum(BILLED) <= budget, "never past the budget"
        assert 0 < first < requests
        assert "finished units are kept" in str(stop.value)
        kept = read_jsonl(tmp_path / "p.jsonl")
        assert 0 < len(kept) < 16
        assert not (tmp_path / "infer-persona.failures.jsonl").exists() or not read_jsonl(
            tmp_path / "infer-persona.failures.jsonl"
        ), "a budget stop records no failure"

        larger = settings(server, tmp_path / "w2", max_cost=whole * 10)
        report = infer_personas(filtered, tmp_path / "p.jsonl", larger, console=QUIET).report
        assert report.outcome.done_before == len(kept) and report.outcome.done + len(kept) == 16
    assert [r["user_id"] for r in read_jsonl(tmp_path / "p.jsonl")] == [
        r["user_id"] for r in read_jsonl(tmp_path / "all.jsonl")
    ]


def test_a_budget_needs_a_price():
    with pytest.raises(InputError, match="--max-cost needs a price"):
        LLMSettings(max_cost=1.0)
    assert LLMOptions(max_cost=2.0, price_in=1.0).max_cost == 2.0


# --- --estimate ---------------------------------------------------------------------------------


def snapshot(folder: Path) -> dict[Path, bytes | None]:
    """Every path under `folder` (folders too), with the bytes of each file."""
    return {p: p.read_bytes() if p.is_file() else None for p in folder.rglob("*")}


def spent_tokens(report) -> int:
    return sum(s["prompt_tokens"] + s["completion_tokens"] for s in report.steps.values())


@pytest.mark.parametrize("stage", ["infer-persona", "gen-queries"])
def test_estimate_sends_and_writes_nothing_and_lands_within_30_percent(tmp_path, stage):
    """After a quick look (--limit 2, which fills the cache with each step's sizes), the
    estimate for the whole input is compared with what the stage then spends."""
    from personaemp.dataset.queries import generate_queries

    filtered = tmp_path / "filtered.jsonl"
    filter_users(SAMPLE_TASK1, filtered, console=QUIET)
    with FakeOpenAI() as server:
        plain = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=tmp_path / "w")
        if stage == "infer-persona":
            run = lambda s, **kw: infer_personas(filtered, tmp_path / "out.jsonl", s, console=QUIET, **kw)  # noqa: E731
        else:
            infer_personas(filtered, tmp_path / "personas.jsonl", plain, console=QUIET)
            run = lambda s, **kw: generate_queries(tmp_path / "personas.jsonl", tmp_path / "out.jsonl", s,  # noqa: E731
                                                   console=QUIET, **kw)  # fmt: skip
        run(plain, limit=2)
        before = server.count
        files = snapshot(tmp_path)
        estimating = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=tmp_path / "w",
                                 estimate=True, price_in=1.0, price_out=2.0)  # fmt: skip
        report = run(estimating).report
        assert server.count == before, "an estimate sends nothing"
        assert snapshot(tmp_path) == files, "and writes or creates nothing"
        estimate = report.estimate
        assert report.outcome.balanced and report.outcome.done_before == 2 and estimate["units_pending"] > 0
        real = run(plain).report
    spent = spent_tokens(real)
    guessed = estimate["prompt_tokens"] + estimate["completion_tokens"]
    assert abs(guessed - spent) <= 0.3 * spent, (guessed, spent)
    assert estimate["cost"] == pytest.approx(
        (estimate["prompt_tokens"] + 2 * estimate["completion_tokens"]) / 1e6, rel=1e-3
    )
    print(stage, "estimated", guessed, "spent", spent)


def test_run_estimate_sends_and_writes_nothing_and_lands_within_30_percent(tmp_path):
    """After a quick look at two users (both LLM stages), `run` with [llm] estimate is
    compared with what the whole run then spends."""
    from personaemp.config import load_config
    from personaemp.dataset.queries import generate_queries
    from personaemp.pipeline import run_pipeline

    processed = tmp_path / "processed"
    with FakeOpenAI() as server:
        text = (f'[paths]\ninput = "{SAMPLE_TASK1}"\nprocessed = "{processed}"\n'
                f'[llm]\nbase_url = ["{server.base_url}"]\nmodel = "fake"\n'
                '[queries]\nenforce = ["memory_ids_valid"]\n[split]\nood = false\n')  # fmt: skip
        config = tmp_path / "p.toml"
        config.write_text(text, encoding="utf-8")
        options = load_config(config)
        plain = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=processed / ".personaemp")
        processed.mkdir()
        filter_users(SAMPLE_TASK1, processed / "filtered.jsonl", console=QUIET)
        infer_personas(
            processed / "filtered.jsonl", processed / "personas.jsonl", plain, limit=2, console=QUIET
        )
        generate_queries(processed / "personas.jsonl", processed / "queries.jsonl", plain, console=QUIET)
        before = server.count
        files = snapshot(tmp_path)
        estimating = options.model_copy(update={"llm": options.llm.model_copy(update={"estimate": True})})
        result = run_pipeline(estimating, QUIET)
        assert server.count == before, "an estimate sends nothing"
        assert snapshot(tmp_path) == files, "and writes or creates nothing"
        guessed = sum(
            r.estimate["prompt_tokens"] + r.estimate["completion_tokens"] for r in result.reports.values()
        )
        done = run_pipeline(options, QUIET)
        spent = spent_tokens(done.reports["infer-persona"]) + spent_tokens(done.reports["gen-queries"])
    assert abs(guessed - spent) <= 0.3 * spent, (guessed, spent)
    print("run estimated", guessed, "spent", spent)


def test_run_estimate_says_how_far_the_eligible_share_of_a_small_look_may_be(tmp_path):
    """A look at 2 users, both eligible, said "at the eligible share 100%" and projected every
    other user through gen-queries, as if the look had proved it. The line now gives the Wilson
    95% range of the share (2 of 2: 34%-100%) and the users and prompt tokens it makes."""
    from personaemp.config import load_config
    from personaemp.pipeline import run_pipeline

    processed = tmp_path / "processed"
    with FakeOpenAI() as server:
        config = tmp_path / "p.toml"
        config.write_text(
            f'[paths]\ninput = "{SAMPLE_TASK1}"\nprocessed = "{processed}"\n'
            f'[llm]\nbase_url = ["{server.base_url}"]\nmodel = "fake"\nestimate = true\n'
            "[split]\nood = false\n",
            encoding="utf-8",
        )
        plain = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=processed / ".personaemp")
        processed.mkdir()
        filter_users(SAMPLE_TASK1, processed / "filtered.jsonl", console=QUIET)
        infer_personas(
            processed / "filtered.jsonl", processed / "personas.jsonl", plain, limit=2, console=QUIET
        )
        users = len((processed / "filtered.jsonl").read_text().splitlines())
        shown = io.StringIO()
        run_pipeline(load_config(config), Console(file=shown, width=400))
    line = " ".join(shown.getvalue().split())
    assert "users still without a persona, at the eligible share 100% of the personas written" in line
    assert "from 2 personas the share is 95% likely 34%-100%" in line
    assert f"{round((users - 2) * 0.3424)}-{users - 2} users" in line
