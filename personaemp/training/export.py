"""`personaemp export`: a split as training (or evaluation) files for TRL and verl (no LLM).

The policy's prompt is the one `personaemp respond` sends with the same `--context` (its
prompt template and context builder), so a model trained on the export is asked what the
evaluation asks it. What the reward needs travels with each row: query id, user id,
category, query, situation, persona, memories, Big Five levels, and the fixed criteria when
a criteria file is given.

  trl   JSON lines: `prompt` (conversational: system and user messages) and those fields as
        columns; `datasets.load_dataset("json", data_files=...)` reads it, and GRPOTrainer
        hands the columns to the reward function (personaemp.reward).
  verl  parquet: data_source, prompt, ability, reward_model {style, ground_truth},
        extra_info {index, split, context, ... the fields above}; the reward's
        compute_score reads extra_info.
With `dialogues`, each row is the opening of a multi-turn rollout with the simulated user
(training/interaction.py): `interaction_kwargs` (verl: in extra_info, where its agent loop
reads them; trl: a column) name the interaction and carry the user it plays (persona, Big
Five levels, memories, the moment, their own recent messages): the prompt is the same, the
supporter's first request in gen-dialogues.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from personaemp.errors import InputError, RowError
from personaemp.instruments.criteria import check_made_for, made_for, read_criteria, remake_criteria
from personaemp.instruments.policy import RESPOND, build_messages, policy_units
from personaemp.io import ErrorPolicy, atomic_output, iter_jsonl
from personaemp.prompts import load_prompt
from personaemp.vocabulary import EXPORT_FORMATS

FORMATS = EXPORT_FORMATS
ABILITY = "empathy"


def read_summaries(path: Path) -> dict[str, str]:
    """query id -> the user summary a `respond --context memory-summary` run wrote."""
    found = {}
    try:
        for lineno, _, row in iter_jsonl(path, ErrorPolicy("fail")):
            if not isinstance(row, dict) or not isinstance(row.get("summary"), str):
                raise InputError(
                    f"{path}:{lineno}: no summary in this row",
                    "pass the responses of `personaemp respond --context memory-summary`",
                )
            found[str(row.get("query_id"))] = row["summary"]
    except RowError as error:
        raise InputError(f"{error.location}: {error.reason}") from None
    return found


def export_rows(
    splits: Path,
    *,
    split: str = "random",
    part: str = "train",
    context: str = "memory",
    rag_k: int = 3,
    mismatch_seed: int = 0,
    summaries: Path | None = None,
    criteria_file: Path | None = None,
    dialogues: bool = False,
) -> tuple[Path, list[dict[str, Any]]]:
    """(the split file read, one record per query: `prompt` and what the reward reads)."""
    input_path, units, policy_view = policy_units(splits, split, part, context, mismatch_seed)
    prompt = load_prompt(RESPOND.prompt)
    summary_of: dict[str, str] = {}
    if context == "memory-summary":
        if summaries is None:
            raise InputError(
                "--context memory-summary needs the summaries the policy wrote",
                "run `personaemp respond --context memory-summary` and pass its output with --summaries",
            )
        summary_of = read_summaries(summaries)
    criteria = read_criteria(criteria_file) if criteria_file is not None else None
    if criteria_file is not None:
        check_made_for(
            criteria_file, made_for(criteria_file), units, "criteria",
            remake_criteria(input_path, criteria_file),
        )  # fmt: skip
    simulated = {}
    if dialogues:
        from personaemp.instruments.simulator import read_units
        from personaemp.training.interaction import NAME

        simulated = {u["query_id"]: {"name": NAME, "user": u} for u in read_units(input_path)}
    records = []
    for unit in units:
        qid = unit["query_id"]
        seen, _ = policy_view(unit)
        summary = None
        if context == "memory-summary":
            if qid not in summary_of:
                raise InputError(
                    f"{summaries}: no summary for query {qid}", "summarise every query of the split"
                )
            summary = summary_of[qid]
        info = {
            "query_id": qid,
            "user_id": unit["user_id"],
            "category": unit["category"],
            "query": unit["query"],
            "situation": unit["situation"],
            "persona": unit["profile"] or "",
            "memories": unit["memories"],  # the user's own: the judge reads who they really are
            "big_five": unit["big_five"],
        }
        if criteria is not None:
            if qid not in criteria:
                raise InputError(
                    f"{criteria_file}: no criteria for query {qid}", "run `personaemp criteria` on it"
                )
            info["criteria"] = criteria[qid]
        if dialogues:
            info["interaction_kwargs"] = simulated[qid]
        records.append({"prompt": build_messages(seen, context, rag_k, prompt, summary), "info": info})
    return input_path, records


def write_export(
    splits: Path,
    output: Path,
    *,
    format: str = "trl",  # noqa: A002 - the option's name
    data_source: str = "personaemp",
    **view: Any,
) -> dict[str, Any]:
    """Write the export; returns what was written (rows, format, path, input). `view`:
    export_rows' options (split, part, context, rag_k, mismatch_seed, summaries, criteria_file,
    dialogues)."""
    if format not in FORMATS:
        raise InputError(f"--format takes {', '.join(FORMATS)}, not {format!r}")
    input_path, records = export_rows(splits, **view)
    chosen = inspect.signature(export_rows).bind(splits, **view)
    chosen.apply_defaults()  # the part and context the rows were made for, defaults included
    part, context = chosen.arguments["part"], chosen.arguments["context"]
    if format == "trl":
        import msgspec

        with atomic_output(output) as handle:
            for record in records:
                handle.write(msgspec.json.encode({"prompt": record["prompt"], **record["info"]}) + b"\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = [
            {
                "data_source": data_source,
                "prompt": record["prompt"],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": ""},  # the judge needs no answer
                "extra_info": {"index": index, "split": part, "context": context, **record["info"]},
            }
            for index, record in enumerate(records)
        ]
        table = pa.Table.from_pylist(rows)
        with atomic_output(output) as handle:
            pq.write_table(table, handle)
    return {"rows": len(records), "format": format, "output": str(output), "input": str(input_path)}


# --- from options (the command and pe.*) ----------------------------------------------------------


def from_options(options, console) -> dict:
    """`personaemp export` on its options."""
    return write_export(
        options.splits, options.output_path, format=options.format, split=options.split,
        part=options.part, context=options.context, rag_k=options.rag_k,
        mismatch_seed=options.mismatch_seed, summaries=options.summaries,
        criteria_file=options.criteria, data_source=options.data_source, dialogues=options.dialogues,
    )  # fmt: skip


def print_summary(made, console) -> None:
    """`personaemp export`'s one line: rows, format, where."""
    console.print(f"wrote {made['rows']} rows ({made['format']}) to {made['output']}")
