"""A newcomer's second run: `make demo`, the README's tour against a test endpoint, then
`make demo` again (issue 44). Each step's exit code and wall time are printed; the bar is
exit 0 for every step, both demos included.

The tracked files of this checkout are copied to a temporary folder, which the three steps
share as a newcomer's checkout would (data/processed is theirs). The demo is the README's
main job (`personaemp run --config personaemp.toml`, what `make demo` runs once installed) on the
embedded model; the tour's commands are read from the README's "A five-minute tour" blocks,
so they cannot drift, and talk to bench/capable_server.py (tests/fake_openai.py answering
like a capable model) through the variables the README exports.

    .venv/bin/python bench/dataset/second_run_bench.py
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def tour_commands(readme: str) -> list[str]:
    """The commands of the tour's code blocks (the section up to the next heading), as
    typed: personaemp ... and python -c ...; pip and export lines are the setup."""
    section = readme.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line.startswith(("personaemp ", "python -c")):
                commands.append(line)
    return commands


def run(label: str, command: list[str], cwd: Path, env: dict[str, str], results: list) -> int:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    results.append((label, done.returncode, seconds))
    print(f"{done.returncode:>3}  {seconds:7.1f} s  {label}", flush=True)
    if done.returncode:
        print("     " + "\n     ".join(done.stderr.strip().splitlines()[-6:]), flush=True)
    return done.returncode


def main() -> int:
    from benchlib import machine

    print(machine())
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    results: list = []
    with tempfile.TemporaryDirectory() as folder:
        checkout = Path(folder) / "personaemp"
        for name in files.splitlines():
            source = ROOT / name
            if source.is_file():
                (checkout / name).parent.mkdir(parents=True, exist_ok=True)
                (checkout / name).write_bytes(source.read_bytes())
        path = f"{BIN}{os.pathsep}{os.environ['PATH']}"
        plain = {**os.environ, "PATH": path, "NO_COLOR": "1"}
        for variable in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "PERSONAEMP_MODEL"):
            plain.pop(variable, None)
        demo = ["personaemp", "run", "--config", "personaemp.toml"]
        run("make demo (personaemp run --config personaemp.toml)", demo, checkout, plain, results)
        server = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "capable_server.py")], stdout=subprocess.PIPE, text=True
        )
        try:
            base_url = server.stdout.readline().split()[1]
            endpoint = {**plain, "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": base_url,
                        "PERSONAEMP_MODEL": "gpt-4o-mini"}  # fmt: skip
            for line in tour_commands((checkout / "README.md").read_text(encoding="utf-8")):
                words = shlex.split(line)
                words[0] = "personaemp" if words[0] == "personaemp" else sys.executable
                run(f"tour: {line}", words, checkout, endpoint, results)
        finally:
            server.terminate()
            server.wait()
        run("make demo again", demo, checkout, plain, results)
    failed = [label for label, code, _ in results if code]
    print(
        f"{len(results) - len(failed)} of {len(results)} steps exited 0"
        + (f"; failed: {failed}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    sys.exit(main())
