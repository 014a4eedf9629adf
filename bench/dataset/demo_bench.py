"""The README's main job (`personaemp run --config personaemp.toml`) on the embedded model, timed.

Runs the demo config from a clean work folder (nothing cached), then prints:
- the machine (CPU model, cores) and the wall time of the whole run;
- per LLM step: requests, prompt and completion tokens, mean and slowest answer time,
  completion tokens per second (from the run report's per-call timings);
- the dataset folder loaded back with `datasets.load_dataset` in both configs, and every
  query written, flagged when it looks like a token loop;
- the issue's quality bars: categories accepted, accepted queries per user with a persona,
  one- or two-word Big Five rationales, units valid, checks passed;
- with --sampler: one grammar-constrained reply timed with llama-cpp-python's own sampler
  (grammar over the whole vocabulary) and with ours (grammar checked after the pick), and
  the same prompt without a grammar.

    .venv/bin/python bench/dataset/demo_bench.py [--sampler]
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from benchlib import machine, speed  # noqa: E402, F401  (speed: the others import it from here)

DEMO_BUDGET = 300.0  # seconds, the bar after install on 2 cores
CALL_BUDGET = 60.0  # no single local call over this


def looks_like_a_loop(text: str) -> bool:
    """A word 3-gram repeated 3+ times, or one character run of 12+: what a looping base
    model writes ("student, student, student", "0000000…")."""
    words = re.findall(r"\w+", text.lower())
    grams = Counter(zip(words, words[1:], words[2:], strict=False))
    return any(count >= 3 for count in grams.values()) or re.search(r"(.)\1{11,}", text) is not None


def run_demo(folder: Path) -> float:
    config = tomllib.loads((ROOT / "personaemp.toml").read_text(encoding="utf-8"))
    text = (ROOT / "personaemp.toml").read_text(encoding="utf-8")
    text = text.replace(
        f'input = "{config["paths"]["input"]}"', f'input = "{ROOT / config["paths"]["input"]}"'
    ).replace(f'processed = "{config["paths"]["processed"]}"', f'processed = "{folder}"')
    (folder / "personaemp.toml").write_text(text, encoding="utf-8")
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "personaemp", "run", "--config", str(folder / "personaemp.toml")],
        cwd=folder,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=open(folder / "run.log", "w"),  # noqa: SIM115
    )
    return time.perf_counter() - started


def print_steps(report: dict) -> list[dict]:
    calls = []
    print(f"{'step':<11} {'req':>4} {'tok in':>7} {'tok out':>7} {'mean s':>7} {'max s':>6} {'tok/s':>6}")
    for stage in ("infer-persona", "gen-queries"):
        entry = report["stages"][stage]
        calls += entry["calls"]
        print(f"{stage}: {entry['wall_seconds']:.1f} s, {entry['done']} done, {entry['failed']} failed")
        for name, stats in entry["steps"].items():
            answered, seconds = stats["answered"], stats["seconds"]
            print(
                f"  {name:<9} {answered:>4} {stats['prompt_tokens']:>7} {stats['completion_tokens']:>7} "
                f"{seconds / max(answered, 1):>7.1f} {stats['slowest']:>6.1f} "
                f"{stats['completion_tokens'] / max(seconds, 1e-9):>6.1f}"
            )
    return calls


def print_dataset(folder: Path) -> None:
    from datasets import load_dataset

    for config in ("random", "ood"):
        if not (folder / "dataset" / config).is_dir():
            print(f"dataset config {config}: not written (personaemp.toml: [split] ood = false)")
            continue
        loaded = load_dataset(str(folder / "dataset"), config, cache_dir=str(folder / "hf-cache"))
        print(
            f"dataset config {config}: "
            + ", ".join(f"{split} {len(rows)} rows" for split, rows in loaded.items())
        )
    loops = 0
    for line in (folder / "queries.jsonl").read_text(encoding="utf-8").splitlines():
        for query in json.loads(line)["queries"]:
            flag = looks_like_a_loop(query["query"])
            loops += flag
            print(f"  {'LOOP ' if flag else ''}[{query['category']}] {query['query'][:150]!r}")
    print(f"queries that look like token loops: {loops}")


def sampler_bench() -> None:
    from llama_cpp import Llama

    from personaemp.llm.local import _patch_llama_cpp, local_model_path
    from personaemp.llm.models import EMBEDDED

    upstream = Llama._init_sampler
    _patch_llama_cpp()
    llm = Llama(
        model_path=str(local_model_path()),
        n_ctx=2048,
        n_threads=os.cpu_count(),
        verbose=False,
        chat_format=EMBEDDED.chat_format,
    )
    schema = {
        "type": "object",
        "properties": {"story": {"type": "string"}, "traits": {"type": "array", "items": {"type": "string"}}},
        "required": ["story", "traits"],
    }
    prompt = "A student who loves music had a hard week. Tell the story and list forty traits, as JSON."
    request = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 200, "temperature": 0.0}
    runs = [
        ("no grammar", {}, None),
        (
            "grammar, llama-cpp-python's sampler",
            {"response_format": {"type": "json_object", "schema": schema}},
            upstream,
        ),
        (
            "grammar checked after the pick",
            {"response_format": {"type": "json_object", "schema": schema}},
            None,
        ),
    ]
    patched = Llama._init_sampler
    for label, extra, sampler in runs:
        Llama._init_sampler = sampler or patched
        started = time.perf_counter()
        result = llm.create_chat_completion(**request, **extra)
        seconds = time.perf_counter() - started
        tokens = result["usage"]["completion_tokens"]
        print(f"  {label:<38} {tokens:>4} tokens in {seconds:5.1f} s = {tokens / seconds:5.1f} tokens/s")
    Llama._init_sampler = patched


def print_quality(folder: Path) -> None:
    """The issue's bars: categories accepted, accepted queries per user with a persona,
    short Big Five rationales, and the share of units that passed the schema and checks."""
    personas = [json.loads(line) for line in (folder / "personas.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (folder / "queries.jsonl").read_text().splitlines()]
    failed = {
        stage: len((folder / f"{stage}.failures.jsonl").read_text().splitlines())
        for stage in ("infer-persona", "gen-queries")
    }
    accepted = [query for row in rows for query in row["queries"]]
    generated = accepted + [query for row in rows for query in row["rejected_queries"]]
    rationales = [
        level["rationale"] for p in personas if p.get("big_five") for level in p["big_five"].values()
    ]
    short = sum(len(re.findall(r"\w+", text)) <= 2 for text in rationales)
    with_persona = sum(bool(p.get("eligible")) for p in personas)
    print(
        f"valid units: infer-persona {len(personas)}/{len(personas) + failed['infer-persona']}, "
        f"gen-queries {len(rows)}/{len(rows) + failed['gen-queries']}"
    )
    print(f"accepted per category: {dict(sorted(Counter(q['category'] for q in accepted).items()))}")
    print(f"accepted queries per user with a persona: {len(accepted) / max(with_persona, 1):.2f} (bar: 1.5)")
    print(f"Big Five rationales of one or two words: {short} of {len(rationales)} (bar: 10%)")
    checks = Counter(
        name for query in generated for name, passed in query["checks"].items()
        if isinstance(passed, bool) and name != "passed" and passed
    )  # fmt: skip
    print("checks passed: " + ", ".join(f"{name} {n}/{len(generated)}" for name, n in checks.items()))


def main() -> None:
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="personaemp-demo-") as name:
        folder = Path(name)
        wall = run_demo(folder)
        report = json.loads((folder / ".personaemp" / "run_report.json").read_text(encoding="utf-8"))
        calls = print_steps(report)
        slowest = max(calls, key=lambda call: call["seconds"])
        print(f"slowest call: {slowest}")
        over = sum(call["seconds"] > CALL_BUDGET for call in calls)
        print(f"calls over {CALL_BUDGET:g} s: {over} of {len(calls)}")
        print_dataset(folder)
        print_quality(folder)
        print(f"demo wall time: {wall:.1f} s (bar: {DEMO_BUDGET:g} s after install)")
    if "--sampler" in sys.argv:
        print("one structured reply, 200 tokens at most:")
        sampler_bench()


if __name__ == "__main__":
    main()
