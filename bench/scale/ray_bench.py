"""`personaemp run --executor ray` with 2 and 4 workers next to one process, same total
concurrency, against the capable test server (bench/capable_server.py, log-normal latency).

The shared AlpsBench sample copied 3 times (bench/run_bench.prepare: 1,131 kept users) goes
through `personaemp run` in a fresh folder with its own cache each time: one process (and,
with --control, one process with its LLM stages one after the other, as Ray ran them
first), then Ray with 2 and with 4 workers (a local Ray each time, started by the command).
For each: wall; bound = Sum(the endpoint's answer times) / in flight; wall / bound; the
first request's start and the last reply's end against the command's launch and end (the
ratio in between: the steady state); on Ray, wall / bound after ray.init (the time the
command prints) and after the whole start-up (launch to the first request); the
overhead-free scheduler's makespan on the same chains (run_bench.simulate), chained and
stage after stage; the peak resident memory of each Ray worker and of the driver; and the
CPU seconds of each kind of process of the run (the command and its children, Ray's own
processes, the test server: each sampled every 0.2 s from /proc) against the machine's and
2 cores x wall, so a run slowed by a saturated CPU says so.

Figures: docs/past-one-machine.md#figures.

    .venv/bin/python bench/scale/ray_bench.py [--copies 3] [--in-flight 32] [--median 0.3] [--control]
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "bench" / "scale")]  # benchlib, and run_bench's
sys.path.insert(0, str(ROOT / "tests"))
from benchlib import capable_server, machine, parser, server_stats  # noqa: E402
from run_bench import prepare, simulate  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def kind(pid: int, parent: int, cmdline: bytes, driver: int, server: int) -> str | None:
    """Which part of the run a process is (None: not ours)."""
    if driver in (pid, parent) and not cmdline.startswith(b"ray::") and b"/ray/" not in cmdline:
        return "driver"
    if pid == server:
        return "test server"
    if cmdline.startswith(b"ray::MapWorker") or b"UnitWorker" in cmdline[:200]:
        return "workers"
    if cmdline.startswith(b"ray::"):
        return "other Ray workers"
    if b"gcs_server" in cmdline:
        return "gcs"
    if b"raylet" in cmdline.split(b"\0")[0]:
        return "raylet"
    if b"/ray/" in cmdline or b"ray." in cmdline.split(b"\0")[0]:
        return "Ray agents"
    return None


def stat(pid: int) -> tuple[int, float]:
    """(parent pid, user + system CPU seconds) of a process (its own: a raylet's would hold
    the workers it reaped)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def machine_busy() -> float:
    """CPU seconds every process of the machine spent so far (all cores)."""
    values = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / TICK  # less idle and iowait


class Sampler:
    """Every 0.2 s: peak RSS and CPU seconds of each process of the run, by kind."""

    def __init__(self, driver: int, server: int):
        self.driver, self.server = driver, server
        self.kinds: dict[int, str] = {}
        self.cpu: dict[int, float] = {}
        self.first: dict[int, float] = {}
        self.peaks: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self.busy = machine_busy()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.stop.wait(0.2):
            self.once()

    def once(self) -> None:
        parents: dict[int, int] = {}
        found: dict[int, tuple[bytes, float]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    pid = int(entry.name)
                    parents[pid], seconds = stat(pid)
                    found[pid] = (entry / "cmdline").read_bytes(), seconds
                except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
                    continue
        for pid, (cmdline, seconds) in found.items():
            # Ours: the server, the command and what descends from it (a local Ray's processes
            # too); not another session's Ray, which a name alone would count.
            line, ancestor = [pid], parents.get(pid)
            while ancestor and ancestor not in (self.driver, 1) and len(line) < 8:
                line.append(ancestor)
                ancestor = parents.get(ancestor)
            if pid != self.server and ancestor != self.driver and pid != self.driver:
                continue
            # Classified again each time: a Ray worker starts idle, then takes its actor
            # (an exiting process has no command line left: its kind stays).
            if cmdline or pid not in self.kinds:
                self.kinds[pid] = kind(pid, parents[pid], cmdline, self.driver, self.server) or "other"
                self.names[pid] = cmdline.split(b"\0")[0][:60].decode(errors="replace")
            self.first.setdefault(pid, seconds if pid == self.server else 0.0)
            self.cpu[pid] = seconds
            self.peaks[pid] = max(self.peaks.get(pid, 0), rss(pid))

    def finish(self) -> dict[str, float]:
        self.stop.set()
        self.thread.join()
        self.once()
        self.busy = machine_busy() - self.busy
        by_kind: dict[str, float] = {}
        for pid, seconds in self.cpu.items():
            by_kind[self.kinds[pid]] = by_kind.get(self.kinds[pid], 0.0) + seconds - self.first[pid]
        return by_kind

    def by_name(self) -> list[tuple[str, int, float]]:
        """(process name, how many, CPU seconds) of Ray's processes, most CPU first."""
        named: dict[str, list] = {}
        for pid, seconds in self.cpu.items():
            if self.kinds[pid] not in ("driver", "test server"):
                entry = named.setdefault(self.names[pid], [0, 0.0])
                entry[0] += 1
                entry[1] += seconds - self.first[pid]
        return sorted(((name, n, cpu) for name, (n, cpu) in named.items()), key=lambda item: -item[2])

    def of(self, name: str) -> dict[int, int]:
        return {pid: peak for pid, peak in self.peaks.items() if self.kinds[pid] == name}


def run(folder: Path, server: int, sequential: bool = False) -> tuple[float, str, Sampler, dict]:
    """`personaemp run`: wall, stderr, the sampler (peak RSS per process), CPU seconds by kind."""
    if sequential:  # the control: one process, infer-persona then gen-queries, as on Ray
        command = ["-c", "import personaemp.pipeline as p; p.chains = lambda o: False; "
                   "from personaemp.cli import entry; entry()"]  # fmt: skip
    else:
        command = ["-m", "personaemp"]
    started, launched = time.perf_counter(), time.time()
    child = subprocess.Popen(
        [sys.executable, *command, "run", "--config", str(folder / "personaemp.toml")],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    sampler = Sampler(child.pid, server)
    _, err = child.communicate()
    wall = time.perf_counter() - started
    cpu = sampler.finish()
    if child.returncode:
        sys.exit(f"run failed ({child.returncode}):\n{err[-3000:]}")
    sampler.launched = launched
    return wall, err, sampler, cpu


def shapes(personas: Path, in_flight: int, median: float, sigma: float) -> tuple[float, float, float]:
    """The overhead-free scheduler (run_bench.simulate) on this build's request chains: its
    makespan with the two stages chained (one process), stage after stage (Ray), and the
    bound Sum(latency) / in flight of its draws."""
    rows = [json.loads(line) for line in personas.open(encoding="utf-8")]
    first = [2 if row["eligible"] else 1 for row in rows]
    second = [3 for row in rows if row["eligible"] and row["traits"]]
    both = [a + (3 if row["eligible"] and row["traits"] else 0) for a, row in zip(first, rows, strict=True)]
    chained, total = simulate(both, in_flight, median, sigma)
    one, _ = simulate(first, in_flight, median, sigma)
    two, _ = simulate(second, in_flight, median, sigma, seed=2)
    return chained, one + two, total / in_flight


def main() -> None:
    options = parser(__doc__, in_flight=32, median=0.3, sigma=0.6)
    options.add_argument("--copies", type=int, default=3)
    options.add_argument("--workers", type=int, nargs="*", default=[2, 4])
    options.add_argument(
        "--control", action="store_true", help="also one process with the stages one after the other"
    )
    args = options.parse_args()
    print(f"machine: {machine()}; load average before: {os.getloadavg()[0]:.2f}")
    server, base_url = capable_server(args.median, args.sigma)
    runs: list[tuple[str, int | None, bool]] = [("one process", None, False)]
    if args.control:
        runs.append(("one process, stage after stage", None, True))
    runs += [(f"Ray, {w} workers x {args.in_flight // w}", w, False) for w in args.workers]
    try:
        for label, workers, sequential in runs:
            with tempfile.TemporaryDirectory() as name:
                folder = Path(name)
                prepare(folder, args.copies, base_url, args.in_flight)
                if workers:
                    with (folder / "personaemp.toml").open("a", encoding="utf-8") as toml:
                        toml.write(f'executor = "ray"\nworkers = {workers}\n')
                before = server_stats(base_url)
                wall, err, sampler, cpu = run(folder, server.pid, sequential)
                after = server_stats(base_url)
                personas = folder / "processed" / "personas.jsonl"
                kept = sum(1 for _ in personas.open(encoding="utf-8"))
                simulated = shapes(personas, args.in_flight, args.median, args.sigma)
            latencies = after["latencies"][len(before["latencies"]) :]
            begun = after["started"][len(before["started"]) :]
            first_request = min(begun) - sampler.launched
            last_reply = (
                sampler.launched + wall - max(b + lat for b, lat in zip(begun, latencies, strict=True))
            )
            bound = sum(latencies) / args.in_flight
            startups = [float(s) for s in re.findall(r"local Ray \(started in ([\d.]+) s\)", err)]
            timings = [line for line in err.splitlines() if line.startswith("run: ")]
            print(f"\n{label} (in flight {args.in_flight}): {kept} users, {len(latencies)} requests")
            print(f"  wall {wall:.1f} s, bound {bound:.1f} s -> {wall / bound:.3f}")
            print(
                f"  first request {first_request:.1f} s after launch, last reply {last_reply:.1f} s before "
                f"the end; in between {(wall - first_request - last_reply) / bound:.3f} x the bound"
            )
            chained, staged, drawn = simulated
            print(
                f"  no-overhead scheduler on these chains: chained {chained / drawn:.3f} x its bound, "
                f"stage after stage {staged / drawn:.3f} x"
            )
            if startups:
                print(
                    f"  ray.init {sum(startups):.1f} s -> after it {(wall - sum(startups)) / bound:.3f}; "
                    f"after the whole start-up (launch to first request) {(wall - first_request) / bound:.3f}"
                )
                workers_seen = sampler.of("workers")
                per_worker = ", ".join(f"{peak / 2**20:.0f}" for peak in sorted(workers_seen.values()))
                print(f"  peak RSS per worker (MB, {len(workers_seen)} worker processes): {per_worker}")
            print(f"  driver peak RSS {sampler.peaks.get(sampler.driver, 0) / 2**20:.0f} MB")
            ours = sum(cpu.values())
            parts = ", ".join(
                f"{name} {seconds:.1f}" for name, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])
            )
            print(
                f"  CPU s: {parts}; ours {ours:.1f}, the machine {sampler.busy:.1f} of {2 * wall:.1f} "
                f"(2 cores x wall); load average now {os.getloadavg()[0]:.2f}"
            )
            if workers:
                print(
                    "  Ray's processes: "
                    + "; ".join(f"{n} x {name} {cpu:.1f} s" for name, n, cpu in sampler.by_name())
                )
            print(f"  {timings[-1] if timings else ''}")
    finally:
        server.kill()


if __name__ == "__main__":
    main()
