"""Peak memory of `personaemp infer-persona` on 100K users against a zero-latency endpoint.

The users the filter keeps from the shared AlpsBench sample (../shared/alpsbench) are
copied under new ids up to --users (100,000: an input file of about 0.9 GB), then
infer-persona runs on them in a child process, 32 requests in flight, against
bench/capable_server.py without latency (every request answered at once, so the stage is
as busy as it can be). Prints the child's peak resident memory (goal <= 500 MB), its wall
time and the requests sent. The input and outputs live in a temporary folder.

    .venv/bin/python bench/scale/memory_bench.py [--users 100000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from benchlib import machine  # noqa: E402

from personaemp.dataset.filter import filter_users  # noqa: E402

SHARED = ROOT.parent / "shared" / "alpsbench" / "task1"


def grow(filtered: Path, target: Path, users: int) -> int:
    """`users` rows copied from `filtered` under new ids, each copy's first memory marked
    so its prompts differ (else the reply cache would answer the copies); returns the size."""
    rows = [json.loads(line) for line in filtered.read_text(encoding="utf-8").splitlines()]
    with target.open("w", encoding="utf-8") as out:
        for number in range(users):
            row, copy = rows[number % len(rows)], number // len(rows)
            memories = [dict(m) for m in row["memories"]]
            memories[0]["value"] += f" (copy {copy})"
            row = {**row, "user_id": f"{row['user_id']}-c{copy}", "memories": memories}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return target.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--in-flight", type=int, default=32)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "capable_server.py")], stdout=subprocess.PIPE, text=True
    )
    base_url = server.stdout.readline().strip().split(" ", 1)[1]
    try:
        with tempfile.TemporaryDirectory(prefix="personaemp-memory-") as name:
            folder = Path(name)
            filter_users(str(SHARED), folder / "kept.jsonl", console=Console(quiet=True))
            size = grow(folder / "kept.jsonl", folder / "filtered.jsonl", args.users)
            print(f"input: {args.users:,} users, {size / 1e6:,.0f} MB")
            command = [
                "/usr/bin/time", "-f", "%M", sys.executable, "-m", "personaemp", "infer-persona",
                "-i", str(folder / "filtered.jsonl"), "-o", str(folder / "personas.jsonl"),
                "--work-dir", str(folder / "work"), "--base-url", base_url, "--model", "fake",
                "--concurrency", str(args.in_flight),
            ]  # fmt: skip
            started = time.perf_counter()
            result = subprocess.run(command, cwd=folder, capture_output=True, text=True)
            wall = time.perf_counter() - started
            if result.returncode != 0:
                sys.exit(result.stderr[-2000:])
            peak_kb = int(result.stderr.strip().splitlines()[-1])
            written = sum(1 for _ in (folder / "personas.jsonl").open("rb"))
            with urllib.request.urlopen(base_url.removesuffix("/v1") + "/stats") as response:
                requests = json.load(response)["count"]
    finally:
        server.kill()
        server.wait()
    print(f"infer-persona: {written:,} personas written, {requests:,} requests, wall {wall:,.0f} s")
    print(f"peak resident memory: {peak_kb / 1024:,.0f} MB (goal <= 500 MB)")


if __name__ == "__main__":
    main()
