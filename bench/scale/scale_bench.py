"""Memory per stage and re-run time of `personaemp run` at a size, against the test server.

Full run (`--copies C`): the shared AlpsBench sample (../shared/alpsbench, 1,200 users, about
375 kept per copy) copied C times under new ids (tests/conftest.copy_sample, as
bench/scale/run_bench.py) goes through `personaemp run` in a child process against
bench/capable_server.py with a log-normal latency. The memory of the child and its children
(the streamed filter, split's and stats' forked workers: Pss, so pages they share count
once) is sampled every 0.1 s and split by the stage `run` announces on stderr. Prints
wall / bound (bound: Sum(latency) / in flight), peak memory per stage, disk per kept
user, then runs the command again and prints that re-run's wall time and requests, and each LLM
command's alone.

Grown build (`--grow N`, no LLM): the queries a full run of the sample wrote, copied under
new ids up to N users (as bench/scale/memory_bench.py grows its input), then `split`, `stats` and
`push --dry-run` each alone, each forced, under /usr/bin/time: their peak RSS and wall.

    .venv/bin/python bench/scale/scale_bench.py [--copies 3] [--grow 15000] [--median 0.3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "bench" / "scale")]  # benchlib, and run_bench's
sys.path.insert(0, str(ROOT / "tests"))
from benchlib import capable_server, machine, server_stats  # noqa: E402
from conftest import SAMPLE_TASK1  # noqa: E402
from run_bench import prepare  # noqa: E402

STAGES = ("filter → infer-persona → gen-queries", "split", "stats", "push (dry run)")


def tree_pss(pid: int) -> int:
    """Proportional resident bytes (Pss) of a process and its descendants (Linux /proc): the
    forked workers of split and stats share their parent's pages, which RSS counts twice."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            for line in Path(f"/proc/{current}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(child) for child in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
    return total


def run_sampled(folder: Path) -> tuple[float, dict[str, int], str]:
    """`personaemp run` in `folder`: wall time, peak RSS per stage, its closing timing line."""
    command = [sys.executable, "-m", "personaemp", "run", "--config", str(folder / "personaemp.toml")]
    env = {**os.environ, "COLUMNS": "100"}
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    stage, peaks, lines = "start-up", {}, []

    def read() -> None:
        nonlocal stage
        for raw in child.stderr:
            line = raw.decode(errors="replace")
            lines.append(line)
            named = [name for name in STAGES if f" {name} " in line and "─" in line]
            if named:
                stage = named[0]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while child.poll() is None:
        peaks[stage] = max(peaks.get(stage, 0), tree_pss(child.pid))
        time.sleep(0.1)
    reader.join()
    wall = time.perf_counter() - started
    (folder / "run.log").open("a", encoding="utf-8").write("".join(lines))
    if child.returncode:
        sys.exit("".join(lines[-30:]))
    timing = [line for line in lines if line.startswith("run: ")]
    return wall, peaks, timing[-1].strip() if timing else ""


def disk(folder: Path) -> tuple[int, int]:
    """Bytes under `folder`: all, and the cache's."""
    files = [path for path in folder.rglob("*") if path.is_file()]
    cache = sum(path.stat().st_size for path in files if path.name.startswith("cache.sqlite"))
    return sum(path.stat().st_size for path in files), cache


def full_run(args) -> None:
    server, base_url = capable_server(args.median, args.sigma)
    try:
        with tempfile.TemporaryDirectory(prefix="personaemp-scale-") as name:
            folder = Path(name)
            prepare(folder, args.copies, base_url, args.in_flight)
            wall, peaks, timing = run_sampled(folder)
            first = server_stats(base_url)
            processed = folder / "processed"
            kept = json.loads((processed / "filter_report.json").read_text())["kept"]
            size, cache = disk(processed)
            again, again_peaks, again_timing = run_sampled(folder)
            second = server_stats(base_url)
            config = str(folder / "personaemp.toml")
            alone = {
                name: timed(name, "--config", config, cwd=folder) for name in ("infer-persona", "gen-queries")
            }
            third = server_stats(base_url)
    finally:
        server.kill()
        server.wait()
    bound = sum(first["latencies"]) / args.in_flight
    print(f"run at {args.copies} copies: {kept:,} kept users, {first['count']:,} requests")
    print(
        f"wall {wall:.1f} s, bound Sum(latency)/{args.in_flight} {bound:.1f} s: wall/bound {wall / bound:.2f}"
    )
    print(f"  {timing}")
    print("peak memory (Pss, sampled every 0.1 s) per stage, the command and its children: " + ", ".join(
        f"{stage} {rss / 2**20:,.0f} MB" for stage, rss in peaks.items()))  # fmt: skip
    per_user, cached = size / kept / 1024, cache / kept / 1024
    print(f"disk: {per_user:,.1f} KB per kept user ({cached:,.1f} KB of it the reply cache)")
    print(
        f"re-run: {second['count'] - first['count']} requests, wall {again:.1f} s, peak Pss "
        f"{max(again_peaks.values()) / 2**20:,.0f} MB\n  {again_timing}"
    )
    print(
        "each LLM command alone, again: "
        + ", ".join(f"{name} {wall:.1f} s ({peak:,.0f} MB)" for name, (peak, wall) in alone.items())
        + f"; {third['count'] - second['count']} requests"
    )


def grow_queries(build: Path, target: Path, users: int) -> None:
    """`users` rows of the build's queries.jsonl under new ids (and new query ids)."""
    rows = [json.loads(line) for line in (build / "queries.jsonl").read_text(encoding="utf-8").splitlines()]
    with target.open("w", encoding="utf-8") as out:
        for number in range(users):
            row, copy = rows[number % len(rows)], number // len(rows)
            row = {**row, "user_id": f"{row['user_id']}-c{copy}"}
            row["queries"] = [{**q, "query_id": f"{q['query_id']}-c{copy}"} for q in row.get("queries", [])]
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


def timed(*args: str, cwd: Path) -> tuple[float, float]:
    """Peak RSS (MB) and wall (s) of `personaemp ARGS`."""
    command = ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "personaemp", *args]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        sys.exit(done.stderr[-3000:])
    return int(done.stderr.strip().splitlines()[-1]) / 1024, wall


def grown(args) -> None:
    server, base_url = capable_server(0.0, 0.0)
    try:
        with tempfile.TemporaryDirectory(prefix="personaemp-grow-") as name:
            folder = Path(name)
            (folder / "personaemp.toml").write_text(
                f'[paths]\ninput = "{SAMPLE_TASK1}"\nprocessed = "{folder / "sample"}"\n'
                f'[llm]\nbase_url = ["{base_url}"]\nmodel = "fake"\n',
                encoding="utf-8",
            )
            subprocess.run(
                [sys.executable, "-m", "personaemp", "run", "--config", str(folder / "personaemp.toml")],
                cwd=folder, check=True, capture_output=True,
            )  # fmt: skip
            build = folder / "build"
            build.mkdir()
            grow_queries(folder / "sample", build / "queries.jsonl", args.grow)
            queries = sum(len(json.loads(line)["queries"]) for line in (build / "queries.jsonl").open())
            size = (build / "queries.jsonl").stat().st_size
            print(f"grown build: {args.grow:,} users, {queries:,} accepted queries, {size / 1e6:,.0f} MB")
            for label, command in (
                ("split", ["split", "-i", "build/queries.jsonl", "-o", "build/splits", "--force"]),
                ("stats", ["stats", "--processed", "build", "--out-dir", "build/stats", "--force"]),
                ("push --dry-run",
                 ["push", "--splits", "build/splits", "--dry-run", "--out-dir", "build/dataset", "--force"]),
            ):  # fmt: skip
                peak, wall = timed(*command, cwd=folder)
                print(f"{label}: peak RSS {peak:,.0f} MB, wall {wall:.1f} s")
    finally:
        server.kill()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--copies", type=int, help="a full run on the sample copied this many times")
    parser.add_argument("--grow", type=int, help="split, stats and push alone on this many users' queries")
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--median", type=float, default=0.3)
    parser.add_argument("--sigma", type=float, default=0.6)
    args = parser.parse_args()
    if not (args.copies or args.grow):
        parser.error("give --copies C, --grow N, or both")
    print(f"machine: {machine()}")
    if args.grow:
        grown(args)
    if args.copies:
        full_run(args)


if __name__ == "__main__":
    main()
