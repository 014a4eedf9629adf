"""`personaemp run` at scale against a fake endpoint with a real latency: is it kept busy?

The shared AlpsBench sample (../shared/alpsbench) copied --copies times under new ids
(3: 3,600 users, about 1,100 kept by the filter) goes through the whole `run` command in a
child process (start-up, filter, both LLM stages, split, push --dry-run: all timed)
against tests/fake_openai.py in another process, which sleeps a log-normal latency per
request (median 0.3 s, sigma 0.6) and answers like a capable model. 32 requests in flight.

Prints the wall time against the ideal Sum(latency)/32 (target <= 1.15x), and beside it
the makespan of a simulated greedy scheduler over the same request chains (each user:
persona, Big Five if eligible, then situations, queries and checks) and the same latency
model, with no overhead and no start-up: the bound any client could reach. Then runs the
command again: it must send 0 requests.

    .venv/bin/python bench/scale/run_bench.py [--copies 3] [--in-flight 32]
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from benchlib import SHARED, capable_server, machine, parser, server_stats  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from conftest import copy_sample  # noqa: E402


def run(folder: Path) -> tuple[float, str]:
    """The command's wall time, and its closing line of stage times ("run: filter 2.1 s · ...")."""
    started, launched = time.perf_counter(), time.time()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "personaemp", "run", "--config", str(folder / "personaemp.toml")],
        cwd=folder, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    (folder / "cpu").write_text(repr(cpu))  # the command and its children (the streamed filter)
    (folder / "run.log").open("a", encoding="utf-8").write(done.stderr)
    timings = [line for line in done.stderr.splitlines() if line.startswith("run: ")]
    (folder / "launched").write_text(repr(launched))
    return wall, timings[-1] if timings else "run: (no stage times printed)"


def simulate(
    chains: list[int], slots: int, median: float, sigma: float, seed: int = 1
) -> tuple[float, float]:
    """(makespan, sum of latencies) of a greedy scheduler: a free slot takes the next call of
    a chain whose previous call is done, else starts the next chain; no overhead at all."""
    rng = random.Random(seed)
    draw = lambda: median * rng.lognormvariate(0, sigma)  # noqa: E731
    waiting = list(reversed(chains))  # calls left per chain not started yet
    ready: list[int] = []  # calls left of chains whose previous call has ended
    running: list[tuple[float, int]] = []  # (end time, calls left after this one)
    now, total = 0.0, 0.0
    while waiting or ready or running:
        while len(running) < slots and (ready or waiting):
            left = ready.pop() if ready else waiting.pop()
            latency = draw()
            total += latency
            heapq.heappush(running, (now + latency, left - 1))
        now, left = heapq.heappop(running)
        if left:
            ready.append(left)
    return now, total


def prepare(folder: Path, copies: int, base_url: str, in_flight: int) -> None:
    """The shared sample copied `copies` times into folder/input, and a personaemp.toml that
    runs it against the test server at `base_url`."""
    copy_sample(SHARED, folder / "input", copies, mark=True)
    (folder / "personaemp.toml").write_text(
        f'[paths]\ninput = "{folder / "input"}"\nprocessed = "{folder / "processed"}"\n'
        f'[llm]\nbase_url = ["{base_url}"]\nmodel = "fake"\nconcurrency = {in_flight}\n',
        encoding="utf-8",
    )


def main() -> None:
    options = parser(__doc__, in_flight=32, median=0.3, sigma=0.6)
    options.add_argument("--copies", type=int, default=3)
    options.add_argument(
        "--keep", type=Path, help="an empty folder to run in and keep (default: a temporary one)"
    )
    args = options.parse_args()
    print(f"machine: {machine()}")
    server, base_url = capable_server(args.median, args.sigma)
    try:
        with contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            prepare(folder, args.copies, base_url, args.in_flight)
            wall, timings = run(folder)
            first_cpu = float((folder / "cpu").read_text())
            launched = float((folder / "launched").read_text())
            first = server_stats(base_url)
            processed = folder / "processed"
            report = json.loads((processed / ".personaemp" / "run_report.json").read_text())["stages"]
            again, _ = run(folder)
            second = server_stats(base_url)
            personas = [json.loads(line) for line in (processed / "personas.jsonl").open(encoding="utf-8")]
            client_cpu = float((folder / "cpu").read_text())
    finally:
        server.kill()
        server_usage = os.wait4(server.pid, 0)[2]
        server.returncode = -9
    requests = first["count"]
    ideal = sum(first["latencies"]) / args.in_flight
    chains = [(2 if p["eligible"] else 1) + (3 if p["eligible"] and p["traits"] else 0) for p in personas]
    makespan, total = simulate(chains, args.in_flight, args.median, args.sigma)
    reasks = sum(step["reasks"] for stage in report.values() for step in stage.get("steps", {}).values())
    print(f"users through the LLM stages: {len(personas)}; requests: {requests} ({reasks} re-asks)")
    print(f"wall of `personaemp run` (start-up, filter, split, push included): {wall:.1f} s")
    print(f"  in process, {timings.removeprefix('run: ')} (the rest: start-up)")
    print(f"ideal Sum(latency)/{args.in_flight}: {ideal:.1f} s -> ratio {wall / ideal:.3f} (target <= 1.15)")
    bound = total / args.in_flight
    print(
        f"simulated greedy scheduler, same chains and latency model, no overhead: "
        f"{makespan:.1f} s / {bound:.1f} s -> ratio {makespan / bound:.3f}"
    )
    steps = [step for stage in report.values() for step in stage.get("steps", {}).values()]
    answered = sum(step["answered"] for step in steps)
    client = sum(step["seconds"] for step in steps) / max(answered, 1)
    server_mean = sum(first["latencies"]) / len(first["latencies"])
    llm = max(stage["wall_seconds"] for stage in report.values())
    print(
        f"of which both LLM stages: {llm:.1f} s ({llm / ideal:.3f}x the ideal); a request took "
        f"{client * 1000:.0f} ms seen by the client, {server_mean * 1000:.0f} ms drawn as the endpoint's "
        "answer time, "
        f"{sum(first['handled']) / len(first['handled']) * 1000:.0f} ms from read to reply sent there"
    )
    ends = [start + latency for start, latency in zip(first["started"], first["latencies"], strict=True)]
    busy = max(ends) - min(first["started"])
    print(
        f"the endpoint's first request {min(first['started']) - launched:.1f} s after launch, its last reply "
        f"{launched + wall - max(ends):.1f} s before the end; in between {busy:.1f} s with "
        f"{sum(first['latencies']) / busy:.1f} of {args.in_flight} in flight on average"
    )
    print(
        f"CPU: the command (with its filter child) {first_cpu:.1f} s over its {wall:.1f} s; the fake "
        f"endpoint {server_usage.ru_utime + server_usage.ru_stime:.1f} s over both runs"
    )
    print(f"re-run: {second['count'] - requests} requests, wall {again:.1f} s (CPU {client_cpu:.1f} s)")


if __name__ == "__main__":
    main()
