"""[criteria], [respond], [evaluate] and [table], the evaluation commands' options, one pydantic
field per option (personaemp/options.py derives the rest). Outside the stages' modules, which
load the LLM engine, so the CLI's help is quick."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from personaemp.options import Opt, OptionProblem, Section, declare
from personaemp.secrets import shown_assignment
from personaemp.shared_options import (
    DEFAULT_LAYOUT,
    JUDGE_DEFAULTS,
    PROCESSED,
    Layout,
    MismatchSeed,
    Names,
    OfASplit,
    RagK,
)
from personaemp.vocabulary import Context, TableFormat


@declare("criteria")
class CriteriaOptions(Section):
    input: Annotated[
        Path,
        Opt.input("Queries (gen-queries' output, or a split file).", derive="queries.output"),
    ] = PROCESSED / "queries.jsonl"
    output: Annotated[
        Path,
        Opt.output(
            "Criteria per query and dimension.",
            derive="processed:criteria.jsonl",
            beside=("criteria.failures.jsonl",),
        ),
    ] = PROCESSED / "criteria.jsonl"
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N queries.")] = None
    users: Annotated[
        Names | None,
        Field(min_length=1),
        Opt("Only the queries of these user ids (repeat or comma-separate).", metavar="ID"),
    ] = None
    layout: Layout = DEFAULT_LAYOUT


@declare("respond")
class RespondOptions(OfASplit):
    context: Annotated[
        Context,
        Opt(
            "What the policy sees besides the query: nothing (w/o memory), the numbered memories "
            "(the paper's input), a summary of the user it first writes from them (the Memory "
            "baseline), the rag_k memories most similar to the query (RAG), another user's "
            "memories (mismatched memory), or the persona (the judge reads it too)."
        ),
    ] = "memory"
    rag_k: RagK = 3
    mismatch_seed: MismatchSeed = 0
    output: Annotated[
        Path | None,
        Opt.output(
            "Responses, one per query (default: responses-<split>-<part>-<context>.jsonl beside the "
            "splits folder; name one per model).",
            beside=("{stem}.failures.jsonl",),
        ),
    ] = None
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N queries.")] = None

    @property
    def output_path(self) -> Path:
        return self.output or self.splits.parent / f"responses-{self.split}-{self.part}-{self.context}.jsonl"


class JudgeSpec(Section):
    """One judge of a panel ([[evaluate.judges]], or --judge "name=a;model=m;base_url=URL;key_env=VAR")."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][\w.-]*$"), Opt("Name in reports and file names.")]
    model: Annotated[str | None, Opt("Judge model (default: --judge-model, else --model).")] = None
    base_url: Annotated[str | None, Opt("Its endpoint (default: --base-url).")] = None
    key_env: Annotated[
        str | None, Opt("Environment variable holding its API key (default: OPENAI_API_KEY).")
    ] = None


def _judge_specs(value: Any) -> Any:
    """TOML tables pass through; a flag's "key=value;key=value" becomes one."""
    if isinstance(value, str | dict):
        value = [value]
    if not isinstance(value, list | tuple):
        return value
    found = []
    for item in value:
        if isinstance(item, str):
            table: dict[str, str] = {}
            for part in filter(None, (p.strip() for p in item.split(";"))):
                key, sep, text = part.partition("=")
                if not sep:
                    shown = ";".join(shown_assignment(p.strip()) for p in item.split(";"))
                    raise OptionProblem(
                        "judges", f"takes name=NAME;model=MODEL;base_url=URL;key_env=VAR, not {shown!r}"
                    )
                table[key.strip()] = text.strip()
            item = table
        found.append(item)
    return found


@declare("evaluate")
class EvaluateOptions(OfASplit):
    responses: Annotated[
        Names,
        Opt(
            "Responses file of a system (query_id, response per line); repeat for several, each "
            "named by its file name.",
            metavar="FILE",
            io="read",
        ),
    ] = []
    dialogues: Annotated[
        Names,
        Opt(
            "Dialogues of a system (`personaemp gen-dialogues`), scored per session instead of "
            "responses: the emotion trajectory and PERM over the supporter's side; repeat for "
            "several, each named by its file name.",
            metavar="FILE",
            io="read",
        ),
    ] = []
    per_turn: Annotated[bool, Opt("With --dialogues: PERM for each supporter turn too.")] = False
    behaviours: Annotated[
        bool,
        Opt(
            "With --dialogues: name each supporter turn's risky and protective behaviours, each "
            "with its quote, and whether it acknowledges the user's emotion first (one judge "
            "request per turn)."
        ),
    ] = True
    all_dialogues: Annotated[
        bool,
        Opt(
            "With --dialogues: score each system on all of its own dialogues, not only the "
            "queries every system has one for (the table says: not comparable)."
        ),
    ] = False
    criteria: Annotated[
        Path,
        Opt(
            "Fixed criteria (`personaemp criteria`).",
            derive="criteria.output",
            io="read",
            renamed_from="criteria_file",
        ),
    ] = PROCESSED / "criteria.jsonl"
    judge_model: Annotated[str | None, Opt("Judge model (default: --model).")] = None
    judges: Annotated[
        list[JudgeSpec],
        BeforeValidator(_judge_specs),
        Opt(
            "A judge of a panel, repeatable: every system is judged by each, side by side, with how "
            'far they agree. "name=NAME;model=MODEL;base_url=URL;key_env=VAR" (only name required; '
            "TOML: [[evaluate.judges]] tables).",
            ("--judge",),
            metavar="SPEC",
        ),
    ] = []
    missing: Annotated[
        Literal["skip", "floor"],
        Opt(
            "A query without a response: skip (the authors' rule: what their eval.py judges is judged "
            "- any non-empty text, the part after </think> - and the means are over those) or floor "
            "(no visible reply - none, blank, cut while reasoning - scores 1 and counts in the means)."
        ),
    ] = JUDGE_DEFAULTS.missing
    unreadable: Annotated[
        Literal["authors", "fail"],
        Opt(
            "A judgment that cannot be read after the re-asks. authors: a fixed judgment drops that "
            "dimension of that query from its mean, a dynamic one counts 3 of 5 (their reward); fail: "
            "the query fails (kept in the failures file, --retry-failed asks again), an unreadable "
            "sample of k is left out of its mean."
        ),
    ] = JUDGE_DEFAULTS.unreadable
    layout: Layout = JUDGE_DEFAULTS.layout
    dynamic: Annotated[bool, Opt("PereGRM: the judge writes its own criteria in each call.")] = (
        JUDGE_DEFAULTS.dynamic
    )
    samples: Annotated[int, Field(ge=1), Opt("Judgments averaged per dimension with --dynamic (@k).")] = (
        JUDGE_DEFAULTS.samples
    )
    bystander: Annotated[bool, Opt("Also the persona-blind bystander score B and the reward.")] = (
        JUDGE_DEFAULTS.bystander
    )
    reward_lambda: Annotated[
        float, Field(ge=0), Opt("lambda of reward = H + lambda * (B - 1).", ("--lambda",))
    ] = JUDGE_DEFAULTS.reward_lambda
    output: Annotated[
        Path,
        Opt.output(
            "Report (JSON); the scores go beside it (<name>.scores.jsonl).",
            derive="processed:evaluation/report.json",
            # a panel's judges each write <stem>.<judge>.json and its scores and failures
            beside=(
                "{stem}.scores.jsonl",
                "{stem}.failures.jsonl",
                "{stem}.*.json",
                "{stem}.*.scores.jsonl",
                "{stem}.*.failures.jsonl",
            ),  # fmt: skip
            renamed_from="report",
        ),
    ] = PROCESSED / "evaluation" / "report.json"

    @model_validator(mode="after")
    def _samples_need_dynamic(self) -> EvaluateOptions:
        if self.samples > 1 and not self.dynamic:
            raise OptionProblem("samples", "applies to {dynamic} judging", "add {dynamic}")
        return self

    @model_validator(mode="after")
    def _judges_named_once(self) -> EvaluateOptions:
        names = [judge.name for judge in self.judges]
        for name in names:
            if names.count(name) > 1:
                raise OptionProblem("judges", f"names {name!r} twice", "give each judge its own name")
        return self


@declare("table")
class TableOptions(Section):
    reports: Annotated[
        Names,
        Opt(
            "Report of `personaemp evaluate` (one per split: random, ood), repeatable; each judge "
            "of a report is a column group.",
            ("--report", "-r"),
            metavar="FILE",
            io="read",
        ),
    ] = []
    format: Annotated[TableFormat, Opt("Output format.")] = "markdown"
    output: Annotated[
        Path | None, Opt("Write the table here (default: print it).", ("--output", "-o"), io="write")
    ] = None
    harmonic: Annotated[bool, Opt("Add H (0-1) beside Avg in each group.")] = False
    digits: Annotated[int, Field(ge=0, le=6), Opt("Decimals shown.")] = 2
    judge: Annotated[
        str | None,
        Opt("Only this judge of a panel report (e.g. the paper's Table 2 from a Table 1 run).", ("--judge",)),
    ] = None
    systems: Annotated[
        Names | None,
        Field(min_length=1),
        Opt("Only these systems, in this order (repeat or comma-separate).", metavar="NAME"),
    ] = None
