"""Benchmark `personaemp filter` against a plain parse of the same files.

Builds a task1-layout input of N users (default 100,000, about 4.7 GB) by replicating
../shared/alpsbench with fresh benchmark ids, then times, each in its own process:
  - parse: every line of both files decoded to Python objects by msgspec (the JSON
    library the toolkit uses; orjson too if installed, and the faster of the two counts),
  - filter, replicated: `personaemp filter` (this checkout's) on the folder. The input
    repeats 1,200 histories, so its per-history language cache decides each one once: a
    figure real inputs (every history distinct) never see;
  - filter, distinct: the same command with that cache off (LANGUAGE_CACHE = 0, set by a
    bench-only wrapper), so every kept user's language is decided afresh, as it is for an
    input whose histories all differ. Same bytes in, so both runs must write the same
    output (checked): only the work per history differs. This is the figure that counts.
Past 256 kept users the filter decides languages in a second process while it reads on: the
wall time is what a user waits for on 2 cores, and the peak RSS is summed over the
filter's processes. Prints the machine, users/s, the filter/parse ratios (target <= 2.0)
and that peak (target <= 500 MB).

    .venv/bin/python bench/dataset/filter_bench.py [--users 100000] [--source ../shared/alpsbench/task1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = ("model_input.jsonl", "reference_output.jsonl")

PARSE = """
import sys, importlib
module, function = sys.argv[1].split(":")
loads = getattr(importlib.import_module(module), function)
for name in sys.argv[2:]:
    with open(name, "rb") as handle:
        for line in handle:
            loads(line)
"""
PARSERS = ["msgspec.json:decode", "orjson:loads"]
# `personaemp` from this checkout, both runs the same way; "distinct" turns the per-history
# language cache off first.
FILTER = """
import sys
sys.path.insert(0, sys.argv[1])
import personaemp.sources.normalize
from personaemp.cli import entry
if sys.argv[2] == "distinct":
    personaemp.sources.normalize.LANGUAGE_CACHE = 0
sys.argv = ["personaemp", *sys.argv[3:]]
sys.exit(entry())
"""


def build_input(source: Path, target: Path, users: int) -> None:
    """Copy the source rows round-robin, giving every copy a fresh benchmark_id."""
    marker = target / ".complete"
    if marker.exists() and marker.read_text() == str(users):
        return
    target.mkdir(parents=True, exist_ok=True)
    lines = {name: (source / name).read_bytes().splitlines(keepends=True) for name in FILES}
    count = len(lines[FILES[0]])
    for name in FILES:
        with (target / name).open("wb") as out:
            for number in range(users):
                line = lines[name][number % count]
                # Rows start with {"benchmark_id": "<id>", ...: replace the first occurrence only.
                start = line.index(b'"benchmark_id": "') + len(b'"benchmark_id": "')
                end = line.index(b'"', start)
                out.write(line[:start] + b"u%07d" % number + line[end:])
    marker.write_text(str(users))


def _tree_rss(pid: int) -> float:
    """MB resident in a process and all its descendants (Linux /proc; 0 elsewhere)."""
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        total += next(
            (int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmRSS")), 0
        )
        pending += [int(child) for child in children]
    return total


def measure(command: list[str]) -> tuple[float, float]:
    """Wall time, and the peak of the memory the command's processes hold together (the
    filter's language worker included), sampled every 50 ms."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0.0
    while process.poll() is None:
        peak = max(peak, _tree_rss(process.pid))
        time.sleep(0.05)
    wall = time.perf_counter() - started
    if process.returncode:
        sys.exit(f"failed: {' '.join(command)}\n{process.stderr.read().decode()[-2000:]}")
    process.stderr.close()
    return wall, peak


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    names = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")]
    return f"{names[0] if names else 'unknown'}, {os.cpu_count()} cores"


def _same_output(first: Path, second: Path) -> bool:
    """Same kept users, same report apart from the paths."""
    if first.read_bytes() != second.read_bytes():
        return False
    reports = [json.loads(path.with_name("filter_report.json").read_text()) for path in (first, second)]
    for report in reports:
        report.pop("output")
    return reports[0] == reports[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--source", type=Path, default=ROOT.parent / "shared" / "alpsbench" / "task1")
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "out" / "filter")
    args = parser.parse_args()

    data = args.work / f"task1_{args.users}"
    started = time.perf_counter()
    build_input(args.source, data, args.users)
    size = sum((data / name).stat().st_size for name in FILES) / 1e9
    print(f"input: {args.users} users, {size:.2f} GB ({time.perf_counter() - started:.0f} s to build)")

    python = sys.executable
    files = [str(data / name) for name in FILES]
    parsers = [p for p in PARSERS if _importable(p.split(":")[0])]
    outputs = {name: args.work / name / "filtered.jsonl" for name in ("replicated", "distinct")}
    commands = {name: [python, "-c", FILTER, str(ROOT), name, "filter"] for name in outputs}

    print(f"machine: {_machine()}")
    measure([python, "-c", PARSE, parsers[0], *files])  # warm the page cache
    timings = {p: min(measure([python, "-c", PARSE, p, *files]) for _ in range(2)) for p in parsers}
    for parser, (wall, _) in timings.items():
        print(f"parse with {parser}: {wall:.2f} s")
    parse_wall, parse_rss = min(timings.values())
    rows = [("parse only", parse_wall, parse_rss)]
    for name, command in commands.items():
        wall, rss = measure([*command, "--quiet", "--input", str(data), "--output", str(outputs[name])])
        rows.append((f"filter, {name}", wall, rss))
    kept = sum(1 for _ in outputs["distinct"].open("rb"))

    for name, wall, rss in rows:
        print(f"{name:20s}: {wall:7.2f} s  {args.users / wall:9.0f} users/s  peak RSS {rss:6.0f} MB")
    print(f"kept                : {kept} users")
    print(f"same output         : {_same_output(*outputs.values())}")
    for name, wall, _ in rows[1:]:
        target = " (target <= 2.0)" if "distinct" in name else ""
        print(f"ratio {name}/parse: {wall / parse_wall:.2f}{target}")
    print(f"peak RSS filter     : {max(rss for _, _, rss in rows[1:]):.0f} MB (target <= 500 MB)")


if __name__ == "__main__":
    main()
