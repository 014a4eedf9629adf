"""The embedded model's compact prompts: used only on it, same slots, and the situations
schema that holds it to one moment per category."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from personaemp.dataset import persona, queries
from personaemp.dataset.queries import QueryOptions, SituationsReply, situations_schema
from personaemp.prompts import COMPACT, load_prompt, step_prompts
from personaemp.records import Memory

ROOT = Path(__file__).resolve().parents[2]
COMPACTED = sorted(path.stem for path in (ROOT / "prompts" / COMPACT).glob("*.md"))


def slots(path: Path) -> set[str]:
    return set(re.findall(r"\$(\w+)", path.read_text(encoding="utf-8")))


def test_each_compact_prompt_replaces_a_build_prompt_with_no_new_slot():
    """Same fields: a compact prompt is filled from the values its full version gets."""
    build_prompts = {step.prompt for step in (*persona.STEPS, *queries.STEPS)}
    assert COMPACTED and set(COMPACTED) <= build_prompts
    for name in COMPACTED:
        assert slots(ROOT / "prompts" / COMPACT / f"{name}.md") <= slots(ROOT / "prompts" / f"{name}.md"), (
            name
        )


def test_the_variant_is_read_where_there_is_one_and_the_full_prompt_elsewhere():
    full, compact = step_prompts(queries.STEPS), step_prompts(queries.STEPS, COMPACT)
    assert compact["situations"].hash != full["situations"].hash  # recorded in provenance and fingerprints
    assert compact["check"].hash == full["check"].hash  # no compact check prompt: the full one
    assert load_prompt("situations", variant=COMPACT).hash == compact["situations"].hash


def a_persona() -> SimpleNamespace:
    """What the schema and the parse read of a persona: its memories."""
    return SimpleNamespace(
        memories=[Memory(memory_id=f"m{i}", label="Thoughts/Goals", value=f"goal {i}") for i in (1, 2)]
    )


def test_one_each_fixes_a_moment_per_category_in_order():
    options = QueryOptions(categories=("ES", "HEQ", "SS"), per_category=1)
    listed = situations_schema(a_persona(), options, one_each=True)["properties"]["situations"]
    assert "items" not in listed, "llama.cpp's grammar reads `items` before `prefixItems`"
    assert listed["minItems"] == listed["maxItems"] == 3
    assert [item["properties"]["category"]["enum"] for item in listed["prefixItems"]] == [
        ["ES"],
        ["HEQ"],
        ["SS"],
    ]
    assert all(
        item["properties"]["memory_ids"]["items"]["enum"] == ["m1", "m2"] for item in listed["prefixItems"]
    )
    two = QueryOptions(categories=("SS", "ES"), per_category=2)
    listed = situations_schema(a_persona(), two, one_each=True)["properties"]["situations"]
    assert [item["properties"]["category"]["enum"][0] for item in listed["prefixItems"]] == [
        "SS",
        "SS",
        "ES",
        "ES",
    ]
    # The reply model is the same: a reply to the fixed schema parses as any other.
    reply = SituationsReply.model_validate(
        {
            "situations": [
                {"category": c, "topic": "t", "text": "x", "memory_ids": ["m1"], "message": "help?"}
                for c in ("SS", "SS", "ES", "ES")
            ]
        }
    )
    kept, dropped = queries.parse_situations(a_persona(), reply, two)
    assert len(kept) == 4 and not dropped


def test_other_endpoints_keep_the_papers_schema():
    """On every other endpoint a category with nothing to stand on is skipped (no minimum)."""
    listed = situations_schema(a_persona(), QueryOptions())["properties"]["situations"]
    assert "prefixItems" not in listed and "minItems" not in listed and listed["maxItems"] == 3
