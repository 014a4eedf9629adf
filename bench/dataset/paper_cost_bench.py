"""What an accepted query costs, personaemp beside the paper's pipeline, priced per provider.

The same 100 users go through both pipelines against the same logging OpenAI-compatible
server (tests/fake_openai.py, scripted as a capable model) once per provider in
bench/dataset/prices.toml. The server emulates that provider: DeepSeek refuses json_schema (so
the schema goes into the prompt text) and caches 64-token blocks; OpenAI takes
json_schema, bills the schema as the prompt's prefix and caches from 1,024 tokens in
128-token steps. Every billed token is counted by the server (characters / 4 of the
prompt as the cache sees it, schema included), and priced with the cached share at the
cached price.

- personaemp: filter, infer-persona and gen-queries (persona with the Big Five, situations with
  their messages, check), as `personaemp run` does them; accepted = the queries gen-queries keeps.
- paper: `prepare_dataset/query.py` of ZhengWwwq/PersonalizedEmpathy (persona,
  situations, one query per situation, one inspection per query, final_filter), run
  unchanged from a temporary folder on the same users; accepted = final_filter's count.
  Its code is fetched, never copied here (--paper names a checkout or a git directory;
  without it, it is cloned into ~/.cache/personaemp/).
- Both models answer alike: a deep persona 90% of the time, three moments (one per
  category), a check passing emotional support 95% and consistency 97% of the time.
- Users: the AlpsBench annotation packets beyond the 1,200 sessions of the shared sample
  the tests read (chunks 61 on of MissHsiaoo/AlpsBench_task1_3_annotation_data_repo),
  laid out as task1, through personaemp's filter; the first 100 kept users. --packets
  names a checkout or a git directory of that repository; without it, it is cloned into
  ~/.cache/personaemp/.

It also asks `--estimate` (nothing sent) for personaemp's run before making it and says
how far the estimate's prompt and cached tokens were from what the server counted.

    .venv/bin/python bench/dataset/paper_cost_bench.py [--users 100] [--look 20] [--packets DIR] [--paper DIR]

The figures are the server's, so the bench measures any checkout: with
`PYTHONPATH=/path/to/other/checkout` it measures that personaemp beside the same paper run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import tomllib
from collections import Counter
from pathlib import Path

from rich.console import Console

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(BENCH), str(ROOT / "bench" / "llm")]

from cost_bench import BLOCK, SENTENCES, trait_statements  # noqa: E402
from cost_bench import responder as capable  # noqa: E402
from fake_openai import FakeOpenAI, schema_from_messages  # noqa: E402
from prefix_cache_bench import layout_free  # noqa: E402

import personaemp  # noqa: E402
from personaemp.config import llm_settings, load_config  # noqa: E402
from personaemp.dataset.filter import filter_users  # noqa: E402
from personaemp.dataset.persona import infer_personas  # noqa: E402
from personaemp.dataset.queries import generate_queries  # noqa: E402
from personaemp.pipeline import run_pipeline  # noqa: E402
from personaemp.shared_options import LLMOptions  # noqa: E402

PRICES = BENCH / "prices.toml"
CACHE = Path.home() / ".cache" / "personaemp"
PACKETS_REPO = "https://github.com/MissHsiaoo/AlpsBench_task1_3_annotation_data_repo"
PAPER_REPO = "https://github.com/ZhengWwwq/PersonalizedEmpathy"
FIRST_UNSEEN_CHUNK = 61  # chunks 1-60 are the shared sample the tests read


# --- reading a repository: a checkout or a git directory ------------------------------------------


def _repository(given: Path | None, url: str, name: str) -> Path:
    if given is not None:
        return given
    target = CACHE / name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", url, str(target)], check=True)
    return target


def _files(repo: Path, under: str) -> dict[str, bytes]:
    """path -> bytes of every file under `under`, from a checkout or a git directory."""
    if (repo / under).is_dir():
        return {str(p.relative_to(repo)): p.read_bytes() for p in (repo / under).rglob("*") if p.is_file()}
    git = ["git", "--git-dir", str(repo)]
    names = subprocess.run(
        [*git, "ls-tree", "-r", "--name-only", "HEAD", under], check=True, capture_output=True, text=True
    ).stdout.split()
    batch = subprocess.run(
        [*git, "cat-file", "--batch"], input="".join(f"HEAD:{n}\n" for n in names).encode(),
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    found, at = {}, 0
    for name in names:
        header_end = batch.index(b"\n", at)
        header = batch[at:header_end].split()
        if header[-1] == b"missing":  # a snapshot may leave its largest files out
            at = header_end + 1
            continue
        size = int(header[2])
        found[name] = batch[header_end + 1 : header_end + 1 + size]
        at = header_end + 2 + size
    return found


def unseen_users(packets: Path, folder: Path) -> Path:
    """The packets of chunks FIRST_UNSEEN_CHUNK on, as a task1 folder (model_input.jsonl,
    reference_output.jsonl), the layout of the shared sample."""
    inputs, references = [], []
    for name, data in sorted(_files(packets, "chunks").items()):
        chunk = re.search(r"chunk_(\d+)/sess_\w+\.json$", name)
        if not chunk or int(chunk.group(1)) < FIRST_UNSEEN_CHUNK:
            continue
        packet = json.loads(data)
        task1 = packet.get("task1") or {}
        if not packet.get("dialogue") or "ground_truth_memories" not in task1:
            continue
        session, canonical = packet["session_id"], str(task1.get("canonical_id"))
        turns = [{"utterance_index": i, **turn} for i, turn in enumerate(packet["dialogue"])]
        head = {"benchmark_id": f"{session}__{canonical}", "task": "task1", "session_id": session}
        head["canonical_id"] = canonical
        inputs.append({
            **head, "stratum": task1.get("stratum"),
            "input": {"user_id": None, "line_index": int(canonical) if canonical.isdigit() else None,
                      "sessions": [{"session_id": session, "turns": turns}], "dialogue": packet["dialogue"]},
        })  # fmt: skip
        references.append({**head, "gold": {"memory_items": task1["ground_truth_memories"]}})
    out = folder / "task1"
    out.mkdir(parents=True)
    for file, rows in (("model_input.jsonl", inputs), ("reference_output.jsonl", references)):
        (out / file).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return out


# --- the paper's pipeline ---------------------------------------------------------------------------

PAPER_CATEGORIES = ("Emotional Support", "High-EQ Interaction", "Social Strategy")
OURS = {"Emotional Support": "ES", "High-EQ Interaction": "HEQ", "Social Strategy": "SS"}


def _fenced(value) -> str:
    return "```json\n" + json.dumps(value, ensure_ascii=False, indent=2) + "\n```"


def drawn_per_request(make, seed: int = 7):
    """`make(rng)`'s responder with each reply drawn from what its request is about, not from
    a shared sequence: personaemp's requests by their data blocks and the step (its schema's
    fields), the paper's by their text. The same user gets the same draws on both providers
    and in either checkout (prompt wording apart), whatever the order of the requests."""

    def answer(body: dict, number: int):
        text = "\n".join(m.get("content") or "" for m in body["messages"])
        fmt = body.get("response_format") or {}
        schema = (fmt.get("json_schema") or {}).get("schema") or schema_from_messages(body["messages"])
        blocks = [(name, content) for name, content in BLOCK.findall(text)]
        about = (
            [blocks, sorted((schema or {}).get("properties", {})), len(body["messages"])] if blocks else text
        )
        digest = hashlib.sha256(json.dumps(about, ensure_ascii=False).encode()).hexdigest()
        return make(random.Random(f"{seed}:{digest}"))(body, number)

    return answer


def paper_responder(rng: random.Random):
    """The paper's four requests answered as the capable model of cost_bench.py answers
    ours: the same odds, replies of the sizes the paper's formats ask for. Which request it
    is, is read from the format its prompt asks for."""

    def answer(body: dict, number: int):
        text = "\n".join(m.get("content") or "" for m in body["messages"])
        if '"is_deep_persona"' in text:
            deep = rng.random() < 0.9
            traits = [f"- {statement}" for statement in trait_statements(text, 3)]
            profile = "\n".join(["# Human Unique Persona", "## Core EQ Traits", *traits])
            return _fenced({
                "is_deep_persona": deep,
                "gate_reason": "The memories show recurring personal concerns and reactions to them.",
                "topics": ["family", "work stress", "self-doubt"],
                "persona_profile": profile if deep else "",
            })  # fmt: skip
        if '"situation_id"' in text and '"reasoning"' in text:
            category = next(
                (c for c in PAPER_CATEGORIES if f'"category": "{c}"' in text), PAPER_CATEGORIES[0]
            )
            sentence = SENTENCES["en"][OURS[category]].format(topic=f"#{rng.randint(0, 999)}")
            return _fenced({
                "category": category, "situation_id": "Sit_1", "query": sentence, "relevant_mem": [1],
                "reasoning": "The worry in the memories meets the moment the situation describes.",
            })  # fmt: skip
        if '"relevant_mem"' in text:
            return _fenced([
                {"id": f"Sit_{n}", "category": category, "topic": f"{OURS[category].lower()} topic",
                 "relevant_mem": [1],
                 "situation": f"{category} moment: after another tense evening the user replays a "
                 "conversation with someone close and wonders how to handle the next one."}
                for n, category in enumerate(PAPER_CATEGORIES, 1)
            ])  # fmt: skip
        if '"emotional_support"' in text:
            return _fenced({
                "emotional_support": rng.random() < 0.95, "logical_consistency": rng.random() < 0.97,
                "role_awareness": True, "language": "English", "reason": "Fits the moment and the user.",
            })  # fmt: skip
        return "{}"

    return answer


def paper_records(processed: Path) -> list[dict]:
    """The users personaemp's filter kept, in the paper's input shape (raw_filtered.json)."""
    records = []
    with (processed / "filtered.jsonl").open(encoding="utf-8") as rows:
        users = [json.loads(line) for line in rows]
    for user in users:
        user_id = user["user_id"]
        turns = [
            {"utterance_index": i, "role": t["role"], "text": t["text"]} for i, t in enumerate(user["turns"])
        ]
        memories = [
            {k: m.get(k) for k in ("memory_id", "label", "label_suggestion", "value", "evidence")}
            for m in user["memories"]
        ]
        record = {"line_index": user_id, "sessions": [{"session_id": user_id, "turns": turns}]}
        records.append({"source_file": f"{user_id}.json", "record": {**record, "memory_items": memories}})
    return records


def run_paper(paper: Path, records: list[dict], base_url: str, folder: Path) -> int:
    """query.py in full_pipeline mode on `records`; its accepted query count."""
    code = folder / "prepare_dataset"
    code.mkdir(parents=True)
    for name, data in _files(paper, "prepare_dataset").items():
        if name.endswith(".py"):
            (folder / name).write_bytes(data)
    data = code / "dataset" / "ei_trainset"
    data.mkdir(parents=True)
    (data / "raw_filtered.json").write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    env = {**os.environ, "DATA_API_KEYS": "bench-key", "DATA_BASE_URLS": base_url, "DATA_MODEL_NAME": "fake"}
    done = subprocess.run(
        [sys.executable, "query.py"], cwd=code, env=env, capture_output=True, text=True, check=False
    )
    found = re.search(r"filtered_queries=(\d+)", done.stdout)
    if done.returncode or not found:
        raise SystemExit(f"the paper's query.py failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return int(found.group(1))


# --- personaemp ---------------------------------------------------------------------------------------

FIGURES = ("prompt_tokens", "cached_tokens", "completion_tokens")
LOOK = 20  # users run before the estimate (its reply sizes and cache shares come from them)


def first_kept(source: Path, users: int, folder: Path) -> Path:
    """A task1 folder holding only the first `users` users personaemp's filter keeps: both
    pipelines get exactly these users."""
    kept_file = folder / "kept.jsonl"
    filter_users(str(source), kept_file, console=Console(quiet=True))
    with kept_file.open(encoding="utf-8") as rows:
        wanted = {json.loads(line)["user_id"] for _, line in zip(range(users), rows, strict=False)}
    out = folder / "users" / "task1"
    out.mkdir(parents=True)
    for name in ("model_input.jsonl", "reference_output.jsonl"):
        lines = (source / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (out / name).write_text(
            "".join(line for line in lines if json.loads(line)["benchmark_id"] in wanted), "utf-8"
        )
    return out


def run_ours(source: Path, work: Path, server, rule: str, look: int, window: int = 0) -> dict:
    """`personaemp run`'s LLM stages on every user of `source`: a quick look at `look` users
    (the `window`-th run of `look` users in the filter's order), then `--estimate` for the rest
    (nothing sent), then the run. The figures the server counted, and the estimate beside what
    the server counted for the same requests."""
    quiet = Console(quiet=True)
    processed = work / "processed"
    processed.mkdir(parents=True)
    config = work / "p.toml"
    config.write_text(
        f'[paths]\ninput = "{source}"\nprocessed = "{processed}"\n'
        f'[llm]\nbase_url = ["{server.base_url}"]\nmodel = "fake"\nconcurrency = 1\n'
        + (f'cache_rule = "{rule}"\n' if "cache_rule" in LLMOptions.model_fields else "")  # main before it
        + "[split]\nood = false\n",
        encoding="utf-8",
    )
    options = load_config(config)
    settings = llm_settings(options.llm)
    filter_users(str(source), processed / "filtered.jsonl", console=quiet)
    with (processed / "filtered.jsonl").open(encoding="utf-8") as rows:
        order = [json.loads(line)["user_id"] for line in rows]
    looked = order[window * look : (window + 1) * look]
    infer_personas(
        processed / "filtered.jsonl", processed / "personas.jsonl", settings, users=looked, console=quiet
    )
    generate_queries(processed / "personas.jsonl", processed / "queries.jsonl", settings, console=quiet)
    estimating = options.model_copy(update={"llm": options.llm.model_copy(update={"estimate": True})})
    before = (server.count, server.prompt_tokens, server.cached_tokens, server.completion_tokens)
    parts = [
        r.estimate for r in run_pipeline(estimating, quiet).reports.values() if getattr(r, "estimate", None)
    ]
    assert server.count == before[0], "the estimate sent a request"
    run_pipeline(options, quiet)
    sent = (
        server.prompt_tokens - before[1],
        server.cached_tokens - before[2],
        server.completion_tokens - before[3],
    )
    rows = [json.loads(line) for line in (processed / "queries.jsonl").read_text("utf-8").splitlines()]
    failed = Counter(name for row in rows for q in row["rejected_queries"] for name in q["checks"]["reasons"])
    return {
        "requests": server.count, "prompt_tokens": server.prompt_tokens,
        "cached_tokens": server.cached_tokens, "completion_tokens": server.completion_tokens,
        "accepted": sum(len(row["queries"]) for row in rows),
        "generated": sum(len(row["queries"]) + len(row["rejected_queries"]) for row in rows),
        "failed_checks": dict(sorted(failed.items())),
        "estimate": {
            "prompt_tokens": sum(p["prompt_tokens"] for p in parts),
            "cached_tokens": sum(p["cached_tokens"] for p in parts),
            "completion_tokens": sum(p["completion_tokens"] for p in parts),
        },
        "counted_after_estimate": dict(zip(FIGURES, sent, strict=True)),
        "steps": by_step(server),
        "floor": floor(server, rule),
    }  # fmt: skip


def step_of(body: dict) -> str:
    """Which step a request is, by its reply schema's fields."""
    fmt = body.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("schema") or schema_from_messages(body["messages"]) or {}
    return "+".join(sorted(schema.get("properties", {}))) or "?"


def by_step(server) -> dict[str, Counter]:
    """The server's figures per step: requests and the tokens it billed."""
    steps: dict[str, Counter] = {}
    for record in server.chat_requests:
        if record.usage is None:
            continue
        usage = record.usage
        cached = usage.get("prompt_cache_hit_tokens") or (usage.get("prompt_tokens_details") or {}).get(
            "cached_tokens", 0
        )
        figures = steps.setdefault(step_of(record.body), Counter())
        figures.update(
            requests=1, prompt_tokens=usage["prompt_tokens"], cached_tokens=cached,
            completion_tokens=usage["completion_tokens"],
        )  # fmt: skip
    return steps


def floor(server, rule: str) -> dict:
    """What no layout of these requests can be billed under, with the replies as they are:
    every distinct data block (a user's memories, turns, profile, messages) read once at the
    full price, each request's own instructions and schema (its text outside the data blocks)
    at the cached price (OpenAI: cached only from 1,024 tokens, else at the full price, and
    never under 1,024 tokens' worth once cached), and the completions as counted."""
    blocks, static, cached = set(), 0.0, 0.0
    for record in server.chat_requests:
        if record.usage is None:
            continue
        fmt = record.body.get("response_format") or {}
        schema = json.dumps(fmt["json_schema"]) if fmt.get("type") == "json_schema" else ""
        text = "".join(m.get("content") or "" for m in record.body["messages"])
        blocks.update(BLOCK.findall(text))
        own = (len(schema) + len(BLOCK.sub("", text))) / 4
        if rule == "openai" and own < 1024:
            static += min(own, 1024 / 2)  # full price, or 1,024 cached at half: whichever is less
        else:
            cached += own
    return {
        "prompt_tokens": int(sum(len(content) for _, content in blocks) / 4 + static + cached),
        "cached_tokens": int(cached),
        "completion_tokens": server.completion_tokens,
    }


# --- the table ------------------------------------------------------------------------------------------


def dollars(figures: dict, price: dict) -> float:
    missed = figures["prompt_tokens"] - figures["cached_tokens"]
    cached, out = figures["cached_tokens"], figures["completion_tokens"]
    return (missed * price["input"] + cached * price["cached"] + out * price["output"]) / 1e6


def measure(provider: dict, source: Path, paper: Path, look: int) -> dict:
    rule = provider["cache"]
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        with FakeOpenAI(
            responder=layout_free(drawn_per_request(capable)), profile=rule, prefix_cache=rule, reasoning=""
        ) as server:
            results["personaemp"] = run_ours(source, work / "ours", server, rule, look)
        with FakeOpenAI(
            responder=drawn_per_request(paper_responder), profile=rule, prefix_cache=rule, reasoning=""
        ) as server:
            records = paper_records(work / "ours" / "processed")
            accepted = run_paper(paper, records, server.base_url, work / "paper")
            results["paper"] = {
                "requests": server.count, "prompt_tokens": server.prompt_tokens,
                "cached_tokens": server.cached_tokens, "completion_tokens": server.completion_tokens,
                "accepted": accepted,
            }  # fmt: skip
    return results


def estimate_looks(source: Path, provider: dict, look: int, looks: int) -> list[dict]:
    """--estimate's error against the server for each of `looks` disjoint looks of `look`
    users (a fresh work folder and server each): its prompt, cached and completion tokens
    for the other users, minus what the server counted for them, over what it counted."""
    rule, errors = provider["cache"], []
    for window in range(looks):
        with (
            tempfile.TemporaryDirectory() as folder,
            FakeOpenAI(
                responder=layout_free(drawn_per_request(capable)),
                profile=rule,
                prefix_cache=rule,
                reasoning="",
            ) as server,
        ):
            ours = run_ours(source, Path(folder) / "ours", server, rule, look, window)
        guess, counted = ours["estimate"], ours["counted_after_estimate"]
        errors.append({name: (guess[name] - counted[name]) / max(counted[name], 1) for name in FIGURES})
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--look", type=int, default=LOOK, help="users run before the estimate")
    parser.add_argument(
        "--packets", type=Path, help="AlpsBench_task1_3_annotation_data_repo: checkout or git dir"
    )
    parser.add_argument("--paper", type=Path, help="ZhengWwwq/PersonalizedEmpathy: checkout or git dir")
    parser.add_argument(
        "--looks", type=int, default=1,
        help="run --estimate after this many disjoint looks (users 0-19, 20-39, ...): each one's error",
    )  # fmt: skip
    args = parser.parse_args()
    prices = tomllib.loads(PRICES.read_text(encoding="utf-8"))
    packets = _repository(args.packets, PACKETS_REPO, "alpsbench-packets")
    paper = _repository(args.paper, PAPER_REPO, "PersonalizedEmpathy")
    print(f"personaemp from {Path(personaemp.__file__).parent.parent}; prices from {PRICES.name}")
    rows, everything = [], {}
    with tempfile.TemporaryDirectory() as folder:
        source = first_kept(unseen_users(packets, Path(folder)), args.users, Path(folder))
        for key, provider in prices.items():
            found = everything[key] = measure(provider, source, paper, args.look)
            per = {}
            for side, figures in found.items():
                cost = dollars(figures, provider)
                per[side] = cost / max(figures["accepted"], 1) * 1000
                share = figures["cached_tokens"] / max(figures["prompt_tokens"], 1)
                print(
                    f"{provider['name']:18s} {side:10s} {figures['requests']:5d} requests · "
                    f"{figures['prompt_tokens']:9,} prompt tokens ({share:.0%} cached) · "
                    f"{figures['completion_tokens']:7,} completion · {figures['accepted']} accepted · "
                    f"${cost:.4f}"
                )
            ours = found["personaemp"]
            for step, figures in sorted(ours["steps"].items(), key=lambda kv: -dollars(kv[1], provider)):
                share = figures["cached_tokens"] / max(figures["prompt_tokens"], 1)
                print(
                    f"{'':18s}   {step[:40]:40s} {figures['requests']:5d} requests · "
                    f"{figures['prompt_tokens']:9,} prompt ({share:.0%} cached) · "
                    f"{figures['completion_tokens']:7,} completion · ${dollars(figures, provider):.4f}"
                )
            print(
                f"{'':18s} personaemp: {ours['generated']} generated, failed checks {ours['failed_checks']}"
            )
            least = dollars(ours["floor"], provider)
            paper_each = dollars(found["paper"], provider) / found["paper"]["accepted"]
            replies = ours["completion_tokens"] * provider["output"] / 1e6
            print(
                f"{'':18s} floor (each data block once at full price, instructions cached, these "
                f"replies): ${least:.4f} = {least / ours['accepted'] * 1000:.3f} per 1,000 accepted = "
                f"{least / ours['accepted'] / paper_each:.2f}× the paper's; the replies alone "
                f"{replies / ours['accepted'] / paper_each:.2f}×"
            )
            guess, counted = ours["estimate"], ours["counted_after_estimate"]
            print(
                f"{'':18s} --estimate ({provider['cache']} rule) for the {args.users - args.look} users "
                f"after a look at {args.look}: " + " · ".join(
                    f"{name.replace('_tokens', '')} {guess[name]:,} vs {counted[name]:,} counted "
                    f"({(guess[name] - counted[name]) / max(counted[name], 1):+.1%})"
                    for name in ("prompt_tokens", "cached_tokens", "completion_tokens")
                )
            )  # fmt: skip
            rows.append((provider, per))
            if args.looks > 1:
                errors = estimate_looks(source, provider, args.look, args.looks)
                for name in FIGURES:
                    each = [e[name] for e in errors]
                    print(
                        f"{'':18s} --estimate {name.replace('_tokens', '')} error over {len(each)} looks of "
                        f"{args.look} users: " + ", ".join(f"{e:+.1%}" for e in each)
                        + f" · mean {sum(each) / len(each):+.1%}"
                    )  # fmt: skip
    print()
    print(f"n = {args.users} users (the same for both), accepted queries as each pipeline's gates say")
    print("| provider, list price ($/1M: input / cached input / output) | paper, $ per 1,000 accepted "
          "queries | personaemp | ratio |")  # fmt: skip
    print("|---|---:|---:|---:|")
    for provider, per in rows:
        price = f"{provider['input']:g} / {provider['cached']:g} / {provider['output']:g}"
        print(
            f"| {provider['name']} ({price}), {provider['cache']} cache rule | {per['paper']:.3f} | "
            f"{per['personaemp']:.3f} | {per['personaemp'] / per['paper']:.2f}× |"
        )
    print(json.dumps(everything))


if __name__ == "__main__":
    main()
