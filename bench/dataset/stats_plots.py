"""Draw `personaemp stats` plots for a synthetic build of N users, to look at them.

Not a test: it writes a build shaped like the real stages' files (filter report,
personas, queries, random and OOD splits: only the fields the statistics read) with
plausible spreads (three categories, a dozen languages, 0-6 queries a user, lengths of
20-1,000 characters, checks passing 60-99%), runs `personaemp stats` on it and prints
where the PNGs are and how long it took.

    .venv/bin/python bench/dataset/stats_plots.py --users 100 --out bench/out/stats-100
    .venv/bin/python bench/dataset/stats_plots.py --users 10000 --out bench/out/stats-10000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from personaemp.dataset.stats import write_stats  # noqa: E402
from personaemp.records import BIG_FIVE  # noqa: E402
from personaemp.vocabulary import CHECKS  # noqa: E402

LANGUAGES = {"en": 60, "zh": 12, "ru": 8, "es": 5, "fr": 4, "de": 3, "pt": 2, "ja": 2, "ko": 1, "it": 1,
             "tr": 1, "ar": 1}  # fmt: skip
# How often a rejected query still passes each check.
PASS = dict(zip(CHECKS, (0.7, 0.8, 0.85, 0.97, 0.75, 0.9, 0.8, 0.6), strict=True))


def query(rng: random.Random, uid: str, i: int, accepted: bool) -> dict:
    checks = {name: accepted or rng.random() < PASS.get(name, 0.9) for name in CHECKS}
    return {
        "category": rng.choices(("ES", "HEQ", "SS"), (5, 3, 2))[0],
        "query": "x" * min(1000, max(15, int(rng.lognormvariate(5.0, 0.6)))),
        "memory_ids": [f"{uid}-m{k}" for k in range(rng.choices((1, 2, 3, 4, 5), (40, 30, 15, 10, 5))[0])],
        "checks": {**checks, "passed": accepted},  # an accepted query passed every check
    }


def build(folder: Path, users: int, seed: int) -> None:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    personas, rows = [], []
    for n in range(users):
        uid = f"u{n:06d}"
        eligible = rng.random() < 0.88
        levels = {t: {"level": rng.choices(("low", "medium", "high"), (2, 5, 3))[0]} for t in BIG_FIVE}
        language = rng.choices(list(LANGUAGES), list(LANGUAGES.values()))[0]
        persona = {"user_id": uid, "eligible": eligible, "language": language, "big_five": levels}
        personas.append(persona)
        if eligible:
            made = rng.choices(range(7), (4, 10, 20, 25, 20, 12, 9))[0]
            accepted = [query(rng, uid, i, True) for i in range(made) if rng.random() < 0.8]
            rejected = [query(rng, uid, i, False) for i in range(made - len(accepted))]
            rows.append({**persona, "queries": accepted, "rejected_queries": rejected})
    report = {"users_in": int(users * 3.2), "kept": users, "dropped": {}}
    (folder / "filter_report.json").write_text(json.dumps(report), encoding="utf-8")
    write(folder / "personas.jsonl", personas)
    write(folder / "queries.jsonl", rows)
    splittable = [row for row in rows if row["queries"]]
    test = set(rng.sample(range(len(splittable)), len(splittable) // 10))
    ood = {n for n, row in enumerate(splittable) if row["big_five"]["neuroticism"]["level"] == "high"
           and row["big_five"]["openness"]["level"] != "low"}  # fmt: skip
    for setting, held in (("random", test), ("ood", ood)):
        parts = {"train": [], "test": []}
        for n, row in enumerate(splittable):
            parts["test" if n in held else "train"].append(row)
        for part, part_rows in parts.items():
            write(folder / "splits" / setting / f"{part}.jsonl", part_rows)


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None, help="default: bench/out/stats-<users>")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    out = args.out or Path(__file__).resolve().parents[1] / "out" / f"stats-{args.users}"
    build(out / "processed", args.users, args.seed)
    start = time.perf_counter()
    result = write_stats(out / "processed", out / "stats").report
    took = time.perf_counter() - start
    accepted = result.stats["queries"]["accepted"]
    print(f"{args.users} users: {accepted} accepted queries; stats and plots in {took:.2f} s")
    for name in result.files:
        print(f"  {result.out / name}")


if __name__ == "__main__":
    main()
