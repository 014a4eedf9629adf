"""What dialogues cost and how fast they run: 100 dialogues at --concurrency 32 against the test
server (a scripted simulated user that leaves after the third reply, a scripted supporter, a
criteria writer and session judge), each request slowed by a log-normal latency.

Prints requests and tokens (as the server reports them) per dialogue and per turn of
gen-dialogues, per session score of `evaluate --dialogues` (fixed criteria, then per turn too)
and per turn of the training Interaction; and gen-dialogues' wall time against its bound:
the turns of one dialogue are sequential, so the bound is the larger of the summed latency
over 32 slots and the longest dialogue's own summed latency (target: wall <= 1.2x bound).

    .venv/bin/python bench/dataset/dialogues_bench.py [--dialogues 100] [--concurrency 32] [--median 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]
sys.path[1:1] = [str(ROOT / "tests" / tier) for tier in ("unit", "integration", "e2e")]

from benchlib import parser  # noqa: E402
from fake_openai import FakeOpenAI, serve_until_killed  # noqa: E402
from test_dialogues import text_of, user_row, write_queries  # noqa: E402
from test_sessions import Judged, session_step  # noqa: E402

from personaemp.dataset.dialogues import DialogueOptions, generate_dialogues  # noqa: E402
from personaemp.evaluation.dialogues import evaluate_dialogues  # noqa: E402
from personaemp.llm.settings import LLMSettings  # noqa: E402
from personaemp.training.export import write_export  # noqa: E402
from personaemp.training.interaction import SimulatedUserInteraction  # noqa: E402

WARD = re.compile(r"ward (u\d+)")  # each user's id sits in a memory: who a request is about


class Slow(Judged):
    """Judged's replies after a log-normal latency, summed per dialogue (user)."""

    def __init__(self, median: float, sigma: float, seed: int = 1):
        super().__init__(score=4.0)
        self.rng = random.Random(seed)
        self.median, self.sigma = median, sigma
        self.per_user: dict[str, float] = defaultdict(float)
        self.steps: Counter = Counter()
        self.guard = threading.Lock()

    def __call__(self, body: dict, number: int):
        with self.guard:
            latency = self.median * self.rng.lognormvariate(0, self.sigma)
            found = WARD.search(text_of(body))
            self.per_user[found.group(1) if found else "?"] += latency
            self.steps[session_step(body)] += 1
        time.sleep(latency)
        return super().__call__(body, number)


class Logged(Slow):
    """Slow, each request's dialogue and latency appended to a file (the server's own process)."""

    def __init__(self, median: float, sigma: float, log: Path):
        super().__init__(median, sigma)
        self.log = log.open("a", encoding="utf-8")

    def __call__(self, body: dict, number: int):
        with self.guard:
            latency = self.median * self.rng.lognormvariate(0, self.sigma)
            found = WARD.search(text_of(body))
            self.log.write(f"{found.group(1) if found else '?'} {latency}\n")
            self.log.flush()
        time.sleep(latency)
        return Judged.__call__(self, body, number)


def serve(median: float, sigma: float, log: Path) -> None:
    """The test server in a process of its own (its threads hold no lock the client needs)."""
    server = FakeOpenAI(responder=Logged(median, sigma, log))
    serve_until_killed(server)


def greedy(chains: list[list[float]], slots: int) -> float:
    """The makespan of a scheduler with no overhead: a free slot takes the next call of a
    dialogue whose previous call is done, else starts the next dialogue."""
    waiting = [list(chain) for chain in reversed(chains)]
    ready: list[list[float]] = []
    running: list[tuple[float, int, list[float]]] = []
    now = 0.0
    while waiting or ready or running:
        while len(running) < slots and (ready or waiting):
            chain = ready.pop() if ready else waiting.pop()
            heapq.heappush(running, (now + chain[0], id(chain), chain[1:]))
        now, _, left = heapq.heappop(running)
        if left:
            ready.append(left)
    return now


def used(totals: dict) -> int:
    """Prompt and completion tokens, as the server reported them."""
    return totals.get("prompt_tokens", 0) + totals.get("completion_tokens", 0)


def main() -> None:
    options = parser(__doc__, median=0.1, sigma=0.5)
    options.add_argument("--dialogues", type=int, default=100)
    options.add_argument("--concurrency", type=int, default=32)
    options.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # the server's process
    args = options.parse_args()
    if args.serve:
        serve(args.median, args.sigma, args.serve)
        return
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        splits = folder / "splits"
        (splits / "random").mkdir(parents=True)
        users = [user_row(f"u{n}") for n in range(args.dialogues)]
        test = write_queries(splits / "random" / "test.jsonl", users)
        write_queries(splits / "random" / "train.jsonl", users[:1])
        dialogues = folder / "dialogues.jsonl"

        log = folder / "latencies.txt"
        process = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(log), "--median", str(args.median),
             "--sigma", str(args.sigma)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            base_url = process.stdout.readline().split()[1]
            from personaemp.language import detect_language

            detect_language(
                "A sentence long enough for the model to be asked about it."
            )  # loaded before timing
            settings = LLMSettings(base_urls=[base_url], model="fake", work_dir=folder / "w",
                                   api_key="sk-test", concurrency=args.concurrency)  # fmt: skip
            started = time.perf_counter()
            report = generate_dialogues(
                test, dialogues, settings, options=DialogueOptions(max_turns=6)
            ).report
            wall = time.perf_counter() - started
        finally:
            process.terminate()
            process.wait()
        assert report.outcome.done == args.dialogues, report.outcome.failures_by_kind
        chains: dict[str, list[float]] = defaultdict(list)
        for line in log.read_text(encoding="utf-8").splitlines():
            user, latency = line.split()
            chains[user].append(float(latency))
        generated = sum(len(chain) for chain in chains.values())
        totals = report.totals
        gen_tokens = used(totals)
        turns = args.dialogues * 3  # the scripted user leaves after the third reply
        total = sum(sum(chain) for chain in chains.values())
        longest = max(sum(chain) for chain in chains.values())
        bound = max(total / args.concurrency, longest)
        scheduled = greedy(list(chains.values()), args.concurrency)
        print(f"gen-dialogues: {args.dialogues} dialogues, {turns} supporter turns, {generated} requests")
        print(
            f"  per dialogue: {generated / args.dialogues:.1f} requests, "
            f"{gen_tokens / args.dialogues:.0f} tokens"
        )
        print(f"  per turn:     {(generated - args.dialogues) / turns:.1f} requests (supporter, user, "
              "check), "
              f"{gen_tokens / turns:.0f} tokens")  # fmt: skip
        print(f"  wall {wall:.2f} s at --concurrency {args.concurrency}; bound {bound:.2f} s (summed latency "
              f"{total:.1f} s / {args.concurrency}; longest dialogue {longest:.2f} s) -> ratio "
              f"{wall / bound:.3f} (target <= 1.2)")  # fmt: skip
        print(f"  a scheduler with no overhead on the same latencies: {scheduled:.2f} s -> ratio "
              f"{wall / scheduled:.3f}")  # fmt: skip

        for per_turn in (False, True):
            judge = Judged(score=4.0)
            with FakeOpenAI(responder=judge) as server:
                work = folder / f"e{per_turn}"
                settings = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=work,
                                       api_key="sk-test", concurrency=args.concurrency)  # fmt: skip
                judged, _ = evaluate_dialogues(
                    splits, [dialogues], folder / f"eval{per_turn}.json", settings, per_turn=per_turn
                )
                steps = Counter(session_step(r.body) for r in server.chat_requests)
                print(f"evaluate --dialogues{' --per-turn' if per_turn else ''}: per session score "
                      f"{server.count / args.dialogues:.1f} requests ({dict(steps)} over {args.dialogues}), "
                      f"{used(judged.totals) / args.dialogues:.0f} tokens")  # fmt: skip

        output = folder / "rollouts.parquet"
        write_export(splits, output, format="verl", part="test", dialogues=True)
        import pyarrow.parquet as pq

        kwargs = pq.read_table(output).to_pylist()[0]["extra_info"]["interaction_kwargs"]
        for reward in ("emotion", "peregrm"):
            with FakeOpenAI(responder=Judged(score=4.0)) as server:
                settings = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=folder / reward,
                                       api_key="sk-test")  # fmt: skip
                agent = SimulatedUserInteraction(
                    {"max_turns": 3, "session_reward": reward}, settings=settings
                )

                async def session(agent=agent) -> float:
                    instance = await agent.start_interaction("r1", **kwargs)
                    messages = [{"role": "user", "content": kwargs["user"]["query"]}]
                    for n in range(3):
                        messages.append({"role": "assistant", "content": f"I hear you ({n})."})
                        done, text, score, _ = await agent.generate_response(instance, messages)
                        messages.append({"role": "user", "content": text})
                    return score

                score = asyncio.run(session())
                judge = " + 3 judge" if reward == "peregrm" else ""
                print(f"Interaction ({reward}): {server.count} requests for a 3-turn session "
                      f"(1 hidden need + 2 a turn + 1 safety judge a turn{judge}), "
                      f"{used(agent.service.engine.accounting.totals().__dict__)} tokens, "
                      f"session reward {score:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
