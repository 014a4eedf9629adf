"""Two supporters' dialogues of the same six queries (real gen-dialogues rows, valid records),
a failures file beside one, and labels written through the review page's own checks: the
fixture of the dialogue review, its agreement figures and the dialogues card.

The figures of the labels, worked out by hand:

- final emotions, policy-a: 70 55 60 40 65 70; policy-b: 50 60 45 35 45 20;
- ana's PERM scores (the same on the three dimensions), a: 4 4 5 2 4 5; b: 3 3 2 2 3 1;
- per query, a vs b: q1 agree, q2 disagree (emotion b > a, people a > b), q3 agree,
  q4 tie (people 2 = 2), q5 agree, q6 agree: 4 of 5 pairs agree, 1 tie.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import read_jsonl, write_jsonl

from personaemp.instruments.simulator_rules import RULES  # each ran on every fixture turn
from personaemp.review.page import LabelFile, make_event

FINAL = {"policy-a": [70, 55, 60, 40, 65, 70], "policy-b": [50, 60, 45, 35, 45, 20]}
RATING = {"policy-a": [4, 4, 5, 2, 4, 5], "policy-b": [3, 3, 2, 2, 3, 1]}
LANGUAGES = ["en", "en", "zh", "en", "zh", "en"]
# (system, query number, simulated turn number) where the in_character check failed a reply,
# which was asked again: the turn keeps the rejected reply (its text); the kept reply passed, as
# every kept reply gen-dialogues writes does
OUT_OF_CHARACTER = {("policy-a", 2, 1), ("policy-b", 3, 2), ("policy-b", 6, 3)}
UNCHECKED = "policy-b"  # its run had --no-character-check on q5: no in_character, no grounded


def steps(final: int, turns: int = 3, start: int = 40) -> list[int]:
    """The emotion after each simulated turn, at most 10 a step, ending at `final`."""
    part = round((final - start) / turns)
    changes = [part] * (turns - 1) + [final - start - part * (turns - 1)]
    out, now = [], start
    for change in changes:
        now += change
        out.append(now)
    return out


def dialogue(system: str, n: int, query: str | None = None, user: str | None = None) -> dict:
    """policy-a's or policy-b's dialogue of query n (`query`, `user`: another query's ids)."""
    query = query or f"u{n}-q1"
    emotions = steps(FINAL[system][n - 1])
    turns = [{"role": "user", "text": f"Opening message of query {n}.", "emotion": 40}]
    before = 40
    for k, emotion in enumerate(emotions, 1):
        checks = dict.fromkeys(RULES, True)
        if not (system == UNCHECKED and n == 5):
            checks.update(in_character=True, grounded=True)
        rejected = []
        if (system, n, k) in OUT_OF_CHARACTER:
            text = f"As an assistant, I suggest step {k}."
            rejected = [
                {"in_character": "speaks like an assistant", "text": text, "thought": "I should advise."}
            ]
        if k == 2 and n in (1, 4):
            rejected = [{"no_emotion_number": "states its emotion as a number or score: '6/10'",
                         "text": "I'm at 6/10 now.", "thought": "I feel a bit better."}]  # fmt: skip
        if k == 1 and n == 3 and system == "policy-a":
            rejected = [{"in_character": "speaks like an assistant"}]  # a row from before text was kept
        turns += [
            {"role": "assistant", "text": f"{system} reply {k} to query {n}: that sounds hard; say more."},
            {"role": "user", "text": f"Reply {k} of user {n} to {system}.", "emotion": emotion,
             "change": emotion - before, "reason": f"reason {k}", "need_met": k == 3 and emotion >= 60,
             "thought": f"thought {k}", "checks": checks, "rejected": rejected},
        ]  # fmt: skip
        before = emotion
    met = 3 if emotions[-1] >= 60 else None
    return {
        "dialogue_id": f"{query}-d1", "user_id": user or f"u{n}", "query_id": query, "category": "ES",
        "language": LANGUAGES[n - 1], "hidden_need": f"to be heard about thing {n}",
        "initial_emotion": 40, "final_emotion": emotions[-1], "need_met_at_turn": met,
        "ended_by": "max_turns", "supporter_model": system, "simulator_model": "sim-model",
        "memory_ids": ["m1"], "background_memory_ids": [], "context": "memory", "turns": turns,
        "provenance": {"model": "sim-model", "endpoint_kind": "openai", "prompts": {},
                       "created_at": "2026-11-28T00:00:00Z"},
    }  # fmt: skip


def build_queries(sample_build: Path, tmp_path: Path) -> tuple[Path, list[tuple[str, str]]]:
    """A copy of the sample build under tmp_path/processed: its splits folder and the (query id,
    user id) of each query of its random test split, in file order."""
    shutil.copytree(sample_build, tmp_path / "processed")
    splits = tmp_path / "processed" / "splits"
    rows = read_jsonl(splits / "random" / "test.jsonl")
    return splits, [(q["query_id"], row["user_id"]) for row in rows for q in row["queries"]]


def write_dialogues(folder: Path) -> list[Path]:
    """folder/policy-a/policy-a.jsonl and folder/policy-b/policy-b.jsonl: each supporter's
    gen-dialogues output in a folder of its own, as two runs write them (each with its own
    failures file beside it)."""
    paths = []
    for system in FINAL:
        run = folder / system
        run.mkdir(parents=True, exist_ok=True)
        paths.append(write_jsonl(run / f"{system}.jsonl", [dialogue(system, n) for n in range(1, 7)]))
    return paths


def agreement_args(paths: list[Path], resamples: int) -> list[str]:
    """`personaemp agreement --dialogues A --dialogues B --resamples N`, as a person types it."""
    dialogues = [arg for path in paths for arg in ("--dialogues", str(path))]
    return ["agreement", *dialogues, "--resamples", str(resamples)]


def write_failures(path: Path) -> Path:
    """policy-b's run lost two dialogues (queries 7 and 8) to the simulator's rules."""
    return write_jsonl(
        path.with_name("gen-dialogues.failures.jsonl"),
        [{"dialogue_id": f"u{n}-q1-d1", "user_id": f"u{n}", "query_id": f"u{n}-q1", "kind": "simulator_rules",
          "error": "no_early_end failed 3 times", "attempts": 3, "input_hash": "x"} for n in (7, 8)],
    )  # fmt: skip


def write_labels(paths: list[Path], labels: Path) -> Path:
    """ana labels every dialogue (turns, the rejected replies the page's blind check offers, and
    PERM); bo labels policy-a's q1 turns and q2's rejected reply only. Every event goes through
    the page's make_event, as a click does."""
    from personaemp.records import DIMENSIONS
    from personaemp.review.dialogues import read_dialogue_items

    items = {item["item"]: item for item in read_dialogue_items(paths)}
    file = LabelFile(labels)

    def label(reviewer: str, key: str, field: str, value) -> None:
        body = {"reviewer": reviewer, "item": key, "field": field, "value": value}
        file.append(make_event(body, items, "t"))

    for key, item in items.items():
        system, n = item["system"], int(item["query_id"][1])
        for k, turn in enumerate(item["labelled_turns"], 1):
            check = (item["turns"][turn]["checks"] or {}).get("in_character")
            # ana disagrees with the check once: policy-a q4's second turn, which the check passed
            says_in = check if check is not None else True
            if (system, n, k) == ("policy-a", 4, 2):
                says_in = False
            label("ana", key, f"character:{turn}", "in" if says_in else "out")
            label("ana", key, f"realism:{turn}", "unrealistic" if k == 3 and n == 2 else "realistic")
            if system == "policy-a" and n == 1:
                label("bo", key, f"character:{turn}", "in")
        for probe in item["probes"]:  # the rejected replies: out when the check failed them
            if "." in probe["target"]:
                turn, _, k = probe["target"].partition(".")
                failed = item["turns"][int(turn)]["rejected"][int(k)]["failed"]
                said = "out" if "in_character" in failed else "in"
                label("ana", key, f"character:{probe['target']}", said)
                if system == "policy-a" and n == 2:
                    label("bo", key, f"character:{probe['target']}", said)
        for dimension in DIMENSIONS:
            label("ana", key, f"perm:{dimension}", RATING[system][n - 1])
    return labels
