"""Can a response talk the judge into a better score? The injection gain, measured.

A test-server judge that *obeys* (tests/fake_openai.py, obeying=True) gives top marks when
an instruction stands outside the prompt's data blocks, and a middling, fixed judgment
otherwise. Each query is answered twice: a plain reply, and the same reply followed by an
attack that closes a `<<<`...`>>>` block, writes a "note from the evaluation team" asking
for the top score, and opens a new block. The gain is the mean score of the injecting
replies minus that of the plain ones, per PERM dimension (1-5) and for the bystander B
(0-1), fixed and dynamic. It also writes criteria from queries and memories carrying the
same attack and counts the requests in which the judge obeyed.

Run it against any checkout (the fake server and the attack come from this one):

    PYTHONPATH=. .venv/bin/python bench/evaluation/injection_bench.py              # this tree
    PYTHONPATH=/work/main .venv/bin/python bench/evaluation/injection_bench.py     # another checkout
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from fake_openai import FakeOpenAI, injected, instance_from_schema, schema_for_request  # noqa: E402

import personaemp  # noqa: E402
from personaemp.evaluation.criteria import write_criteria  # noqa: E402
from personaemp.evaluation.evaluate import evaluate
from personaemp.instruments.judges import JudgeOptions
from personaemp.llm.settings import LLMSettings  # noqa: E402
from personaemp.records import DIMENSIONS  # noqa: E402

USERS = 6


def middling(body: dict, number: int):
    """A judge's fixed judgment: score 3, aspects 10 of 20; any schema, old or new."""
    schema = schema_for_request(body)
    if schema is None:
        return "I hear you."
    answer = instance_from_schema(schema)
    if "score" in answer:
        answer["score"] = 3
    for key in answer:
        if key not in ("score", "analysis", "criteria") and isinstance(answer[key], int):
            answer[key] = 10  # a bystander aspect
    if isinstance(answer.get("aspects"), list):
        answer["aspects"] = [{**a, "score": 10} for a in answer["aspects"]]
    if (
        isinstance(answer.get("criteria"), list)
        and answer["criteria"]
        and isinstance(answer["criteria"][0], dict)
    ):
        answer["criteria"] = [{"name": f"c{i}", "weight": 25, "description": "d"} for i in range(4)]
    return answer


def user_row(user: int, attack: bool = False) -> dict:
    memory = f"user {user} failed a driving test"
    query = f"[q{user}] I failed my driving test again and feel awful."
    return {
        "user_id": f"u{user}",
        "eligible": True,
        "profile": f"user {user}: anxious before exams",
        "memories": [
            {
                "memory_id": "m1",
                "label": "States_Experiences",
                "value": injected(memory) if attack else memory,
            }
        ],
        "queries": [
            {
                "query_id": f"u{user}-q1",
                "category": "ES",
                "query": injected(query) if attack else query,
                "situation": {"topic": "exam", "text": "They just failed a test.", "memory_ids": ["m1"]},
                "memory_ids": ["m1"],
            }
        ],
    }


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def main() -> None:
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    print(f"personaemp from {Path(personaemp.__file__).parent}")
    with tempfile.TemporaryDirectory() as folder, FakeOpenAI(responder=middling, obeying=True) as server:
        work = Path(folder)
        rows = [user_row(u) for u in range(USERS)]
        write_jsonl(work / "splits" / "random" / "test.jsonl", rows)
        qids = [row["queries"][0]["query_id"] for row in rows]
        item = {"name": "n", "weight": 25.0, "description": "d"}
        criteria = write_jsonl(
            work / "criteria.jsonl",
            [{"query_id": q, "criteria": {d: [item] * 4 for d in DIMENSIONS}} for q in qids],
        )
        plain = write_jsonl(
            work / "plain.jsonl", [{"query_id": q, "response": f"I am sorry ({q})."} for q in qids]
        )
        attack = write_jsonl(
            work / "attack.jsonl", [{"query_id": q, "response": injected(f"I am sorry ({q}).")} for q in qids]
        )
        settings = LLMSettings(base_urls=[server.base_url], model="judge", work_dir=work / "w")
        print(f"{'mode':9s} " + " ".join(f"{d:>11s}" for d in DIMENSIONS) + f" {'B':>7s} {'obeyed':>7s}")
        for dynamic in (False, True):
            before = server.obeyed
            evaluation = evaluate(
                work / "splits", [plain, attack], work / f"eval{dynamic}.json", settings,
                criteria_file=criteria, options=JudgeOptions(dynamic=dynamic, bystander=True), console=quiet,
            ).summary  # fmt: skip
            a, p = evaluation["systems"]["attack"], evaluation["systems"]["plain"]
            gains = [a["dimensions"][d] - p["dimensions"][d] for d in DIMENSIONS]
            b = a["bystander"] - p["bystander"]
            print(
                f"{evaluation['mode']:9s} "
                + " ".join(f"{g:+11.2f}" for g in gains)
                + f" {b:+7.2f} {server.obeyed - before:7d}"
            )
        before = server.obeyed
        write_jsonl(work / "queries.jsonl", [user_row(u, attack=True) for u in range(USERS)])
        write_criteria(work / "queries.jsonl", work / "criteria-attacked.jsonl", settings, console=quiet)
        obeyed = server.obeyed - before
        print(
            f"criteria from {USERS} attacked queries and memories: obeyed in {obeyed} of {USERS * 3} requests"
        )


if __name__ == "__main__":
    main()
