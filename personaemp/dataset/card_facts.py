"""What the dataset card reports, gathered from the build: each stage's report (found through
the stages' manifests), the source and who was picked, the published personas' figures."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from personaemp import manifest
from personaemp.dataset.data_files import SETTINGS, DataPart, _read_json
from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy, iter_jsonl
from personaemp.manifest import stage_chain
from personaemp.records import BIG_FIVE


def stage_reports(split_report: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The filter report and the LLM stages' run-report entries of this build, and warnings.

    Found by following the split's input (the queries file) back through the manifests
    the stages wrote beside their outputs; nothing is guessed from folder names. A run
    report entry is used only if it is a full run (not a `--limit`/`--users` quick look)
    that wrote the file the manifest names.
    """
    facts: dict[str, Any] = {}
    warnings: list[str] = []
    source = split_report.get("input")
    if not isinstance(source, str) or not source:
        warnings.append(
            "split_report.json does not name its input file (an older split): re-run personaemp "
            "split to have the filter and LLM stages in the card"
        )
        return facts, warnings
    chain = stage_chain(Path(source))
    hint = "re-run that stage, or delete the file and its entry in manifest.json"
    for stage in ("filter", "infer-persona", "gen-queries"):
        entry = chain.get(stage)
        report_path = entry and entry.get("report")
        if not report_path:
            warnings.append(f"no report of {stage} was recorded for {source}: it is left out of the card")
            continue
        path = Path(report_path)
        if not path.is_file():
            warnings.append(f"{path}: the report of {stage} is gone: it is left out of the card")
            continue
        report = _read_json(path, f"the report of {stage}", hint)
        if not isinstance(report, dict):
            raise InputError(f"{path}: not a report of {stage} (a JSON object is expected)", hint)
        if stage == "filter":
            facts["filter"] = report
            continue
        run = (report.get("stages") or {}).get(stage)
        if not isinstance(run, dict) or run.get("full") is False:
            warnings.append(f"{path}: no full run of {stage}: it is left out of the card")
            continue
        if run.get("output") and not manifest.names(run["output"], path.parent, entry["output"]):
            warnings.append(
                f"{path}: the last full run of {stage} wrote {run['output']}, not {entry['output']}: "
                "it is left out of the card"
            )
            continue
        facts.setdefault("run", {"stages": {}})["stages"][stage] = run
    persona = chain.get("infer-persona") or {}
    units = ((facts.get("run") or {}).get("stages", {}).get("infer-persona") or {}).get("units")
    if isinstance(units, int) and units < _count((facts.get("filter") or {}).get("kept")):
        facts["picked"] = picked_users(persona.get("input"), persona.get("output"), units)
    return facts, warnings


class _UserId(msgspec.Struct):
    user_id: str


def _user_ids(path: Any) -> list[str]:
    """The user ids of a stage's output in file order (only that field is decoded)."""
    decoder = msgspec.json.Decoder(_UserId)
    try:
        with open(path, "rb") as handle:
            return [decoder.decode(line).user_id for line in handle if line.strip()]
    except (OSError, TypeError, msgspec.DecodeError):
        return []


def picked_users(filtered: Any, personas: Any, units: int) -> str | None:
    """How infer-persona's users were picked from the filter's: "first" (the first `units`
    in the filter's order, as a `limit` picks them), "named" (others: `users` named them),
    None when the files do not tell."""
    written, kept = set(_user_ids(personas)), _user_ids(filtered)
    if len(written) != units or not kept:
        return None
    return "first" if written == set(kept[:units]) else "named"


def _count(value: Any) -> int:
    return value if isinstance(value, int) else 0


def memory_source(user_source: Any, warnings: list[str]) -> dict[str, Any]:
    """Where the memories came from: AlpsBench as read, or a conversation log through
    extract-memories, whose manifest entry names the file the filter read. Its rows tell
    the log and its format, their provenance (and its run report) the model."""
    path = user_source.get("path") if isinstance(user_source, dict) else None
    entry = stage_chain(Path(path)).get("extract-memories") if isinstance(path, str) and path else None
    if entry is None:
        return {"kind": "alpsbench", "format": (user_source or {}).get("format")}
    found: dict[str, Any] = {"kind": "log"}
    first = next(iter(_rows(entry["output"])), None)
    if first is None:
        warnings.append(
            f"{entry['output']}: the memories extract-memories wrote are gone: the card cannot name the log"
        )
    else:
        source, provenance = first.get("source") or {}, first.get("provenance") or {}
        log = source.get("path")
        found.update(
            log=Path(log).name if isinstance(log, str) else None, format=source.get("format"),
            model=provenance.get("model"), endpoint_kind=provenance.get("endpoint_kind"),
        )  # fmt: skip
    run = _full_run(entry, "extract-memories")
    if run:
        found["run"] = run
        found["model"] = found.get("model") or run.get("model")
        found["users_in_log"] = len(_user_ids(entry.get("input")))  # conversations.jsonl: the log's users
    return found


def _full_run(entry: dict[str, Any], stage: str) -> dict[str, Any]:
    """The run report's entry of `stage` when it is a full run that wrote the manifest's output."""
    path = Path(entry["report"]) if entry.get("report") else None
    if path is None or not path.is_file():
        return {}
    report = _read_json(path, f"the report of {stage}", "re-run that stage")
    run = ((report if isinstance(report, dict) else {}).get("stages") or {}).get(stage)
    if not isinstance(run, dict) or run.get("full") is False:
        return {}
    if run.get("output") and not manifest.names(run["output"], path.parent, entry["output"]):
        return {}
    return run


def _rows(path: Any) -> Iterator[dict]:
    try:
        for _, _, row in iter_jsonl(Path(path), ErrorPolicy("fail")):
            yield row
    except (OSError, TypeError, RowError, InputError):
        return


def card_facts(
    splits_dir: Path, parts: dict[str, dict[str, DataPart]], split_report: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What the card reports, read from this build's files (missing ones are left out)."""
    facts: dict[str, Any] = {"settings": {}, "provenance": Counter(), "languages": Counter(), "warnings": []}
    if split_report is not None:
        facts["split"] = split_report
        found, facts["warnings"] = stage_reports(split_report)
        facts.update(found)
    for setting, written in parts.items():
        facts["settings"][setting] = {split: part.summary() for split, part in written.items()}
        for part in written.values():
            facts["languages"].update(part.languages)
    facts["personas"] = persona_facts(parts)
    for setting in SETTINGS:
        path = splits_dir / setting / "train.jsonl"
        if path.exists():
            for _, _, user in iter_jsonl(path, ErrorPolicy("fail")):
                facts["source"] = memory_source(user.get("source"), facts["warnings"])
                # The persona's provenance (its prompts), then the queries'.
                sources = [("infer-persona", user.get("provenance"))]
                sources += [("gen-queries", q.get("provenance")) for q in user.get("queries", [])[:1]]
                for stage, prov in sources:
                    if isinstance(prov, dict) and prov:
                        prompts = prov.get("prompts") if isinstance(prov.get("prompts"), dict) else {}
                        entry = {"stage": stage, "model": prov.get("model"), **prompts}
                        facts["provenance"][json.dumps(entry)] += 1
                break
            break
    return facts


def persona_facts(parts: dict[str, dict[str, DataPart]]) -> dict[str, Any]:
    """Over the published users: their distinct Big Five profiles (all, and per split of each
    config), the levels citing no memory, the users kept although the depth check said no."""
    profiles: dict[str, tuple[str, ...]] = {}
    uncited: dict[str, int] = {}
    depth: set[str] = set()
    per_split: dict[str, dict[str, int]] = {}
    for setting, written in parts.items():
        for split, part in written.items():
            profiles.update(part.profiles)
            uncited.update(part.uncited_levels)
            depth |= part.depth_not_enforced
            per_split.setdefault(setting, {})[split] = len(set(part.profiles.values()))
    return {
        "users": len(profiles), "profiles": len(set(profiles.values())), "per_split": per_split,
        "uncited_levels": sum(uncited.values()), "levels": len(BIG_FIVE) * len(profiles),
        "depth_not_enforced": len(depth),
    }  # fmt: skip
