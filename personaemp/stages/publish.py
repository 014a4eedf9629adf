"""`personaemp push`: the splits as a Hugging Face dataset with two configs, and its card.

One row per accepted query, carrying its user's persona, Big Five levels and memories
(value and label): the natural unit for training and evaluating responses. No dialogue
text unless asked for (`include_dialogue`). Configs `random` and `ood`, each with train
and test. `--dry-run` writes exactly the repository that would be uploaded.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from personaemp.errors import InputError, PersonaempError
from personaemp.io import ErrorPolicy, iter_jsonl
from personaemp.records import BIG_FIVE
from personaemp.stages.dataset_card import render_card

SETTINGS = ("random", "ood")
COLUMNS = (
    "user_id", "query_id", "query", "category", "situation", "memory_ids", "language",
    "persona_profile", "persona_traits", "topics", "big_five", "memories", "user_turns",
)  # fmt: skip
SPLITS = ("train", "test")


def features(include_dialogue: bool):
    from datasets import Features, Sequence, Value

    string = Value("string")
    columns = {  # keep in COLUMNS order
        "user_id": string,
        "query_id": string,
        "query": string,
        "category": string,
        "situation": {"topic": string, "text": string},
        "memory_ids": Sequence(string),
        "language": string,
        "persona_profile": string,
        "persona_traits": [{"aspect": string, "statement": string, "evidence": Sequence(string)}],
        "topics": Sequence(string),
        "big_five": {trait: string for trait in BIG_FIVE},
        "memories": [{"memory_id": string, "label": string, "value": string}],
    }
    if include_dialogue:
        columns["user_turns"] = Sequence(string)
    return Features(columns)


def dataset_rows(user: dict[str, Any], include_dialogue: bool) -> list[dict[str, Any]]:
    """One published row per accepted query of a user row."""
    shared = {
        "user_id": str(user["user_id"]),
        "language": user.get("language") or "",
        "persona_profile": user.get("profile", ""),
        "persona_traits": [
            {"aspect": t["aspect"], "statement": t["statement"], "evidence": t["evidence"]}
            for t in user.get("traits", [])
        ],
        "topics": user.get("topics", []),
        "big_five": {trait: user["big_five"][trait]["level"] for trait in BIG_FIVE},
        "memories": [
            {"memory_id": m["memory_id"], "label": m["label"], "value": m["value"]} for m in user["memories"]
        ],
    }
    if include_dialogue:
        shared["user_turns"] = [t["text"] for t in user.get("turns", []) if t.get("role") == "user"]
    rows = []
    for q in user.get("queries", []):
        row = {
            "query_id": q["query_id"],
            "query": q["query"],
            "category": q["category"],
            "situation": {"topic": q["situation"]["topic"], "text": q["situation"]["text"]},
            "memory_ids": q["memory_ids"],
            **shared,
        }
        rows.append({name: row[name] for name in COLUMNS if name in row})  # the features' order
    return rows


@dataclass
class PublishResult:
    target: str
    rows: dict[str, dict[str, int]]  # setting -> split -> rows
    card: Path | None = None


def build_datasets(splits_dir: Path, include_dialogue: bool) -> dict[str, Any]:
    """setting -> DatasetDict(train, test), for the settings present in `splits_dir`."""
    from datasets import Dataset, DatasetDict, disable_progress_bars

    disable_progress_bars()
    found = {}
    for setting in SETTINGS:
        paths = {split: splits_dir / setting / f"{split}.jsonl" for split in SPLITS}
        if not all(p.exists() for p in paths.values()):
            continue
        parts = {}
        for split, path in paths.items():
            rows = []
            for _, _, user in iter_jsonl(path, ErrorPolicy("fail")):
                rows.extend(dataset_rows(user, include_dialogue))
            parts[split] = Dataset.from_list(rows, features=features(include_dialogue))
        found[setting] = DatasetDict(parts)
    if not found:
        raise InputError(f"{splits_dir}: no random/ or ood/ train.jsonl + test.jsonl", "run personaemp split")
    return found


def card_facts(splits_dir: Path, datasets: dict[str, Any]) -> dict[str, Any]:
    """What the card reports, read from this run's files (missing ones are left out)."""
    processed = splits_dir.parent
    facts: dict[str, Any] = {"settings": {}, "provenance": Counter(), "languages": Counter()}
    for name, path in (
        ("filter", processed / "filter_report.json"),
        ("split", splits_dir / "split_report.json"),
        ("run", processed / ".personaemp" / "run_report.json"),
    ):
        if path.exists():
            facts[name] = json.loads(path.read_text(encoding="utf-8"))
    for setting, parts in datasets.items():
        summary = {}
        for split, data in parts.items():
            summary[split] = {
                "rows": len(data),
                "users": len(set(data["user_id"])),
                "categories": dict(Counter(data["category"])),
                "big_five": {
                    trait: dict(Counter(levels[trait] for levels in data["big_five"])) for trait in BIG_FIVE
                },
            }
            facts["languages"].update(data["language"])
        facts["settings"][setting] = summary
    for setting in SETTINGS:
        path = splits_dir / setting / "train.jsonl"
        if path.exists():
            for _, _, user in iter_jsonl(path, ErrorPolicy("fail")):
                # The persona's provenance (persona, big_five prompts), then the queries'.
                sources = [("infer-persona", user.get("provenance") or {})]
                sources += [("gen-queries", q.get("provenance") or {}) for q in user.get("queries", [])[:1]]
                for stage, prov in sources:
                    if prov:
                        entry = {"stage": stage, "model": prov.get("model"), **prov.get("prompts", {})}
                        facts["provenance"][json.dumps(entry)] += 1
            break
    return facts


def write_repository(datasets: dict[str, Any], out: Path, card: str) -> dict[str, dict[str, int]]:
    """The Hub repository layout: <config>/<split>-00000-of-00001.parquet and README.md."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*/*.parquet"):  # from an earlier dry run with other settings
        stale.unlink()
    rows = {}
    for setting, parts in datasets.items():
        rows[setting] = {}
        for split, data in parts.items():
            target = out / setting / f"{split}-00000-of-00001.parquet"
            target.parent.mkdir(parents=True, exist_ok=True)
            data.to_parquet(str(target))
            rows[setting][split] = len(data)
    (out / "README.md").write_text(card, encoding="utf-8")
    return rows


def publish(
    splits_dir: Path,
    *,
    repo_id: str | None = None,
    out: Path | None = None,
    private: bool = False,
    revision: str | None = None,
    include_dialogue: bool = False,
) -> PublishResult:
    """Push both configs to `repo_id`, or write the same repository to `out` (dry run)."""
    if (repo_id is None) == (out is None):
        raise InputError("give either --repo-id OWNER/NAME or --dry-run --out DIR")
    if repo_id is not None and repo_id.count("/") != 1:
        raise InputError(f"--repo-id must look like OWNER/NAME, not {repo_id!r}")
    datasets = build_datasets(splits_dir, include_dialogue)
    card = render_card(card_facts(splits_dir, datasets), include_dialogue)
    if out is not None:
        rows = write_repository(datasets, out, card)
        return PublishResult(target=str(out), rows=rows, card=out / "README.md")
    return _push(datasets, card, repo_id, private, revision)


def _push(datasets, card: str, repo_id: str, private: bool, revision: str | None) -> PublishResult:
    from personaemp.hub import check_hub_reachable

    check_hub_reachable(repo_id, "check your network; --dry-run --out DIR writes the same files locally")
    from huggingface_hub import HfApi

    token = os.environ.get("HF_TOKEN")  # else the user's `huggingface-cli login`
    rows = {}
    try:
        for setting, parts in datasets.items():
            parts.push_to_hub(repo_id, config_name=setting, private=private, token=token, revision=revision)
            rows[setting] = {split: len(data) for split, data in parts.items()}
        HfApi(token=token).upload_file(
            path_or_fileobj=card.encode(),
            path_in_repo="README.md",
            repo_id=repo_id,
            repo_type="dataset",
            revision=revision,
            commit_message="Dataset card",
        )
    except Exception as exc:  # the Hub client raises many kinds; the user needs one line
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        text = text.replace(token, "[redacted]") if token else text
        raise PersonaempError(
            f"{repo_id}: the push failed ({text})", "check HF_TOKEN and the repo id"
        ) from None
    return PublishResult(target=f"https://huggingface.co/datasets/{repo_id}", rows=rows)
