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

import asyncio
import heapq
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from personaemp.llm.session import open_engine
from personaemp.llm.settings import LLMSettings
from personaemp.llm.step import Step
from personaemp.units import run_units

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from benchlib import parser, server_stats, start_server  # noqa: E402


class Reply(BaseModel):
    summary: str
    score: int
    tags: list[str]


STEP = Step("bench", Reply, max_tokens=64)


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
    options = parser(__doc__, in_flight=32, median=0.3, sigma=0.8)
    options.add_argument("--units", type=int, default=500)
    args = options.parse_args()
    for fault_rate in (0.0, 0.1):
        server, base_url = start_server(
            ROOT / "tests" / "fake_openai.py", "--port", "0", "--seed", "1",
            "--latency-median", str(args.median), "--latency-sigma", str(args.sigma),
            "--fault-rate", str(fault_rate),
        )  # fmt: skip
        try:
            with tempfile.TemporaryDirectory() as work_dir:
                wall, cpu, info = asyncio.run(run(base_url, args.units, args.in_flight, Path(work_dir)))
            latencies = server_stats(base_url)["latencies"]
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
