"""Benchmark the LLM engine against the fake OpenAI server in another process.

500 units, one structured call each, 32 requests in flight; the server sleeps a
log-normal latency per request (median 300 ms, sigma 0.8: a heavy tail). Prints wall
time, the ideal (sum of the server's latencies / 32), their ratio (target <= 1.10),
requests/s and the engine's own CPU time per request. Then again with 10% faults.

Sum/32 is a bound no scheduler reaches when one request alone takes seconds, so the
bench also prints the makespan of a perfect work-conserving scheduler (32 slots, each
next request to the first free slot, no overhead) over the same latencies in the same
order: wall / that is the engine's own overhead.

    .venv/bin/python bench/llm/engine_bench.py [--units 500] [--in-flight 32]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from pydantic import BaseModel

from personaemp.llm.session import open_engine
from personaemp.llm.settings import LLMSettings
from personaemp.llm.step import Step
from personaemp.runner import run_units

ROOT = Path(__file__).resolve().parents[2]


class Reply(BaseModel):
    summary: str
    score: int
    tags: list[str]


STEP = Step("bench", Reply, max_tokens=64)


def start_server(fault_rate: float, median: float, sigma: float) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, str(ROOT / "tests" / "fake_openai.py"), "--port", "0", "--seed", "1"]
    command += [
        "--latency-median",
        str(median),
        "--latency-sigma",
        str(sigma),
        "--fault-rate",
        str(fault_rate),
    ]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline().strip()
    if not line.startswith("READY "):
        server.kill()
        sys.exit(f"fake server did not start: {line!r}")
    return server, line.split(" ", 1)[1]


def server_latencies(base_url: str) -> list[float]:
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/stats") as response:
        return json.load(response)["latencies"]


async def run(base_url: str, units: int, in_flight: int, work_dir: Path) -> tuple[float, float, dict]:
    settings = LLMSettings(
        base_urls=[base_url],
        model="fake",
        concurrency=in_flight,
        work_dir=work_dir,
        use_cache=False,
        max_retries=8,
        timeout=30,
    )
    async with open_engine(settings) as engine:

        async def work(unit):
            result = await engine.call(STEP, [{"role": "user", "content": f"unit {unit['id']}"}])
            return {**unit, "reply": result.value.model_dump()}

        cpu, wall = time.process_time(), time.perf_counter()
        outcome = await run_units(
            [{"id": i} for i in range(units)],
            work,
            key="id",
            output=work_dir / "out.jsonl",
            failures=work_dir / "failures.jsonl",
            fingerprint="bench",
            window=in_flight,
        )
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        totals = engine.accounting.totals()
    return wall, cpu, {"outcome": outcome, "requests": totals.requests, "retries": totals.retries}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--units", type=int, default=500)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--median", type=float, default=0.3)
    parser.add_argument("--sigma", type=float, default=0.8)
    args = parser.parse_args()
    for fault_rate in (0.0, 0.1):
        server, base_url = start_server(fault_rate, args.median, args.sigma)
        try:
            with tempfile.TemporaryDirectory() as work_dir:
                wall, cpu, info = asyncio.run(run(base_url, args.units, args.in_flight, Path(work_dir)))
            latencies = server_latencies(base_url)
        finally:
            server.kill()
            server.wait()
        ideal = sum(latencies) / args.in_flight
        slots = [0.0] * args.in_flight
        for latency in latencies:
            heapq.heappush(slots, heapq.heappop(slots) + latency)
        greedy = max(slots)
        outcome = info["outcome"]
        requests, retries = info["requests"], info["retries"]
        print(f"faults {fault_rate:.0%}: {args.units} units, {requests} requests ({retries} retries)")
        print(f"  done {outcome.done}, failed {outcome.failed} {dict(outcome.failures_by_kind)}")
        print(f"  wall {wall:.2f} s, ideal {ideal:.2f} s (sum of server latencies / {args.in_flight})")
        print(f"  ratio wall/ideal {wall / ideal:.3f} (target <= 1.10)")
        print(f"  perfect scheduler {greedy:.2f} s (longest request {max(latencies):.2f} s)")
        print(f"  ratio wall/perfect scheduler {wall / greedy:.3f}")
        print(f"  {requests / wall:.1f} requests/s, engine CPU {1000 * cpu / requests:.2f} ms/request")


if __name__ == "__main__":
    main()
