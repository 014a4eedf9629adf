"""Language of a user: the old guesser against the new detector, on a hand-checked list.

bench/dataset/language_gold.jsonl names, for each user, the language they write in, as read by a
person from their own turns (a note says why for the hard cases: pasted text, code,
mixed). Users whose language the reader could not decide have `language: null` and are
left out. `set` is "development" for the users read while the rules of
personaemp/language.py were written and "held-out" for those read after they were frozen.
This script reads those users' turns from the shipped sample and the shared one, asks
both detectors, and prints each one's accuracy and misses:

    .venv/bin/python bench/dataset/language_bench.py [--shipped DIR] [--shared DIR]

"old" is the guesser this project had before (writing system, then common words, on the
first 1,000 characters of the user's turns), kept in bench/dataset/language_old.py to be measured;
"new" is personaemp.language.user_language. Timings are printed, not asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench" / "dataset")]  # the benches it borrows from

import language_old  # noqa: E402

from personaemp.language import user_language  # noqa: E402


def read_turns(folder: Path) -> dict[str, list[str]]:
    """user id -> the user's own turns, from a task1 model_input.jsonl."""
    users = {}
    with open(folder / "model_input.jsonl", encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            data = row["input"]
            turns = [t for s in data.get("sessions") or [] for t in s["turns"]] or data.get("dialogue") or []
            users[data.get("user_id") or row["benchmark_id"]] = [
                t["text"] for t in turns if t["role"] == "user"
            ]
    return users


def old_language(turns: list[str]) -> str | None:
    """What the toolkit computed before: the first 1,000 characters of the user's turns."""
    sample, size = [], 0
    for text in turns:
        if size < 1000:
            sample.append(text[: 1000 - size])
            size += len(sample[-1]) + 1
    return language_old.detect_language(" ".join(sample))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gold", type=Path, default=ROOT / "bench" / "dataset" / "language_gold.jsonl")
    parser.add_argument("--shipped", type=Path, default=ROOT / "data" / "raw" / "alpsbench_sample" / "task1")
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "alpsbench" / "task1")
    args = parser.parse_args()

    gold = [json.loads(line) for line in args.gold.read_text(encoding="utf-8").splitlines() if line.strip()]
    sources = {"shipped": read_turns(args.shipped)}
    if (args.shared / "model_input.jsonl").exists():
        sources["shared"] = read_turns(args.shared)
    else:
        print(f"{args.shared}: not found; only the shipped sample's users are checked")
    users = [g for g in gold if g["source"] in sources and g["language"]]
    left_out = [g for g in gold if g["source"] in sources and not g["language"]]

    results, seconds = {}, {}
    for name, detect in (("old", old_language), ("new", user_language)):
        user_language(["warm up: load the model once"])
        started = time.perf_counter()
        results[name] = {g["user_id"]: detect(sources[g["source"]][g["user_id"]]) for g in users}
        seconds[name] = time.perf_counter() - started

    counts = ", ".join(f"{sum(g['source'] == s for g in users)} {s}" for s in sources)
    counts = ", ".join(f"{sum(g['source'] == s for g in users)} {s}" for s in sources)
    print(f"{len(users)} users ({counts});")
    undecided = ", ".join(g["user_id"] for g in left_out)
    print(f"{len(left_out)} left out as undecidable by the reader: {undecided}\n")
    # "development": the users read while the rules of personaemp/language.py were written;
    # "held-out": read afterwards, with the rules frozen.
    sets = {"all": users, **{s: [g for g in users if g["set"] == s] for s in ("development", "held-out")}}
    print(
        "| detector | "
        + " | ".join(f"{s} ({len(group)} users)" for s, group in sets.items())
        + " | ms per user |"
    )
    print("|---|" + "---|" * (len(sets) + 1))
    for name, found in results.items():
        cells = []
        for group in sets.values():
            right = sum(found[g["user_id"]] == g["language"] for g in group)
            cells.append(f"{right} ({right / len(group):.1%})" if group else "-")
        print(f"| {name} | " + " | ".join(cells) + f" | {seconds[name] / len(users) * 1000:.2f} |")
    for name, found in results.items():
        misses = [g for g in users if found[g["user_id"]] != g["language"]]
        print(f"\n{name} misses ({len(misses)}):")
        for g in misses:
            note = f"  ({g['note']})" if g["note"] else ""
            print(f"  {g['user_id']} ({g['set']})  {g['language']} read as {found[g['user_id']]}{note}")


if __name__ == "__main__":
    main()
