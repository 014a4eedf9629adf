"""`personaemp run --executor ray` with 2 and 4 workers next to one process, same total
concurrency, against the capable test server (bench/capable_server.py, log-normal latency).

The shared AlpsBench sample copied 3 times (bench/run_bench.prepare: 1,131 kept users) goes
through `personaemp run` three times, each in a fresh folder with its own cache: one
process, then Ray with 2 and with 4 workers (a local Ray each time, started by the command).
For each: wall; bound = Sum(the endpoint's answer times) / in flight; wall / bound, also
after Ray's start-up (the time the command prints); the peak resident memory of each Ray
worker (the `ray::MapWorker` processes, sampled every 0.2 s) and of the driver.

    .venv/bin/python bench/ray_bench.py [--copies 3] [--in-flight 32] [--median 0.3]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
from demo_bench import machine  # noqa: E402
from run_bench import prepare, start_server, stats  # noqa: E402


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def workers_now() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(b"ray::MapWorker"):
                    found.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
    return found


def run(folder: Path) -> tuple[float, str, dict[int, int], int]:
    """`personaemp run`: wall, stderr, peak RSS per Ray worker (pid -> bytes), the driver's peak."""
    peaks: dict[int, int] = {}
    driver_peak = [0]
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "personaemp", "run", "--config", str(folder / "personaemp.toml")],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            driver_peak[0] = max(driver_peak[0], rss(child.pid))
            for pid in workers_now():
                peaks[pid] = max(peaks.get(pid, 0), rss(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = child.communicate()
    wall = time.perf_counter() - started
    stop.set()
    sampler.join()
    if child.returncode:
        sys.exit(f"run failed ({child.returncode}):\n{err[-3000:]}")
    return wall, err, peaks, driver_peak[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--median", type=float, default=0.3)
    parser.add_argument("--sigma", type=float, default=0.6)
    parser.add_argument("--workers", type=int, nargs="*", default=[2, 4])
    args = parser.parse_args()
    print(f"machine: {machine()}")
    server, base_url = start_server(args.median, args.sigma)
    try:
        for workers in [None, *args.workers]:
            with tempfile.TemporaryDirectory() as name:
                folder = Path(name)
                prepare(folder, args.copies, base_url, args.in_flight)
                if workers:
                    with (folder / "personaemp.toml").open("a", encoding="utf-8") as toml:
                        toml.write(f'executor = "ray"\nworkers = {workers}\n')
                before = stats(base_url)
                wall, err, peaks, driver = run(folder)
                after = stats(base_url)
                kept = sum(1 for _ in (folder / "processed" / "personas.jsonl").open(encoding="utf-8"))
            latencies = after["latencies"][len(before["latencies"]) :]
            bound = sum(latencies) / args.in_flight
            startups = [float(s) for s in re.findall(r"local Ray \(started in ([\d.]+) s\)", err)]
            timings = [line for line in err.splitlines() if line.startswith("run: ")]
            label = f"Ray, {workers} workers x {args.in_flight // workers}" if workers else "one process"
            print(f"\n{label} (in flight {args.in_flight}): {kept} users, {len(latencies)} requests")
            print(f"  wall {wall:.1f} s, bound {bound:.1f} s -> {wall / bound:.3f}")
            if startups:
                print(
                    f"  Ray start-up {sum(startups):.1f} s ({' + '.join(f'{s:.1f}' for s in startups)}, once "
                    f"per LLM stage) -> after it {(wall - sum(startups)) / bound:.3f}"
                )
                per_worker = ", ".join(f"{peak / 2**20:.0f}" for peak in sorted(peaks.values()))
                print(f"  peak RSS per worker (MB, each worker process seen): {per_worker}")
            print(f"  driver peak RSS {driver / 2**20:.0f} MB; {timings[-1] if timings else ''}")
    finally:
        server.kill()


if __name__ == "__main__":
    main()
