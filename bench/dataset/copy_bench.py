"""not_copied: how much of the user's own text honest and planted queries repeat.

Filters the shipped AlpsBench sample, then measures, for every kept user, the longest
stretch (in words, personaemp.checks.words) a candidate query shares with that user's own
turns and memories — the figure the `not_copied` check compares with
personaemp.checks.COPY_WORDS. Candidates:

- honest, written: the capable fake model's queries (bench/dataset/cost_bench.py), in the user's
  language where it has one;
- honest, human: other users' real messages (clipped to 300 characters): natural text in
  the same languages that owes nothing to this user — what chance overlap looks like;
- planted, whole: the user's own messages and memories (clipped to 300 characters);
- planted, k tokens spliced: an honest query with k consecutive tokens of the user's own message
  spliced in (k = 4..16; a CJK user's k characters are k/2 words): where a partial copy is caught.

    .venv/bin/python bench/dataset/copy_bench.py [--input DIR]

Prints the distributions and the share each threshold would reject; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench" / "dataset")]  # the benches it borrows from

from cost_bench import SENTENCES  # noqa: E402

from personaemp.checks import (  # noqa: E402
    COPY_SHARE,
    COPY_SHORT,
    COPY_WORDS,
    copied,
    longest_shared,
    not_copied,
    tokens,
    words,
)
from personaemp.dataset.filter import filter_users  # noqa: E402


def clip(text: str, size: int = 300) -> str:
    return text.strip()[:size]


def own_texts(user: dict) -> list[str]:
    texts = [t["text"] for t in user["turns"] if t["role"] == "user"]
    for memory in user["memories"]:
        texts += [memory["value"], memory.get("evidence_text") or ""]
    return [t for t in texts if t]


def spread(values: list[int]) -> str:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return (
        f"n={len(values):4d}  min {ordered[0]:5.1f}  median {pick(0.5):5.1f}  p95 {pick(0.95):5.1f}  "
        f"p99 {pick(0.99):5.1f}  max {ordered[-1]:5.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", default=str(ROOT / "data/raw/alpsbench_sample/task1"))
    args = parser.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "filtered.jsonl"
        filter_users(args.input, out)
        users = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    print(f"{len(users)} kept users of {args.input}")
    groups: dict[str, list[int]] = {}
    rejected: Counter = Counter()
    examples: dict[str, tuple[int, str]] = {}

    def measure(group: str, query: str, sources: list[str]) -> None:
        if len(query.strip()) < 15:
            return
        run = longest_shared(query, sources)
        size = words(run)
        groups.setdefault(group, []).append(size)
        rejected[group] += copied(size, words(tokens(query)))
        if size > examples.get(group, (-1, ""))[0]:
            examples[group] = (size, run)

    for user in users:
        sources = own_texts(user)
        language = user.get("language") if user.get("language") in SENTENCES else "en"
        for category, template in SENTENCES[language].items():
            measure("honest, written", template.format(topic=f"#{rng.randint(0, 999)}"), sources)
            del category
        for other in users:
            if other is user:
                continue
            for turn in [t for t in other["turns"] if t["role"] == "user"][:5]:
                measure("honest, human (other users)", clip(turn["text"]), sources)
        own = [t["text"] for t in user["turns"] if t["role"] == "user"]
        for text in own:
            measure("planted, own message", clip(text), sources)
        for memory in user["memories"]:
            measure("planted, own memory", clip(memory["value"]), sources)
        for k in (4, 6, 8, 10, 12, 16):
            runs = [w for w in (tokens(t) for t in own) if len(w) >= k]
            if not runs:
                continue
            picked = rng.choice(runs)
            start = rng.randrange(len(picked) - k + 1)
            stretch = picked[start : start + k]
            joiner = "" if all(len(w) == 1 and not w.isascii() for w in stretch) else " "
            template = SENTENCES[language]["ES"].format(topic=joiner.join(stretch))
            measure(f"planted, {k:2d} tokens spliced", template, sources)

    print("\nlongest stretch shared with the user's own turns and memories (words; a CJK character 0.5):")
    for group, values in groups.items():
        print(f"  {group:30s} {spread(values)}")
    print("\nshare each threshold would reject (a query fails at >= T shared words):")
    thresholds = (5, 6, 7, 8, 10, 12)
    print("  " + " " * 30 + "".join(f"  T={t:<4d}" for t in thresholds))
    for group, values in groups.items():
        cells = "".join(f"  {sum(v >= t for v in values) / len(values):6.1%}" for t in thresholds)
        print(f"  {group:30s}{cells}")
    print("\nthe longest honest stretches (what the threshold must let through):")
    for group in ("honest, written", "honest, human (other users)"):
        counts = Counter(groups[group])
        top = sorted(counts.items(), reverse=True)[:4]
        print(f"  {group}: " + ", ".join(f"{size:g} words x{n}" for size, n in top))
        print(f"    longest: {' '.join(examples[group][1])!r}")
    print(
        f"\nshipped rule: a copy shares >= {COPY_WORDS} words, or >= {COPY_SHORT} words that are "
        f">= {COPY_SHARE:.0%} of the query's; it rejects:"
    )
    for group, values in groups.items():
        print(f"  {group:30s} {rejected[group]:4d} of {len(values):4d}  {rejected[group] / len(values):6.1%}")

    started, checked = time.perf_counter(), 0
    for user in users:
        sources = own_texts(user)
        for text in [t["text"] for t in user["turns"] if t["role"] == "user"][:5]:
            not_copied(clip(text), sources)
            checked += 1
    took = (time.perf_counter() - started) / max(1, checked)
    longest = max(sum(map(len, own_texts(u))) for u in users)
    print(
        f"\nnot_copied: {took * 1000:.2f} ms per query "
        f"(a user's own texts here: at most {longest:,} characters)"
    )


if __name__ == "__main__":
    main()
