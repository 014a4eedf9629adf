"""The fake OpenAI server of the tests, answering like a capable model (bench/dataset/cost_bench.py's
replies, each drawn from its request so the order requests arrive in does not matter),
with a log-normal latency. Prints READY <base url> and serves until killed.

    .venv/bin/python bench/capable_server.py [--port 8765] [--latency-median 0.3] [--latency-sigma 0.6]

It is also the README's stand-in endpoint for trying the tour without a key: every command
runs and writes its files, but the text is scripted and every judge's score the same, so no
figure of quality it gives means anything.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fake_openai import FakeOpenAI, lognormal_latency, order_free_responder, serve_until_killed  # noqa: E402


def every_step(build):
    """The build steps answered as a capable model; the evaluation's (criteria and judges: a
    valid instance of their schema, the server's default) and a policy's free text too, so
    the README's tour runs against it end to end."""

    def answer(body: dict, number: int):
        if "response_format" not in body:  # respond: a policy's free text
            return "That sounds hard. You handled it with more care than you give yourself credit for."
        return build(body, number) or None  # {}: a step the build responder does not know

    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (READY names it)")
    parser.add_argument("--latency-median", type=float, default=0.0, help="seconds; 0 = no latency")
    parser.add_argument("--latency-sigma", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    latency = None
    if args.latency_median > 0:
        latency = lognormal_latency(args.latency_median, args.latency_sigma, random.Random(args.seed))
    # The responder detects languages: load the model now, not inside the first requests
    # (it held the first 32 for half a second, time that counted against the client).
    from personaemp.language import detect_language

    detect_language("A sentence long enough for the model to be asked about it.")
    server = FakeOpenAI(responder=every_step(order_free_responder()), latency=latency, seed=args.seed,
                        host=args.host, port=args.port)  # fmt: skip
    serve_until_killed(server)


if __name__ == "__main__":
    main()
