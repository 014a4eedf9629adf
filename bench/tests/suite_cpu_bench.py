"""Where `make test`'s time goes: the CPU the suite needs over the whole machine (issue 51).

    .venv/bin/python bench/tests/suite_cpu_bench.py           # pytest as `make test` runs it
    .venv/bin/python bench/tests/suite_cpu_bench.py --serial  # one process: each test's CPU

`time make test` misses most of it: Ray's daemons and workers, the embedded model's server
and the CLI subprocesses of a test are not children pytest waits for. So this reads the
machine's busy CPU (/proc/stat) every second instead. Run it on a quiet machine: whatever
else runs is counted too.

The default mode prints the wall time, the busy core-seconds, the share of the cores kept
busy in each 30 s window, and the floor: busy core-seconds over the cores, the least wall
time that work can take here however the tests are ordered. --serial runs the tests one
after the other in one process (about 9 minutes on 2 cores) and adds each test's busy CPU
(everything the machine did while it ran), summed by area: the embedded model's tests, the
Ray tests, the rest, and the longest tests. Linux only.
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

import pytest

WINDOW = 30  # seconds per line of the utilisation profile


def ticks() -> tuple[float, float]:
    """(busy, idle) core-seconds since boot, over every core."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / hz, idle / hz


# --- loaded into pytest with -p (--serial): each test's busy CPU (whole machine), wall and area --
_seen: dict[str, tuple[float, float, str]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = ticks()[0], time.monotonic()
    yield
    ray = "local_ray" in item.fixturenames or item.module.__name__.startswith("test_ray")
    area = "embedded model" if item.get_closest_marker("requires_model") else "Ray" if ray else "the rest"
    _seen[item.nodeid] = (ticks()[0] - cpu, time.monotonic() - wall, area)


def pytest_sessionfinish(session):
    Path(os.environ["SUITE_CPU_OUT"]).write_text(json.dumps(_seen))


class Sampler(threading.Thread):
    """(seconds since start, busy, idle) once a second, until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float, float]] = []
        self.started = time.monotonic()
        self.done = threading.Event()

    def run(self) -> None:
        while True:
            self.samples.append((time.monotonic() - self.started, *ticks()))
            if self.done.wait(1.0):
                self.samples.append((time.monotonic() - self.started, *ticks()))
                return


def profile(samples: list[tuple[float, float, float]]) -> str:
    """The share of the cores kept busy in each WINDOW."""
    shares, start = [], samples[0]
    for sample in samples[1:]:
        if sample[0] - start[0] >= WINDOW or sample is samples[-1]:
            busy, idle = sample[1] - start[1], sample[2] - start[2]
            shares.append(f"{start[0]:.0f}s {busy / max(busy + idle, 1e-9):.0%}")
            start = sample
    return " · ".join(shares)


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # here, not when pytest loads this
    from benchlib import ROOT, machine

    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--serial", action="store_true", help="one process, each test's CPU by area")
    parser.add_argument("--top", type=int, default=10, help="the longest tests to list (--serial)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    if not Path("/proc/stat").exists():
        print("needs Linux (/proc/stat)", file=sys.stderr)
        return 2
    print(machine())
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as scratch:
        command = [str(ROOT / ".venv" / "bin" / "pytest"), "-q", "-p", "no:randomly"]
        env = {**os.environ, "SUITE_CPU_OUT": str(Path(scratch) / "tests.json")}
        # As the Makefile: `make test` lets Python write bytecode. Inherited from a shell that
        # sets it (this sandbox's does), every worker re-read the tests' assertions and every
        # CLI child compiled them again (docs/development.md: how much).
        if env.pop("PYTHONDONTWRITEBYTECODE", None):
            print("PYTHONDONTWRITEBYTECODE unset, as `make test` does")
        if args.serial:
            here = str(Path(__file__).resolve().parent)  # this file is the plugin
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
            command += ["-p", "no:xdist", "-p", "suite_cpu_bench"]
        else:
            command += ["-n", "3", "--dist", "loadgroup"]  # as `make test`
        command += args.pytest_args
        print("$ pytest", " ".join(command[1:]))
        sampler = Sampler()
        sampler.start()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        sampler.done.set()
        sampler.join()
        last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(f"pytest: {last.strip('= ')} (exit {done.returncode})")
        samples = sampler.samples
        wall = samples[-1][0] - samples[0][0]
        busy = samples[-1][1] - samples[0][1]
        print(f"wall {wall:.0f} s · busy CPU {busy:.0f} core-s · {busy / wall / cores:.0%} of {cores} cores")
        print(f"floor on {cores} cores: {busy / cores:.0f} s (the busy CPU, perfectly spread)")
        print(f"busy share per {WINDOW} s: {profile(samples)}")
        if args.serial and Path(env["SUITE_CPU_OUT"]).exists():
            tests = json.loads(Path(env["SUITE_CPU_OUT"]).read_text())
            total = sum(cpu for cpu, _, _ in tests.values()) or 1e-9
            print(f"\n{'area':<16}{'tests':>7}{'core-s':>9}{'share':>8}")
            for area in ("embedded model", "Ray", "the rest"):
                mine = [cpu for cpu, _, where in tests.values() if where == area]
                print(f"{area:<16}{len(mine):>7}{sum(mine):>9.0f}{sum(mine) / total:>8.0%}")
            print(f"\nthe {args.top} tests with the most CPU (core-s, wall s):")
            for nodeid, (cpu, seconds, _) in sorted(tests.items(), key=lambda kv: -kv[1][0])[: args.top]:
                print(f"{cpu:7.1f} {seconds:6.1f}  {nodeid}")
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
