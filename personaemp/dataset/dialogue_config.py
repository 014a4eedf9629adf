"""The `dialogues` config of the dataset: gen-dialogues' output checked and written as one
Parquet file per split (of the random setting that holds each query), and the card's facts
about it (who played whom, what was kept and lost, how the dialogues ended)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from personaemp.dataset.data_files import SPLITS, _read_json
from personaemp.errors import InputError
from personaemp.io import ErrorPolicy, file_sha256, iter_jsonl, iter_records
from personaemp.records import REJECTED_KEYS

DIALOGUES = "dialogues"  # the config of gen-dialogues' output, when it exists
# A published turn: the simulated user's state (and inner thought) stays, its per-reply checks
# are the card's pass rates.
TURN_FIELDS = {"role", "text", "emotion", "change", "reason", "need_met", "thought"}
DIALOGUE_FAILURES = "gen-dialogues.failures.jsonl"  # beside the dialogues file (llm/stage.py names it)


def dialogue_parts(paths: list[Path], files: dict[str, dict[str, Path]], staging: Path, warnings: list[str]):
    """(split -> (repository name, staged file), the card's facts) of the dialogues config:
    the dialogues of every file in `paths` (one gen-dialogues run each, e.g. one per
    supporter), together, their `supporter_model` column telling them apart; each dialogue in
    the split of the random setting (else the first) that holds its query; one whose query is
    in no split is left out, counted in a warning. A dialogue id is one dialogue per
    supporter: the same (supporter, dialogue id) twice, in one file or two, is refused."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from personaemp.instruments import simulator_rules
    from personaemp.instruments.realism import seeker_realism
    from personaemp.records import Dialogue

    setting = "random" if "random" in files else next(iter(files))
    split_of: dict[str, str] = {}
    real: dict[str, list[str]] = {}  # each user's own messages: how real their simulated self is
    for split, split_path in files[setting].items():
        for _, _, user in iter_jsonl(split_path, ErrorPolicy("fail")):
            for query in user.get("queries") or ():
                split_of[str(query["query_id"])] = split
            real[str(user["user_id"])] = [
                t["text"] for t in user.get("turns") or () if t.get("role") == "user" and t.get("text")
            ]
    rows: dict[str, list[dict]] = {split: [] for split in SPLITS}
    dialogues: list[Dialogue] = []
    seen: dict[tuple[str, str], str] = {}
    lost: list[dict[str, Any]] = []
    for path in paths:
        outside, left_out = 0, []
        supporters: set[str] = set()
        for lineno, dialogue in iter_records(path, Dialogue, "a dialogue", "pass gen-dialogues' output"):
            key = (dialogue.supporter_model, dialogue.dialogue_id)
            if key in seen:
                raise InputError(
                    f"{path}:{lineno}: dialogue {dialogue.dialogue_id} of {dialogue.supporter_model} "
                    f"appears twice (also at {seen[key]})",
                    "pass each gen-dialogues run once",
                )
            seen[key] = f"{path}:{lineno}"
            supporters.add(dialogue.supporter_model)
            split = split_of.get(dialogue.query_id)
            if split is None:
                outside += 1
                left_out.append(f"{dialogue.dialogue_id} (line {lineno})")
                continue
            published = dialogue.model_dump(mode="json", exclude={"provenance", "turns"})
            published["turns"] = [
                turn.model_dump(mode="json", include=TURN_FIELDS) for turn in dialogue.turns
            ]
            rows[split].append(published)
            dialogues.append(dialogue)
        if outside:
            named = ", ".join(left_out[:5]) + (f" and {outside - 5} more" if outside > 5 else "")
            warnings.append(f"{path}: {outside} dialogues of queries in no split were left out: {named}")
        # a failures row that names no supporter is its run's (a file of one supporter)
        only = next(iter(supporters)) if len(supporters) == 1 else None
        lost += [
            {**row, "supporter_model": row.get("supporter_model") or only}
            if only and not row.get("supporter_model")
            else row
            for row in _lost_dialogues(path.with_name(DIALOGUE_FAILURES), split_of)
        ]
    written = {}
    for split, found in rows.items():
        if not found:
            continue
        staged = staging / f"{DIALOGUES}-{split}.parquet"
        pq.write_table(pa.Table.from_pylist(found), staged)
        written[split] = (f"{DIALOGUES}/{split}-00000-of-00001-{file_sha256(staged)[:16]}.parquet", staged)
    facts = dialogue_facts(dialogues, {s: len(r) for s, r in rows.items() if r}, simulator_rules, lost)
    facts["realism"] = seeker_realism(dialogues, real)
    return written, facts


def _lost_dialogues(failures: Path, split_of: dict[str, str]) -> list[dict[str, Any]]:
    """The failures rows of gen-dialogues beside the dialogues file whose query is published
    (a dialogue the simulator could not finish); none without the file."""
    if not failures.is_file():
        return []
    lost = []
    for _, _, row in iter_jsonl(failures, ErrorPolicy("fail")):
        query = row.get("query_id") or re.sub(r"-d\d+$", "", str(row.get("dialogue_id", "")))
        if query in split_of:
            lost.append(row)
    return lost


BEHAVIOUR_REPORT_HINT = "pass the report `personaemp evaluate --dialogues` wrote for these dialogues"


def behaviour_facts(path: Path) -> dict[str, Any]:
    """What the card quotes of an `evaluate --dialogues` report: per supporter (system) and
    seeker style, n, the behaviours per 1,000 words, the tracking rate, final emotion and
    session reward; the lists and the reward's rule."""
    report = _read_json(path, "the dialogues' evaluation, which the card quotes", BEHAVIOUR_REPORT_HINT)
    if not isinstance(report, dict) or report.get("kind") != "dialogues":
        raise InputError(f"{path}: not an `evaluate --dialogues` report", BEHAVIOUR_REPORT_HINT)
    if not report.get("behaviours"):
        raise InputError(
            f"{path}: its dialogues were scored without the behaviour judge (--no-behaviours)",
            "run `personaemp evaluate --dialogues` again without --no-behaviours",
        )
    rows = []
    for system, entry in (report.get("systems") or {}).items():
        styles = entry.get("by_seeker") or {(entry.get("seekers") or ["cooperative"])[0]: entry}
        for style, found in styles.items():
            counted = found.get("behaviours") or {}
            rows.append({
                "system": system, "seeker": style, "n": found.get("n", 0), "turns": counted.get("turns", 0),
                "words": counted.get("words", 0), "risky_per_1k": counted.get("risky_per_1k"),
                "protective_per_1k": counted.get("protective_per_1k"),
                "tracking_rate": (counted.get("tracking") or {}).get("rate"),
                "final_emotion": found.get("final_emotion"), "reward": found.get("reward"),
                "dropped_quotes": counted.get("dropped_quotes", 0),
            })  # fmt: skip
    return {
        "report": Path(path).name,
        "lists": report.get("behaviour_lists") or {},
        "rule": (report.get("safety_rule") or {}).get("text", ""),
        "rows": rows,
    }


def dialogue_facts(dialogues, rows: dict[str, int], simulator_rules, lost=()) -> dict[str, Any]:
    """What the card says of the dialogues: models, languages, turns, how they ended, per
    supporter the dialogues kept and lost (`lost`: the failures file's rows), and each check's
    pass rate over every simulated reply it judged, kept or asked again. A check ran on a reply
    when the kept reply's checks name it (a rejected reply: when it ran on the reply kept at
    that turn, or failed; the LLM check only when no rule had refused the reply); one that
    never ran is "not checked" (None), never a pass."""
    judged: Counter = Counter()
    failed: Counter = Counter()
    unreached: Counter = Counter()  # an LLM check's replies that a rule had refused already
    replies = 0
    names: dict[str, None] = dict.fromkeys((*simulator_rules.RULES, *simulator_rules.JUDGED))
    llm_checks = set(simulator_rules.JUDGED)

    def count(rejected: dict, checks) -> None:
        """One rejected reply, judged by `checks` and the rules it broke; the LLM check asks
        only about a reply every rule passed, so a reply a rule refused never reached it."""
        broken = set(rejected) - set(REJECTED_KEYS)
        for rule in set(checks) | broken:
            names.setdefault(rule)
            if rule in llm_checks and not broken <= llm_checks:
                unreached[rule] += 1
                continue
            judged[rule] += 1
            failed[rule] += rule in broken

    for dialogue in dialogues:
        for turn in dialogue.turns[1:]:
            if turn.role != "user":
                continue
            ran = set(turn.checks or {})
            names.update(dict.fromkeys(sorted(ran)))
            replies += 1 + len(turn.rejected)
            for rule in ran:
                judged[rule] += 1
                failed[rule] += not turn.checks[rule]
            for rejected in turn.rejected:
                count(rejected, ran)
    # the replies of a lost dialogue, where its failures row keeps them (each: rule -> why):
    # judged by every check the run made (those that ran on its kept replies) and failed
    run_checks = {rule for rule in names if judged[rule]}
    unkept = 0
    for row in lost:
        if not isinstance(row.get("rejected"), list):
            unkept += 1
            continue
        for rejected in row["rejected"]:
            if isinstance(rejected, dict):
                replies += 1
                count(rejected, run_checks)
    turns = [sum(t.role == "assistant" for t in d.turns) for d in dialogues]
    kept = Counter(d.supporter_model for d in dialogues)
    only = next(iter(kept)) if len(kept) == 1 else None  # one run's failures: its supporter's
    supporters = {model: {"kept": n, "lost": 0, "lost_by_kind": {}} for model, n in kept.items()}
    for row in lost:
        model = row.get("supporter_model") or only or "unknown"
        entry = supporters.setdefault(model, {"kept": 0, "lost": 0, "lost_by_kind": {}})
        entry["lost"] += 1
        # the simulator's failure (its rules on every try), or the supporter's (its reply failed)
        entry["by_simulator"] = entry.get("by_simulator", 0) + (
            row.get("lost_to", "simulator" if row.get("kind") == "simulator_rules" else "") == "simulator"
        )
        kind = str(row.get("kind") or "unknown")
        entry["lost_by_kind"][kind] = entry["lost_by_kind"].get(kind, 0) + 1
    finals: dict[str, list[int]] = {}
    seekers_found = dict(sorted(Counter(d.seeker for d in dialogues).items()))
    for dialogue in dialogues:
        finals.setdefault(dialogue.supporter_model, []).append(dialogue.final_emotion)
    return {
        "rows": rows,
        "simulator_models": sorted({d.simulator_model for d in dialogues}),
        "supporter_models": sorted({d.supporter_model for d in dialogues}),
        "languages": dict(sorted(Counter(d.language or "unknown" for d in dialogues).items())),
        "turns": {"min": min(turns, default=0), "max": max(turns, default=0),
                  "mean": round(sum(turns) / len(turns), 2) if turns else 0},
        "ended_by": dict(Counter(d.ended_by for d in dialogues)),
        "need_met": sum(d.need_met_at_turn is not None for d in dialogues),
        "seekers": seekers_found,
        "supporters": dict(sorted(supporters.items())),
        "final_emotions": finals,
        "initial_emotions": sorted({d.initial_emotion for d in dialogues}),
        "checked_replies": replies,
        "lost_replies_not_kept": unkept,  # lost dialogues whose failures row keeps no replies
        "judged": {rule: judged[rule] for rule in names},
        "unreached": {rule: unreached[rule] for rule in names if unreached[rule]},
        "pass_rates": {
            rule: round(1 - failed[rule] / judged[rule], 4) if judged[rule] else None for rule in names
        },
    }  # fmt: skip
