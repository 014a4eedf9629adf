"""The dataset card says what the build was: its source (AlpsBench or the user's own log), every
relaxation it used, its default config; push leaves out a leftover criteria file nobody asked for.

Builds run the real pipeline against the fake endpoint (tests/fake_openai.py); cards are read
back from the dry-run folder and the datasets are loaded back with `datasets.load_dataset`.
"""

from __future__ import annotations

import ast
import json
import tomllib
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_TASK1, order_free_responder, write_jsonl
from fake_openai import FakeOpenAI
from log_shapes import regroup, write_shape
from rich.console import Console
from test_publish import front_matter, load, queries_rows, users_of
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.config import Resolver
from personaemp.dataset.card import stats_section
from personaemp.dataset.publish import publish
from personaemp.dataset.split import split_users
from personaemp.errors import InputError
from personaemp.pipeline import run_pipeline
from personaemp.records import BIG_FIVE, DIMENSIONS

QUIET = Console(quiet=True)
# personaemp.toml's demo, read from it: three users named out of the sixteen the filter keeps,
# the depth gate off, some checks recorded only, no OOD split.
DEMO = {
    name: tomllib.loads((REPO / "personaemp.toml").read_text())[name]
    for name in ("persona", "queries", "split")
}


def build(processed: Path, source: Path | str, **sections) -> str:
    """`personaemp run` on `source` into `processed` against the fake endpoint; the card."""
    with FakeOpenAI(responder=order_free_responder()) as server:
        flags = {
            "paths": {"input": str(source), "processed": processed},
            "llm": {"base_url": [server.base_url], "model": "fake"},
            **sections,
        }
        run_pipeline(Resolver(None, flags=flags, style="python").all(), QUIET)
    return (processed / "dataset" / "README.md").read_text(encoding="utf-8")


def bullets(card: str) -> list[str]:
    """The card's list of how the build departs from a full one."""
    head = card.split("**How this build departs from a full one:**", 1)
    return (
        [line for line in head[1].split("## How it was built")[0].splitlines() if line]
        if len(head) > 1
        else []
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    processed = tmp_path_factory.mktemp("demo") / "processed"
    build(processed, SAMPLE_TASK1, **DEMO)
    return processed


def test_a_card_built_from_a_log_names_the_log_its_format_and_the_extracting_model(tmp_path):
    log = write_shape("messages", regroup(range(0, 24), users=8), tmp_path / "log")
    card = build(tmp_path / "processed", log, extract={"limit": 6})

    intro = card.split("\n## How it was built", 1)[0]
    assert f"`{log.name}` (messages format)" in intro
    assert "`fake` (`personaemp extract-memories`), not annotated by people" in intro
    assert "Only 6 of the 8 users in the log went through extract-memories" in intro
    assert "- **extract-memories**: 6 of the 8 users read from the log" in card
    for alpsbench in ("AlpsBench", "human-verified", "WildChat", "annotator"):
        assert alpsbench not in card
    assert front_matter(card)["license"] == "other"
    assert "the user's id in the source log" in card


def test_the_demo_card_states_every_relaxation_from_the_builds_files(demo, tmp_path):
    card = (demo / "dataset" / "README.md").read_text(encoding="utf-8")
    said = bullets(card)
    assert "- 3 users chosen by hand (`[persona] users`) out of the 16 kept by the filter." in said
    assert any(
        line.startswith("- The depth gate was off (`[persona] require_depth = false`)") for line in said
    )
    assert any("relaxed its checks" in line and "`not_copied`" in line for line in said)
    # only the configs the build has
    assert "`ood`" not in card and "KModes" not in card
    users = [u for split in ("train", "test") for u in users_of(demo / "splits", "random", split)]
    profiles = {tuple(u["big_five"][t]["level"] for t in BIG_FIVE) for u in users}
    assert f"The 3 users hold {len(profiles)} distinct Big Five profile" in card
    assert "AlpsBench" in card and front_matter(card)["license"] == "odc-by"


def test_a_limit_is_stated_as_the_first_users_of_the_filter(tmp_path):
    card = build(tmp_path / "processed", SAMPLE_TASK1, persona={"limit": 2}, split={"ood": False})
    assert "- A limit: only the first 2 of the 16 users kept by the filter (`[persona] limit`)." in bullets(
        card
    )
    assert not any("depth gate" in line for line in bullets(card))


def test_levels_citing_no_memory_and_users_kept_past_the_depth_check_are_counted(tmp_path):
    rows = queries_rows()
    for row in rows[:4]:  # 4 users: 2 levels each with no evidence, and the gate's no
        for trait in BIG_FIVE[:2]:
            row["big_five"][trait]["evidence"] = []
        row["gate_reason"] = "depth check not enforced (it said no: one-off questions)"
    write_jsonl(tmp_path / "queries.jsonl", rows)
    split_users(tmp_path / "queries.jsonl", tmp_path / "splits", ood=True, k=3, seed=5, test_size=0.2)
    publish(tmp_path / "splits", out=tmp_path / "repo")
    card = (tmp_path / "repo" / "README.md").read_text(encoding="utf-8")

    said = bullets(card)
    assert "- 8 of 60 Big Five levels rest on no cited memory." in said  # 12 published users
    assert any("4 of the 12 users in the dataset were kept although" in line for line in said)
    assert "The 12 users hold 3 distinct Big Five profiles (ood: train 2, test 1)." in card


def test_both_configs_load_without_a_config_name(tmp_path):
    from datasets import load_dataset

    write_jsonl(tmp_path / "queries.jsonl", queries_rows())
    split_users(tmp_path / "queries.jsonl", tmp_path / "splits", ood=True, k=3, seed=5, test_size=0.2)
    out = tmp_path / "repo"
    publish(tmp_path / "splits", out=out)
    configs = front_matter((out / "README.md").read_text(encoding="utf-8"))["configs"]
    assert [c["config_name"] for c in configs if c.get("default")] == ["random"]

    cache = str(tmp_path / "cache")
    whole = load_dataset(str(out), cache_dir=cache)
    test = load_dataset(str(out), split="test", cache_dir=cache)
    assert sorted(whole) == ["test", "train"]
    assert sorted(test["query_id"]) == sorted(load(out, "random", tmp_path / "cache")["test"]["query_id"])


def test_persona_checks_are_tabled_as_the_query_checks_are():
    stats = {
        "checks": {"length_ok": {"passed": 9, "of": 10, "rate": 0.9, "enforced": True}},
        "persona_checks": {"traits_cited": {"passed": 3, "of": 4, "rate": 0.75, "enforced": False}},
    }
    section = stats_section(stats, [])
    assert "### Persona checks" in section
    assert "| traits_cited | recorded only | 3 | 4 | 75.0% |" in section


# --- a leftover criteria file ------------------------------------------------------------------


def stale_criteria(path: Path, splits: Path) -> Path:
    """Criteria rows made for another version of the first published query."""
    query = users_of(splits, "random", "train")[0]["queries"][0]
    item = {"name": "n", "weight": 100.0, "description": "d"}
    row = {"query_id": query["query_id"], "query_hash": "0" * 16, "criteria": {d: [item] for d in DIMENSIONS}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    return path


def test_a_leftover_criteria_file_at_the_default_place_is_left_out_with_one_line(demo, tmp_path, monkeypatch):
    """`make demo`, the README's tour (criteria on data/processed), `make demo` again."""
    monkeypatch.chdir(tmp_path)
    splits = tmp_path / "data" / "processed" / "splits"
    splits.parent.mkdir(parents=True)
    split_users(demo / "queries.jsonl", splits, ood=False, seed=13)
    criteria = stale_criteria(Path("data/processed/criteria.jsonl"), splits)

    made = CliRunner().invoke(app, ["push", "--dry-run"])
    assert made.exit_code == 0, made.output
    said = [line for line in made.output.splitlines() if str(criteria) in line]
    assert len(said) == 1 and said[0].endswith("left out of the dataset (pass --criteria to require it)")
    assert (
        "criteria" not in load(Path("data/processed/dataset"), "random", tmp_path / "c")["test"].column_names
    )

    asked = CliRunner().invoke(app, ["push", "--dry-run", "--criteria", str(criteria)])
    assert asked.exit_code == 2 and "made for another version" in asked.output
    with pytest.raises(InputError, match="made for another version"):
        publish(splits, out=tmp_path / "other", criteria=criteria)


# --- the Python API page -----------------------------------------------------------------------


def test_the_api_pages_signatures_show_defaults_as_python_literals():
    from personaemp import api
    from personaemp.apidocs import _signature
    from personaemp.registry import STAGES

    for stage in STAGES.values():
        text = _signature(getattr(api, stage.function), stage)
        source = text.replace(f"pe.{stage.function}(", "def f(", 1).replace(") -> StageResult", "): pass")
        arguments = ast.parse(source).body[0].args
        for default in [*arguments.defaults, *arguments.kw_defaults]:
            ast.literal_eval(default)  # a bare path (data/processed/x) is a division of names
    assert "out_dir='data/processed/dataset'" in _signature(api.publish, STAGES["push"])


def test_a_build_on_the_embedded_model_and_relaxed_persona_checks_say_so_first():
    """Before: the demo's card named the embedded model only in passing (no word that its content
    is weak) and said nothing of the persona checks `[persona] enforce` left out."""
    from personaemp.dataset.card import departures
    from personaemp.llm.models import EMBEDDED

    facts = {"run": {"stages": {"infer-persona": {"model": EMBEDDED.name}, "gen-queries": {"model": "x"}}}}
    stats = {
        "persona_checks": {
            "no_internal_ids": {"passed": 13, "of": 18, "rate": 0.72, "enforced": False},
            "level_matches_rationale": {"passed": 15, "of": 15, "rate": 1.0, "enforced": True},
        }
    }
    lines = departures(facts, stats)
    assert lines[0].startswith("Built on the embedded demo model") and "not a dataset to train" in lines[0]
    assert (
        "Persona checks recorded but not enforced (`[persona] enforce`): `no_internal_ids` (13 of 18 passed)"
        in lines[1]
    )
    assert not any(
        "embedded" in line for line in departures({"run": {"stages": {"x": {"model": "gpt"}}}}, {})
    )


def test_the_demo_card_on_a_real_endpoint_does_not_call_itself_the_embedded_demo(demo):
    assert "embedded demo model" not in (demo / "dataset" / "README.md").read_text(encoding="utf-8")
