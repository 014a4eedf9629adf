"""The build stages' TOML sections, [extract] [filter] [persona] [queries] [dialogues] [split]
[stats] [push]: a field is an option, and its flag, key, env var and docs row follow from it
(personaemp/options.py). Here, not in the stage modules, which import the engine when loaded:
`personaemp --help` reads every command's options and stays light."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from personaemp.options import Opt, OptionProblem, Section, declare
from personaemp.shared_options import (
    PROCESSED,
    RAW_INPUT,
    Categories,
    Checks,
    Files,
    Force,
    MismatchSeed,
    Names,
    OnError,
    PersonaChecks,
    RagK,
    Shard,
    SplitsFolder,
    Users,
    _some_checks,
)
from personaemp.vocabulary import CHECKS, PERSONA_CHECKS, Context, Format, LogFormat, SeekerChoice


@declare("extract")
class ExtractOptions(Section):
    """[extract]: extract-memories, the stage before `filter` when the input is a conversation log."""

    input: Annotated[
        str,
        Opt.input(
            "Conversation log: WildChat parquet/JSONL, OpenAI-messages JSONL, ShareGPT JSON/JSONL, a "
            "CSV/parquet table of turns, or an AlpsBench task1 folder (its dialogues only).",
            derive="paths.input",
        ),
    ] = RAW_INPUT
    format: Annotated[LogFormat, Opt("Log format (auto: detected from the file and its first record).")] = (
        "auto"
    )
    output: Annotated[
        Path,
        Opt.output(
            "Users with their extracted memories, in the AlpsBench raw-export shape `filter` reads; "
            "conversations.jsonl (the users as read) goes beside it.",
            derive="processed:memories.jsonl",
            beside=(
                "conversations.jsonl",
                "extract-memories.failures.jsonl",
                "gold_comparison.json",
                "alpsbench_predictions.jsonl",
            ),
        ),
    ] = PROCESSED / "memories.jsonl"
    user_field: Annotated[
        str | None,
        Opt(
            "Field holding the user id (messages, ShareGPT: default user_id or user; WildChat: "
            "hashed_ip). Without one, each conversation is its own user.",
            metavar="NAME",
        ),
    ] = None
    user_column: Annotated[str, Opt("Table: the column of user ids.", metavar="NAME")] = "user_id"
    session_column: Annotated[
        str | None, Opt("Table: the column of conversation ids (none: one session per user).", metavar="NAME")
    ] = "session_id"
    order_column: Annotated[
        str, Opt("Table: the column of turn numbers within a session.", metavar="NAME")
    ] = "turn"
    role_column: Annotated[str, Opt("Table: the column of roles (user, assistant).", metavar="NAME")] = "role"
    text_column: Annotated[str, Opt("Table: the column of turn texts.", metavar="NAME")] = "text"
    time_column: Annotated[str | None, Opt("Table: a column of timestamps (optional).", metavar="NAME")] = (
        None
    )
    time_format: Annotated[
        str | None,
        Opt(
            "strptime format of text timestamps (e.g. %m/%d/%Y %H:%M); without it, ISO 8601 or seconds "
            "(milliseconds from 1e11 up) since 1970. A time without a zone is UTC.",
            metavar="FORMAT",
        ),
    ] = None
    max_sessions: Annotated[int, Field(ge=1), Opt("Latest sessions kept per user.")] = 50
    max_turns: Annotated[
        int, Field(ge=1), Opt("Latest turns kept per user, all roles (AlpsBench's longest: 249).")
    ] = 249
    max_turn_chars: Annotated[
        int,
        Field(ge=200),
        Opt("Characters kept of a longer turn (its head and tail); code blocks cut first."),
    ] = 2000
    max_user_chars: Annotated[
        int, Field(ge=1000), Opt("Characters of the user's own messages per prompt (the latest kept).")
    ] = 24000
    on_error: OnError = "fail"
    compare_gold: Annotated[
        Path | None,
        Opt(
            "AlpsBench reference_output.jsonl: write precision, recall and F1 of the extracted memories "
            "against it (gold_comparison.json beside the output).",
            metavar="FILE",
            io="read",
        ),
    ] = None
    match_threshold: Annotated[
        float, Field(gt=0, le=1), Opt("--compare-gold: the value overlap (token F1) a match needs.")
    ] = 0.3
    alpsbench_predictions: Annotated[
        bool,
        Opt(
            "Also write alpsbench_predictions.jsonl beside the output: the memories as AlpsBench's task1 "
            "scorer reads them (memory_items per session; with --compare-gold, the gold beside them)."
        ),
    ] = False
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N users.")] = None
    users: Users = None
    shard: Shard = None


@declare("filter")
class FilterOptions(Section):
    input: Annotated[
        str,
        Opt.input(
            "AlpsBench task1 folder, benchmark_data/ root, raw export file or folder, or hf:OWNER/NAME.",
            derive="paths.input",
            env="PERSONAEMP_INPUT",
        ),
    ] = RAW_INPUT
    format: Annotated[Format, Opt("Input format (auto: detected).")] = "auto"
    rules: Annotated[
        Path | None,
        Opt(
            "Rules TOML; each key it sets overrides the shipped default (see --show-rules).",
            metavar="FILE",
            io="read",
        ),
    ] = None
    output: Annotated[
        Path,
        Opt.output(
            "Kept users, one per line; filter_report.json goes beside it.",
            derive="processed:filtered.jsonl",
            beside=("filter_report.json",),
        ),
    ] = PROCESSED / "filtered.jsonl"
    benchmark_split: Annotated[
        str | None,
        Opt(
            "Split of a benchmark_data/ root (dev, validation, examples) or of a Hub dataset (train).",
            renamed_from="split",
        ),
    ] = None
    hf_config: Annotated[str | None, Opt("Config name of a Hub dataset.")] = None
    on_error: OnError = "fail"
    turns: Annotated[
        Literal["user", "all"],
        Opt("user: keep the user's own turns (what later stages read); all: keep assistant turns too."),
    ] = "user"
    force: Force = False


@declare("persona")
class PersonaOptions(Section):
    input: Annotated[Path, Opt.input("Filtered users (filter's output).", derive="filter.output")] = (
        PROCESSED / "filtered.jsonl"
    )
    output: Annotated[
        Path,
        Opt.output(
            "Personas, one per user.",
            derive="processed:personas.jsonl",
            beside=("infer-persona.failures.jsonl",),
        ),
    ] = PROCESSED / "personas.jsonl"
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N users.")] = None
    users: Users = None
    require_depth: Annotated[
        bool, Opt("Drop users the depth check turns away (--no-require-depth keeps grounded ones).")
    ] = True
    enforce: Annotated[
        PersonaChecks | None,
        Opt(
            "Checks a trait statement or Big Five rationale must pass, else the reply is asked "
            f"again (default: every check; all are recorded): {', '.join(PERSONA_CHECKS)}.",
            metavar="CHECKS",
        ),
    ] = None
    shard: Shard = None
    force: Force = False

    _enforce_names_a_check = field_validator("enforce")(_some_checks)


@declare("queries")
class QueriesOptions(Section):
    input: Annotated[Path, Opt.input("Personas (infer-persona's output).", derive="persona.output")] = (
        PROCESSED / "personas.jsonl"
    )
    output: Annotated[
        Path,
        Opt.output(
            "Accepted queries per user; rejected.jsonl goes beside it.",
            derive="processed:queries.jsonl",
            beside=("rejected.jsonl", "gen-queries.failures.jsonl"),
        ),
    ] = PROCESSED / "queries.jsonl"
    per_category: Annotated[int, Field(ge=1), Opt("Situations (so queries) per category per user.")] = 1
    categories: Annotated[
        Categories, Field(min_length=1), Opt("Query categories: a subset of ES, HEQ, SS.", metavar="CATS")
    ] = ["ES", "HEQ", "SS"]
    enforce: Annotated[
        Checks | None,
        Opt(
            f"Checks a query must pass (default: every check; all are recorded): {', '.join(CHECKS)}.",
            metavar="CHECKS",
        ),
    ] = None
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N eligible users.")] = None
    users: Users = None
    shard: Shard = None
    force: Force = False

    _enforce_names_a_check = field_validator("enforce")(_some_checks)


@declare("dialogues")
class DialoguesOptions(Section):
    input: Annotated[
        Path,
        Opt.input(
            "Accepted queries: gen-queries' output or a split file (one dialogue per query).",
            derive="queries.output",
        ),
    ] = PROCESSED / "queries.jsonl"
    output: Annotated[
        Path,
        Opt.output(
            "Dialogues, one per query.",
            derive="processed:dialogues.jsonl",
            beside=("gen-dialogues.failures.jsonl",),
        ),
    ] = PROCESSED / "dialogues.jsonl"
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N dialogues.")] = None
    per_user: Annotated[int | None, Field(ge=1), Opt("Only the first N queries of each user.")] = None
    max_turns: Annotated[
        int, Field(ge=1, le=20), Opt("Supporter turns at most; the user may end sooner.")
    ] = 6
    context: Annotated[
        Context,
        Opt("What the supporter sees besides the conversation, as for `respond --context`."),
    ] = "memory"
    rag_k: RagK = 3
    mismatch_seed: MismatchSeed = 0
    supporter_model: Annotated[
        str | None,
        Opt(
            "The model under test (default: --model; the simulator is always the LLM options' model).",
            env="PERSONAEMP_SUPPORTER_MODEL",
        ),
    ] = None
    supporter_base_url: Annotated[
        Names,
        Opt("The supporter's endpoint (default: the LLM options' endpoint; same key).",
            env="PERSONAEMP_SUPPORTER_BASE_URL", metavar="URL"),
    ] = []  # fmt: skip
    turn_attempts: Annotated[
        int,
        Field(ge=1, le=10),
        Opt("Replies asked per simulated turn that breaks a rule before the dialogue fails."),
    ] = 3
    character_check: Annotated[
        bool, Opt("Check each simulated turn with the LLM: in character, no invented facts.")
    ] = True
    voice: Annotated[
        int,
        Field(ge=0, le=20),
        Opt("The user's own real messages the simulated user is shown as how they write (0: none): the K "
            "newest, skipping code, pasted text and near-duplicates, each trimmed to 200 characters."),
    ] = 5  # fmt: skip
    seeker: Annotated[
        SeekerChoice,
        Opt(
            "How hard the simulated user is to help (prompts/seekers.md); auto: by its Big Five "
            "levels (the card shows the table).",
        ),
    ] = "cooperative"


@declare("split")
class SplitOptions(Section):
    input: Annotated[Path, Opt.input("Queries (gen-queries' output).", derive="queries.output")] = (
        PROCESSED / "queries.jsonl"
    )
    out_dir: Annotated[
        Path,
        Opt(
            "Folder of the splits and split_report.json.",
            ("--out-dir", "-o"),
            derive="processed:splits",
            io="folder",
            beside=("random", "ood", "split_report.json"),
        ),
    ] = PROCESSED / "splits"
    ood: Annotated[
        bool, Opt("Also the OOD split: one Big Five cluster held out (the paper publishes both).")
    ] = True
    seed: Annotated[int, Opt("Seed of the shuffle and of KModes.")] = 13
    test_size: Annotated[float, Field(gt=0, lt=1), Opt("Share of users in test (OOD: the target size).")] = (
        0.1
    )
    k: Annotated[
        int | None, Field(ge=2), Opt("Clusters; default: the elbow over k_min..k_max.", ("--k",))
    ] = None
    k_min: Annotated[int, Field(ge=2), Opt("Smallest k of the elbow sweep.")] = 2
    k_max: Annotated[int, Field(ge=2), Opt("Largest k of the elbow sweep.")] = 8
    holdout: Annotated[
        int | None, Field(ge=0), Opt("Cluster id to hold out; default: the size closest to test_size.")
    ] = None
    seeds: Annotated[int, Field(ge=1), Opt("KModes runs per k (the lowest cost is kept).")] = 5
    force: Force = False

    @model_validator(mode="after")
    def _k_range(self) -> SplitOptions:
        if self.k_min > self.k_max:
            raise OptionProblem("k_min", "must be at most {k_max}")
        return self


@declare("stats")
class StatsOptions(Section):
    processed: Annotated[
        Path,
        Opt(
            "Folder the stages wrote to (its manifest.json names their files): the build to describe.",
            ("--processed",),
            derive="paths.processed",
        ),
    ] = PROCESSED
    out_dir: Annotated[
        Path,
        Opt(
            "Folder of stats.json and the plots (figures/*.png).",
            derive="processed:stats",
            io="folder",
            beside=("stats.json", "figures"),
            renamed_from="out",
        ),
    ] = PROCESSED / "stats"
    force: Force = False


@declare("push")
class PushOptions(Section):
    splits: SplitsFolder = PROCESSED / "splits"
    repo_id: Annotated[
        str | None, Opt("Hub dataset repo OWNER/NAME; without one, a dry run.", metavar="OWNER/NAME")
    ] = None
    dry_run: Annotated[bool, Opt("Write the repository to --out-dir instead of pushing it.")] = False
    out_dir: Annotated[
        Path, Opt("Folder of a dry run.", derive="processed:dataset", io="folder", renamed_from="out")
    ] = PROCESSED / "dataset"
    private: Annotated[bool, Opt("Create the repo private.")] = False
    revision: Annotated[str | None, Opt("Branch to push to.")] = None
    include_dialogue: Annotated[bool, Opt("Also publish the users' own messages.")] = False
    criteria: Annotated[
        Path,
        Opt(
            "Criteria file (`personaemp criteria`); published as a `criteria` column when it exists.",
            ("--criteria",),
            derive="processed:criteria.jsonl",
            io="read",
        ),
    ] = PROCESSED / "criteria.jsonl"
    dialogues: Annotated[
        Files,
        Opt(
            "Dialogues (`personaemp gen-dialogues`), published as one `dialogues` config (its "
            "`supporter_model` column names the supporter); repeat for several supporters' runs. "
            "Without the flag: the default file, when it exists.",
            metavar="FILE",
            derive="processed:dialogues.jsonl",
            io="read",
        ),
    ] = [PROCESSED / "dialogues.jsonl"]
    dialogues_report: Annotated[
        Path | None,
        Opt(
            "An `evaluate --dialogues` report of these dialogues: the card quotes its behaviour "
            "counts per 1,000 words, tracking rate and session reward per supporter and seeker style.",
            metavar="FILE",
            io="read",
        ),
    ] = None
    force: Force = False

    @field_validator("repo_id")
    @classmethod
    def _owner_name(cls, value: str | None) -> str | None:
        if value is not None and value.count("/") != 1:
            raise OptionProblem("repo_id", f"must look like OWNER/NAME, not {value!r}")
        return value

    @model_validator(mode="after")
    def _one_target(self) -> PushOptions:
        if self.dry_run and self.repo_id:
            raise OptionProblem("dry_run", "and {repo_id} exclude each other", "give one of them")
        return self

    @property
    def is_dry_run(self) -> bool:
        """Without a repo id there is nothing to push to: a dry run into `out_dir`."""
        return self.dry_run or not self.repo_id
