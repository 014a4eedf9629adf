"""Are the shipped sample's outputs byte-identical to another commit's? The guard of a
refactor that must change no output (issue 61): run it at the commit before, --save the
digests, then at the commit after with --against them.

`personaemp run --config personaemp.toml` (the shipped file: the demo's three users) goes
through the whole pipeline (filter, infer-persona, gen-queries, split, stats, push
--dry-run) in a child process against bench/capable_server.py (answers drawn from each
request, so the order requests arrive in does not matter), then runs again (every stage
current: it must write the same bytes); the same file without its `users` line builds all
sixteen kept users. Every file written is digested (sha256), after what differs between
two runs of one commit is normalised:
- the temporary folder and the checkout's path (in text files);
- timestamps (`*_at` keys, ISO dates), the server's port, durations and speeds
  (`seconds`, `wall_seconds`, `slowest`, `tokens_per_second`...);
- what is drawn from a timestamp or a file's times: `input_hash` (a digest of a row with
  its `created_at`), freshness fingerprints, and [size, mtime, ctime] stamps (a size too:
  a report that names the folder is as long as the folder's path);
- an LLM run report's `calls`: the slowest calls, which differ with the timing.
Lock files, the reply cache (SQLite) and the console log are not outputs.

    .venv/bin/python bench/dataset/identity_bench.py --save /tmp/before.json
    .venv/bin/python bench/dataset/identity_bench.py --against /tmp/before.json

Another commit's code: PYTHONPATH=/path/to/that/checkout (the child `run` imports it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from benchlib import capable_server  # noqa: E402

TEXT = (".json", ".jsonl", ".md", ".txt", ".csv", ".toml", ".xml", ".html")
NOT_OUTPUTS = ("cache.sqlite", "cache.sqlite-wal", "cache.sqlite-shm", "run.log")
VOLATILE_TEXT = "|".join(("[a-z_]*_at", "started", "finished", "when", "date"))
VOLATILE_NUMBER = "|".join((
    "seconds", "wall_seconds", "slowest", "tokens_per_second", "elapsed", "duration", "[a-z_]*_s",
    "[a-z_]*_seconds", "latency", "mean_latency", "p50", "p95", "p99",
))  # fmt: skip
RULES = (
    (re.compile(rf'"({VOLATILE_TEXT})": ?"[^"]*"'), r'"\1": "@TIME@"'),
    (re.compile(rf'"({VOLATILE_NUMBER})": ?-?[0-9][0-9.e+-]*'), r'"\1": "@DURATION@"'),
    (re.compile(r'"(input_hash|fingerprint)": ?"[0-9a-f]+"'), r'"\1": "@HASH@"'),
    (re.compile(r"\[\s*\d+,\s*\d{16,},\s*\d{16,}\s*\]"), '"@STAMP@"'),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)?"), "@TIME@"),
    (re.compile(r"(127\.0\.0\.1|localhost):\d+"), r"\1:@PORT@"),
)


def normalised(data: bytes, folder: Path, name: str = "") -> bytes:
    """`data` with what two runs of one commit write differently replaced by placeholders."""
    text = data.decode("utf-8")
    text = text.replace(str(folder), "@FOLDER@").replace(str(ROOT), "@REPO@")
    for pattern, placeholder in RULES:
        text = pattern.sub(placeholder, text)
    if name == "run_report.json":  # its slowest calls: which ones depends on the timing
        report = json.loads(text)
        for stage in report.get("stages", {}).values():
            if "calls" in stage:
                stage["calls"] = "@SLOWEST@"
        text = json.dumps(report, indent=2, ensure_ascii=False)
    return text.encode("utf-8")


def digests(folder: Path) -> dict[str, str]:
    """Every output file under `folder`: its path (relative) -> sha256 of its normalised bytes."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.name.endswith(".lock") or path.name in NOT_OUTPUTS:
            continue
        data = path.read_bytes()
        if path.suffix in TEXT:
            data = normalised(data, folder, path.name)
        found[path.relative_to(folder).as_posix()] = hashlib.sha256(data).hexdigest()
    return found


def run(folder: Path, config: str, env: dict[str, str], log: Path) -> None:
    """`personaemp run` in `folder` (the shipped sample linked in as data/raw)."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    if not (folder / "data" / "raw").exists():
        (folder / "data" / "raw").symlink_to(ROOT / "data" / "raw")
    (folder / "personaemp.toml").write_text(config, encoding="utf-8")
    with log.open("a", encoding="utf-8") as out:
        subprocess.run(
            [sys.executable, "-m", "personaemp", "run", "--config", "personaemp.toml"],
            cwd=folder, env=env, check=True, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def outputs(work: Path) -> dict[str, str]:
    """The three runs (demo, demo again, all sixteen users): their outputs' digests."""
    shipped = (ROOT / "personaemp.toml").read_text(encoding="utf-8")
    everyone = re.sub(r"(?m)^users = .*\n", "", shipped)
    server, base_url = capable_server(0.0, 0.0, quiet=True)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PERSONAEMP_", "OPENAI_", "HF_TOKEN"))
    }
    env.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY="test", PERSONAEMP_MODEL="fake")
    env.setdefault("HF_HUB_OFFLINE", "1")
    found: dict[str, str] = {}
    try:
        log = work / "run.log"
        for name, config in (("demo", shipped), ("demo-again", shipped), ("all-users", everyone)):
            folder = work / ("demo" if name == "demo-again" else name)
            run(folder, config, env, log)
            found.update({f"{name}/{path}": digest for path, digest in digests(folder).items()})
    except subprocess.CalledProcessError:
        sys.exit(f"run failed; its output:\n{(work / 'run.log').read_text()[-4000:]}")
    finally:
        server.kill()
        server.wait()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--save", type=Path, help="write the digests to this JSON file")
    parser.add_argument("--against", type=Path, help="compare with digests saved by --save")
    parser.add_argument("--keep", type=Path, help="build in this (new) folder and keep it")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True)
        found = outputs(args.keep.resolve())
    else:
        with tempfile.TemporaryDirectory() as name:
            found = outputs(Path(name).resolve())
    import personaemp

    print(f"personaemp from {Path(personaemp.__file__).parent}: {len(found)} output files digested")
    if args.save:
        args.save.write_text(json.dumps(found, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {args.save}")
    if args.against:
        expected = json.loads(args.against.read_text(encoding="utf-8"))
        changed = sorted(name for name in found.keys() & expected.keys() if found[name] != expected[name])
        gone, new = sorted(expected.keys() - found.keys()), sorted(found.keys() - expected.keys())
        for label, names in (("differ", changed), ("missing now", gone), ("new", new)):
            for name in names:
                print(f"{label}: {name}")
        same = len(found.keys() & expected.keys()) - len(changed)
        print(f"{same} of {len(expected)} files byte-identical (normalised) to {args.against}")
        if changed or gone or new:
            sys.exit(1)


if __name__ == "__main__":
    main()
