"""Ctrl-C and kill -9 at random moments of `personaemp run`: what is left, and does a re-run
finish with the rows of a clean run?

The shipped sample copied --copies times (3: 144 users, 48 kept by the filter) goes through
`python -m personaemp run` (a session of its own, as a terminal's job) against
bench/capable_server.py in another process (log-normal latency, median --median s), whose
replies depend only on the request, so every build has the same rows. First a clean run
(its rows, its wall time T). Then:

(a) --trials signalled runs (a run that ends before its moment is not counted): SIGINT at a
    random moment in [0.2 s, 0.9 T] (seeded), every 3rd trial instead 0-0.15 s after split,
    stats or push starts (they are short: few uniform draws land there); to the process
    group as a terminal's Ctrl-C sends it (every 4th trial to the run alone).
    Printed per trial: the stage it was in, exit code, time from the signal to the exit,
    whether stderr ended with the one line "Interrupted — run it again to resume" and nothing
    else went wrong (no traceback, no error), processes of the run left, *.tmp files left.
    Then a re-run to the end: exit 0 and personas.jsonl / queries.jsonl equal to the clean
    run's (less created_at and input_hash, which differ between any two builds).
(b) --trials times kill -9 at a random moment (to the process group; every 4th to the run
    alone): the rows in personas.jsonl and queries.jsonl just before the kill must all be
    there after a re-run, which must end with the clean run's rows; no process of the
    killed run (its filter child, its forked workers) may outlive it.

No assertion on speed: figures are printed.

    .venv/bin/python bench/dataset/interrupt_bench.py [--trials 20] [--copies 3] [--seed 1]
        [--code CHECKOUT] [--sigint-ignored]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
from benchlib import capable_server  # noqa: E402
from conftest import SAMPLE_TASK1, copy_sample  # noqa: E402

MESSAGE = "Interrupted — run it again to resume"
ROWS = ("personas.jsonl", "queries.jsonl")
TAIL = ("── split ", "── stats ", "── push ")  # the rules that start them
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "COLUMNS": "100"}


class Run:
    ignored = False  # --sigint-ignored

    def __init__(self, config: Path) -> None:
        ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if self.ignored else None
        self.process = subprocess.Popen(
            [sys.executable, "-m", "personaemp", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True,
            preexec_fn=ignore, cwd=config.parent,  # (-m imports from the current folder first: --code)
        )  # fmt: skip
        self.started = time.monotonic()
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def stage(self) -> str:
        rules = [line.strip("─ ") for line in self.lines if line.startswith("──")]
        names = {"filter → infer-persona → gen-queries": "chain", "push (dry run)": "push"}
        return names.get(rules[-1], rules[-1]) if rules else "start-up"

    def wait(self) -> int:
        try:
            code = self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            code = self.process.wait()
        self.reader.join(10)
        return code


def exited(pid: int) -> bool:
    """Ended already (a zombie not yet reaped counts: a signal to it changes nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def in_session(sid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def left_in_session(sid: int, grace: float = 3.0) -> list[int]:
    deadline = time.monotonic() + grace  # a stopped child is reaped by init a moment later
    while (found := in_session(sid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


def content(value):
    """A row less what differs between two builds of the same rows: when it was written
    (created_at), and the input hash gen-queries takes over the persona row with it."""
    if isinstance(value, dict):
        return {k: content(v) for k, v in value.items() if k not in ("created_at", "input_hash")}
    if isinstance(value, list):
        return [content(v) for v in value]
    return value


def rows(processed: Path) -> dict[str, dict[str, str]]:
    """file -> user id -> the row's content (whole lines only: a torn tail is not a row)."""
    found: dict[str, dict[str, str]] = {}
    for name in ROWS:
        found[name] = {}
        try:
            data = (processed / name).read_bytes()
        except FileNotFoundError:
            continue
        for line in data.split(b"\n")[:-1]:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            found[name][row["user_id"]] = json.dumps(content(row), sort_keys=True)
    return found


def build(work: Path, config: Path, name: str) -> Path:
    processed = work / name
    text = config.read_text(encoding="utf-8").replace("@PROCESSED@", str(processed))
    (work / f"{name}.toml").write_text(text, encoding="utf-8")
    return work / f"{name}.toml"


def finish(config: Path) -> tuple[int, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "personaemp", "run", "--config", str(config)],
        env=ENV, capture_output=True, text=True, timeout=300, cwd=config.parent,
    )  # fmt: skip
    return done.returncode, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--trials", type=int, default=20, help="of each kind (SIGINT, kill -9)")
    parser.add_argument("--copies", type=int, default=3, help="copies of the 48-user sample")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--median", type=float, default=0.02, help="the endpoint's median latency, s")
    parser.add_argument(
        "--sigint-ignored", action="store_true",
        help="start the runs with SIGINT ignored, as `personaemp run &` in a script does",
    )  # fmt: skip
    parser.add_argument(
        "--code", type=Path, default=ROOT, help="the checkout whose personaemp runs (another, to compare)"
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    ENV["PYTHONPATH"] = str(args.code.resolve())
    Run.ignored = args.sigint_ignored
    started_so = " (runs started with SIGINT ignored)" if args.sigint_ignored else ""
    print(f"personaemp from {args.code.resolve()}{started_so}")
    server, base_url = capable_server(args.median, 0.5, quiet=True)  # quiet: the dropped runs' notes
    work = Path(tempfile.mkdtemp(prefix="interrupt_bench."))
    try:
        copy_sample(SAMPLE_TASK1, work / "input", args.copies, mark=True)
        template = work / "template.toml"
        template.write_text(
            f'[paths]\ninput = "{work / "input"}"\nprocessed = "@PROCESSED@"\n'
            f'[llm]\nbase_url = ["{base_url}"]\nmodel = "fake"\nconcurrency = 8\n',
            encoding="utf-8",
        )
        code, wall = finish(build(work, template, "clean"))
        clean = rows(work / "clean")
        assert code == 0, "the clean run failed"
        sizes = ", ".join(f"{name} {len(found)}" for name, found in clean.items())
        print(f"clean run: {wall:.1f} s, rows: {sizes}; signals drawn in [0.2, {0.9 * wall:.1f}] s")
        sigint(work, template, clean, wall, args.trials, rng)
        kill9(work, template, clean, wall, args.trials, rng)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


def sigint(work: Path, template: Path, clean, wall: float, trials: int, rng: random.Random) -> None:
    print(f"\n(a) SIGINT at a random moment, {trials} trials")
    print(" #  to      at(s)  stage    exit  exit after  message  left  tmp  resume  rows = clean")
    delays, results, tracebacks = [], [], 0
    for trial in range(3 * trials):
        if len(results) == trials:
            break
        group = trial % 4 != 3
        config = build(work, template, f"int{trial}")
        processed = work / f"int{trial}"
        at = rng.uniform(0.2, 0.9 * wall)
        later = rng.choice(TAIL) if trial % 3 == 2 else None  # the short stages after the chain
        pause = rng.uniform(0.0, 0.15)
        run = Run(config)
        if later is None:
            time.sleep(max(0.0, run.started + at - time.monotonic()))
        else:
            while not exited(run.process.pid) and not any(later in line for line in run.lines):
                time.sleep(0.002)
            time.sleep(pause)
            at = time.monotonic() - run.started
        if exited(run.process.pid):
            print(f"{trial:2}  {'group' if group else 'parent'}  {at:5.2f}  finished before the signal")
            continue
        stage = run.stage()
        sent = time.monotonic()
        (os.killpg if group else os.kill)(run.process.pid, signal.SIGINT)
        code = run.wait()
        after = time.monotonic() - sent
        text = "\n".join(run.lines)
        right = (
            bool(run.lines)
            and run.lines[-1] == MESSAGE
            and text.count(MESSAGE) == 1
            and not any(word in text for word in ("Traceback", "KeyboardInterrupt", "Error"))
        )
        traced = "Traceback" in text or "KeyboardInterrupt" in text
        tracebacks += traced
        left = left_in_session(run.process.pid)
        tmp = sorted(p.name for p in processed.rglob("*.tmp")) if processed.exists() else []
        again, _ = finish(config)
        same = rows(processed) == clean
        delays.append(after)
        results.append((code == 130, right, not left, not tmp, again == 0, same))
        print(
            f"{trial:2}  {'group ' if group else 'parent'}  {at:5.2f}  {stage:7}  {code:4}  {after:8.2f} s  "
            f"{'right' if right else 'WRONG':7}  {len(left):4}  {len(tmp):3}  {again:6}  {same}"
        )
        if not right:
            print("    stderr ends: " + " | ".join(run.lines[-4:]))
    if delays:
        ok = [all(result) for result in results]
        print(
            f"(a) {len(results)} interrupted runs: exit 130 {sum(r[0] for r in results)}, right message "
            f"{sum(r[1] for r in results)}, none left {sum(r[2] for r in results)}, no tmp "
            f"{sum(r[3] for r in results)}, resumed to exit 0 {sum(r[4] for r in results)}, rows = clean "
            f"{sum(r[5] for r in results)}; all of these {sum(ok)}/{len(ok)}"
        )
        print(f"    runs whose stderr shows a traceback: {tracebacks}")
        print(
            f"    signal to exit: median {statistics.median(delays):.2f} s, max {max(delays):.2f} s, "
            f"over 1 s: {sum(d > 1 for d in delays)}"
        )


def kill9(work: Path, template: Path, clean, wall: float, trials: int, rng: random.Random) -> None:
    print(f"\n(b) kill -9 at a random moment, {trials} trials")
    print(" #  to      at(s)  stage    rows before kill  lost  left  resume  rows = clean")
    totals = {"killed": 0, "lost": 0, "left": 0, "resumed": 0, "same": 0}
    for trial in range(3 * trials):
        if totals["killed"] == trials:
            break
        config = build(work, template, f"kill{trial}")
        processed = work / f"kill{trial}"
        at = rng.uniform(0.2, 0.9 * wall)
        run = Run(config)
        time.sleep(max(0.0, run.started + at - time.monotonic()))
        before = rows(processed)
        stage = run.stage()
        group = trial % 4 != 3
        to = "group " if group else "parent"
        if exited(run.process.pid):
            print(f"{trial:2}  {to}  {at:5.2f}  finished before the signal")
            continue
        (os.killpg if group else os.kill)(run.process.pid, signal.SIGKILL)
        run.wait()
        left = left_in_session(run.process.pid)
        again, _ = finish(config)
        after = rows(processed)
        lost = sum(
            1 for name, found in before.items() for uid, row in found.items() if after[name].get(uid) != row
        )
        same = after == clean
        totals["killed"] += 1
        totals["lost"] += lost
        totals["left"] += bool(left)
        totals["resumed"] += again == 0
        totals["same"] += same
        count = sum(len(found) for found in before.values())
        print(
            f"{trial:2}  {to}  {at:5.2f}  {stage:7}  {count:16}  {lost:4}  {len(left):4}  {again:6}  {same}"
        )
    print(
        f"(b) {totals['killed']} killed runs: finished rows lost {totals['lost']}, runs with a process "
        f"left {totals['left']}, resumed to exit 0 {totals['resumed']}, rows = clean {totals['same']}"
    )


if __name__ == "__main__":
    main()
