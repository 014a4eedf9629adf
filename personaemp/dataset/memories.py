"""`personaemp extract-memories`: AlpsBench-style memories from conversation logs.

The memory step AlpsBench's annotators did by hand, done by an LLM so that a researcher's own
logs (WildChat, LMSYS-Chat, product chat exports, ShareGPT, a CSV of turns) can go through
`filter` -> `infer-persona` -> `gen-queries` as AlpsBench does.

Reading (no LLM): the log is read (sources/logs/), each user's history bounded, and the
users written to `conversations.jsonl` beside the output: the stage's units, so the run
resumes, shards and estimates as every LLM stage does.

One LLM step per user (EXTRACT_STEP): memories in AlpsBench's schema and ranked intents.
Each memory cites one of the user's own messages by id; the schema narrows the ids to this
user's (an enum), and `parse_extraction` checks them anyway: a memory citing no real message
is dropped, a quote not found in the message it cites is replaced by that message's text, a
label outside the taxonomy becomes UNMAPPED with the label as its suggestion. A reply whose
every memory was dropped is re-asked, and the user fails as `ungrounded` if it stays so.

The output rows have the AlpsBench raw-export shape (`sessions`, `memory_items`,
`intents_ranked` at the top level), which `filter` reads unchanged.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from personaemp.aio import sync_twin
from personaemp.dataset.taxonomy import TAXONOMY, UNMAPPED, label_family
from personaemp.errors import InputError
from personaemp.io import ErrorPolicy, file_sha256, iter_jsonl, read_stage_rows
from personaemp.llm.step import RejectedReply, Step, edit_schema, id_choice
from personaemp.prompts import Prompt, load_prompt
from personaemp.records import Record, Source
from personaemp.shards import failures_path, sharded_pick
from personaemp.sources.logs import Bounds, bound_user, read_log
from personaemp.summaries import print_run_report

STAGE = "extract-memories"
CONVERSATIONS = "conversations.jsonl"  # the units, beside the output
PREDICTIONS = "alpsbench_predictions.jsonl"  # --alpsbench-predictions, beside the output
MAX_MEMORIES = 12
QUOTE_TEXT = 300  # characters of a message kept as evidence when the quote is not in it

# Why people come to the assistant. The first eight are the families the filter's [intents]
# gate keeps (default_rules.toml); the rest are the task families it turns away.
INTENT_CATEGORIES = (
    "Emotional Support", "Personal Advice", "Relationship Advice", "Career Advice",
    "Decision Support", "Self Improvement", "Reflection and Insight", "Conversational Engagement",
    "Technical and Professional Intent", "Information Seeking", "Creative Writing",
    "Education and Learning", "Translation and Editing", "Entertainment and Games", "Other",
)  # fmt: skip
TIME_SCOPES = ("long_term", "short_term", "past", "recent", "current", "future", "unknown")

Label = Literal[(*TAXONOMY, UNMAPPED)]  # type: ignore[valid-type]
IntentCategory = Literal[INTENT_CATEGORIES]  # type: ignore[valid-type]
TimeScope = Literal[TIME_SCOPES]  # type: ignore[valid-type]


# --- reply model --------------------------------------------------------------------------------


class EvidenceReply(BaseModel):
    turn: str = Field(description="the id of the message, e.g. t4")
    quote: str


class MemoryReply(BaseModel):
    type: Literal["direct", "indirect"]
    label: Label
    label_suggestion: str | None
    value: str
    evidence: EvidenceReply
    confidence: float = Field(ge=0, le=1)
    emotion: str | None
    time_scope: TimeScope


class IntentReply(BaseModel):
    intent_category: IntentCategory
    intent_subtype: str


class ExtractionReply(BaseModel):
    memory_items: list[MemoryReply] = Field(max_length=MAX_MEMORIES)
    intents_ranked: list[IntentReply] = Field(max_length=3)


EXTRACT_STEP = Step("extract_memories", ExtractionReply, prompt="extract_memories", max_tokens=3000)
STEPS = (EXTRACT_STEP,)


# --- the unit: one user's bounded conversations ------------------------------------------------


class ConversationTurn(Record):
    utterance_index: int
    role: str
    text: str


class ConversationSession(Record):
    session_id: str
    timestamp: str | None = None
    turns: list[ConversationTurn]


class Conversations(Record):
    """A line of conversations.jsonl (sources.logs.LogUser.as_row)."""

    user_id: str
    source: Source
    user_id_given: bool = True
    sessions: list[ConversationSession]
    bounds: dict[str, int] = {}


@dataclass(frozen=True)
class Message:
    """A user message as the prompt shows it: its id, and where it is in the log."""

    turn_id: str
    session_id: str
    utterance_index: int
    text: str
    timestamp: str | None


def user_messages(unit: Conversations) -> list[Message]:
    """The user's own messages, oldest first, numbered t1, t2, ..."""
    found = []
    for session in unit.sessions:
        for turn in session.turns:
            if turn.role == "user":
                found.append(
                    Message(
                        f"t{len(found) + 1}", session.session_id, turn.utterance_index, turn.text,
                        session.timestamp,
                    )
                )  # fmt: skip
    return found


def render_dialogue(unit: Conversations, messages: Sequence[Message]) -> str:
    lines, session = [], None
    for number, message in enumerate(messages):
        if message.session_id != session:
            session = message.session_id
            when = f", {message.timestamp}" if message.timestamp else ""
            lines.append(f"{'' if not number else chr(10)}Conversation {session}{when}:")
        lines.append(f"[{message.turn_id}] {message.text}")
    return "\n".join(lines)


def build_extraction_messages(unit: Conversations, prompt: Prompt) -> list[dict[str, str]]:
    return prompt.render(
        taxonomy="\n".join(f"- {label}" for label in TAXONOMY),
        intents="\n".join(f"- {category}" for category in INTENT_CATEGORIES),
        dialogue=render_dialogue(unit, user_messages(unit)),
    )


def extraction_schema(unit: Conversations, shared: bool = False) -> dict[str, Any]:
    """The reply schema with evidence.turn narrowed to this user's message ids (unless
    `shared`: see id_choice)."""
    ids = [message.turn_id for message in user_messages(unit)]
    path = ("$defs", "EvidenceReply", "properties", "turn")
    return edit_schema(EXTRACT_STEP.schema, path, id_choice(ids, shared))


# --- parse: the checks ---------------------------------------------------------------------------


def _squash(text: str) -> str:
    return " ".join(text.split()).casefold()


@dataclass
class ExtractionChecks:
    """What the deterministic checks changed in a reply (kept with the row, summed in the summary)."""

    proposed: int = 0
    kept: int = 0
    dropped_unknown_turn: int = 0  # cites no message of this user
    dropped_empty: int = 0  # no value
    dropped_duplicate: int = 0  # the same value on the same message twice
    quotes_replaced: int = 0  # the quote is not in the message: its text is the evidence
    labels_unmapped: int = 0  # a label outside the taxonomy: UNMAPPED, the label as its suggestion

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def parse_extraction(
    unit: Conversations, reply: ExtractionReply
) -> tuple[list[dict], list[dict], ExtractionChecks]:
    """(memory_items, intents_ranked, checks): memories in AlpsBench's shape, every one citing
    a real message of this user. RejectedReply("ungrounded") when memories were proposed and
    none is left."""
    messages = {message.turn_id: message for message in user_messages(unit)}
    checks = ExtractionChecks(proposed=len(reply.memory_items))
    items, seen = [], set()
    for proposed in reply.memory_items:
        message = messages.get(proposed.evidence.turn.strip())
        value = " ".join(proposed.value.split())
        if message is None:
            checks.dropped_unknown_turn += 1
            continue
        if not value:
            checks.dropped_empty += 1
            continue
        if (message.turn_id, value.casefold()) in seen:
            checks.dropped_duplicate += 1
            continue
        seen.add((message.turn_id, value.casefold()))
        quote = proposed.evidence.quote.strip()
        if not quote or _squash(quote) not in _squash(message.text):
            checks.quotes_replaced += 1
            quote = message.text if len(message.text) <= QUOTE_TEXT else message.text[: QUOTE_TEXT - 1] + "…"
        label, suggestion = proposed.label, (proposed.label_suggestion or "").strip() or None
        if label not in TAXONOMY and label != UNMAPPED:  # only when the schema was not enforced
            checks.labels_unmapped += 1
            label, suggestion = UNMAPPED, suggestion or str(label)
        if label != UNMAPPED:
            suggestion = None
        items.append(
            {
                "memory_id": f"m{len(items) + 1}",
                "type": proposed.type,
                "label": label,
                "label_suggestion": suggestion,
                "value": value,
                "reasoning": None,
                "evidence": {
                    "session_id": message.session_id,
                    "utterance_index": message.utterance_index,
                    "text": quote,
                },
                "confidence": proposed.confidence,
                "time_scope": proposed.time_scope,
                "emotion": (proposed.emotion or "").strip() or None,
                "preference_attitude": None,
                "updated_at": message.timestamp,
            }
        )
    checks.kept = len(items)
    if checks.proposed and not items:
        raise RejectedReply(
            "ungrounded", f"none of the {checks.proposed} memories cites one of the user's message ids"
        )
    intents = [
        {"intent_category": intent.intent_category, "intent_subtype": " ".join(intent.intent_subtype.split())}
        for intent in reply.intents_ranked
    ]
    return items, intents, checks


def output_row(unit: Conversations, items: list[dict], intents: list[dict], checks, provenance) -> dict:
    """The raw-export record `filter` reads: the user's sessions, memory_items, intents_ranked."""
    return {
        "user_id": unit.user_id,
        "benchmark_id": unit.source.benchmark_id,
        "line_index": unit.source.line_index,
        "source": unit.source.model_dump(mode="json"),
        "sessions": [session.model_dump(mode="json") for session in unit.sessions],
        "memory_items": items,
        "intents_ranked": intents,
        "extraction": checks.as_dict(),
        "provenance": provenance.model_dump(mode="json"),
    }


# --- reading the log into units -------------------------------------------------------------------


@dataclass
class ReadReport:
    """What reading the log did: users found, what was left out or cut, the caps used."""

    input: str
    format: str
    users: int = 0
    conversations: int = 0
    user_ids_given: bool = True  # False: no user id in the data, each conversation is a user
    bad_rows_skipped: int = 0
    skipped_rows: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # duplicates, empty conversations, turns cut, ...
    bounds: dict[str, int] = field(default_factory=dict)


# The counts of reading (sources.logs) shown on the summary's read line, in words; the others
# are what the bounds cut.
READ_COUNTS = {
    "duplicate_conversations": "duplicate conversations kept once",
    "duplicate_rows": "repeated rows left out",
    "session_ids_repeated": "conversation ids repeated with other turns (renamed <id>#2, ...)",
    "user_ids_merged": 'user ids given as a number and as text (1 and "1": one user)',
    "sessions_without_time": "conversations without a time (first in their user's order)",
}


def write_conversations(
    source: Path,
    target: Path,
    *,
    fmt: str = "auto",
    bounds: Bounds | None = None,
    on_error: str = "fail",
    user_field: str | None = None,
    columns: dict[str, str | None] | None = None,
    time_format: str | None = None,
) -> ReadReport:
    """Read a log, bound every user's history and write the users to `target` (one per line).

    Nothing is replaced when a bad row stops the run. When the content is what `target`
    holds already, the file is left as it is (shards of one run all read it)."""
    import msgspec

    from personaemp.sources.logs import detect_log_format

    policy = ErrorPolicy(on_error)
    bounds = bounds or Bounds()
    fmt = detect_log_format(source) if fmt == "auto" else fmt
    report = ReadReport(input=str(source), format=fmt, bounds=bounds.as_dict())
    users = read_log(
        source, policy, fmt, user_field=user_field, columns=columns or {}, time_format=time_format
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    try:
        with temporary.open("wb") as out:
            for user in users:
                user = bound_user(user, bounds)
                report.users += 1
                report.conversations += len(user.sessions)
                report.user_ids_given = report.user_ids_given and user.id_given
                for name, value in user.counts.items():
                    report.counts[name] = report.counts.get(name, 0) + value
                line = msgspec.json.encode(user.as_row()) + b"\n"
                digest.update(line)
                out.write(line)
        if not report.users:
            raise InputError(f"{source}: no conversation with a user message", "check --input and --format")
        report.bad_rows_skipped = len(policy.skipped)
        report.skipped_rows = policy.skipped[:20]
        if target.is_file() and file_sha256(target) == digest.hexdigest():
            temporary.unlink()
        else:
            os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
    return report


def conversations_path(output: Path) -> Path:
    return output.with_name(CONVERSATIONS)


# --- the stage ------------------------------------------------------------------------------------


@dataclass
class MemorySummary:
    read: ReadReport | None
    users_in: int
    with_memories: int = 0
    without_memories: int = 0
    memories: int = 0
    labels: dict[str, int] = field(default_factory=dict)  # label family -> memories
    checks: dict[str, int] = field(default_factory=dict)
    gold: dict[str, Any] | None = None  # --compare-gold figures


async def aextract_memories(
    input_path: Path,
    output_path: Path,
    settings,
    *,
    fmt: str = "auto",
    bounds: Bounds | None = None,
    on_error: str = "fail",
    user_field: str | None = None,
    columns: dict[str, str | None] | None = None,
    time_format: str | None = None,
    limit: int | None = None,
    users: Sequence[str] | None = None,
    retry_failed: bool = False,
    full: bool | None = None,
    shard: str | None = None,
    compare_gold: Path | None = None,
    match_threshold: float = 0.3,
    alpsbench_predictions: bool = False,
    console=None,
):
    """Extract memories for every user of the log `input_path`; returns the StageResult
    (`.report`: the run report, `.summary`: what it read and made), as `pe.extract_memories`.

    The users are first written to conversations.jsonl beside `output_path` (under a temporary
    folder with --estimate, which writes nothing); the cache and run report go to the work
    folder (`settings.work_dir`), named on the console when it is not beside the output.
    `compare_gold`: an AlpsBench reference_output.jsonl; the figures go to gold_comparison.json
    beside the output.
    `alpsbench_predictions`: also write alpsbench_predictions.jsonl beside the output, the
    memories in the shape AlpsBench's task1 scorer reads."""
    import tempfile

    from personaemp.llm.stage import arun_llm_stage

    input_path, output_path = Path(input_path), Path(output_path)
    with tempfile.TemporaryDirectory(prefix="personaemp-estimate-") as scratch:
        units_path = (
            conversations_path(output_path) if not settings.estimate else Path(scratch) / CONVERSATIONS
        )
        read = write_conversations(
            input_path, units_path, fmt=fmt, bounds=bounds, on_error=on_error, user_field=user_field,
            columns=columns, time_format=time_format,
        )  # fmt: skip
        if console is not None:
            warn_about_reading(read, console)
        plan = memory_stage(
            units_path, output_path, limit=limit, users=users, retry_failed=retry_failed, full=full,
            shard=shard,
        )  # fmt: skip
        report = await arun_llm_stage(plan, settings=settings, console=console)
    summary = summarize(plan.output, plan.picked(), read)
    waiting = bool(report.batch and report.batch["files"])  # a batch round to come
    if not settings.estimate and not waiting:
        if compare_gold is not None:
            from personaemp.dataset.memory_gold import compare_with_gold, write_comparison

            figures = compare_with_gold(plan.output, Path(compare_gold), match_threshold, plan.picked())
            write_comparison(figures, output_path.with_name("gold_comparison.json"))
            summary.gold = figures
        if alpsbench_predictions:
            from personaemp.dataset.memory_gold import write_predictions

            gold = Path(compare_gold) if compare_gold is not None else None
            write_predictions(plan.output, output_path.with_name(PREDICTIONS), gold)
    return extract_result(report, summary, output_path, compare_gold, alpsbench_predictions)


extract_memories = sync_twin(aextract_memories)


def memory_stage(
    units_path: Path,
    output_path: Path,
    *,
    limit: int | None = None,
    users: Sequence[str] | None = None,
    retry_failed: bool = False,
    full: bool | None = None,
    shard: str | None = None,
):
    """The stage as an LLMStage over conversations.jsonl (`run` calls this once the log is read)."""
    from personaemp.llm.stage import LLMStage

    rows = read_stage_rows(units_path, Conversations, kind="conversations")[0]
    name, output_path, rows, selected = sharded_pick(
        STAGE, output_path, rows, shard, units_path, limit=limit, users=users
    )
    prompt = load_prompt(EXTRACT_STEP.prompt)
    hashes = {EXTRACT_STEP.name: prompt.hash}

    def make_work(engine):
        async def work(row: dict) -> dict:
            unit = Conversations.model_validate(row)
            result = await engine.call(
                EXTRACT_STEP,
                build_extraction_messages(unit, prompt),
                schema=extraction_schema(unit, engine.shared_schemas),
                parse=lambda reply: parse_extraction(unit, reply),
            )
            items, intents, checks = result.parsed
            return output_row(unit, items, intents, checks, engine.provenance(hashes))

        return work

    return LLMStage(
        name, rows, make_work, "user_id", output_path,
        fingerprint=lambda engine: engine.fingerprint(EXTRACT_STEP, prompt.hash),
        steps=STEPS, selected=selected, full=full, input_path=units_path, retry_failed=retry_failed,
        failures=failures_path(output_path, STAGE),
    )  # fmt: skip


def summarize(output_path: Path, wanted: set[str], read: ReadReport | None = None) -> MemorySummary:
    summary = MemorySummary(read=read, users_in=len(wanted))
    if not output_path.exists():
        return summary
    labels: Counter = Counter()
    checks: Counter = Counter()
    for _, _, row in iter_jsonl(output_path, ErrorPolicy("fail")):
        if str(row["user_id"]) not in wanted:
            continue
        items = row.get("memory_items") or []
        summary.memories += len(items)
        if items:
            summary.with_memories += 1
        else:
            summary.without_memories += 1
        labels.update(label_family(m.get("label"), m.get("label_suggestion")) for m in items)
        checks.update(row.get("extraction") or {})
    summary.labels, summary.checks = dict(labels.most_common()), dict(checks)
    return summary


# --- from options (the command, pe.* and `run`) ---------------------------------------------------


def extract_args(options) -> dict[str, Any]:
    """aextract_memories' arguments from the [extract] options (ExtractOptions)."""
    columns = {
        "user": options.user_column, "session": options.session_column, "order": options.order_column,
        "role": options.role_column, "text": options.text_column, "time": options.time_column,
    }  # fmt: skip
    bounds = Bounds(
        max_sessions=options.max_sessions, max_turns=options.max_turns,
        max_turn_chars=options.max_turn_chars, max_user_chars=options.max_user_chars,
    )  # fmt: skip
    return {
        "fmt": options.format, "bounds": bounds, "on_error": options.on_error,
        "user_field": options.user_field, "columns": columns, "time_format": options.time_format,
        "limit": options.limit,
        "users": options.users, "shard": options.shard,
        "compare_gold": options.compare_gold, "match_threshold": options.match_threshold,
        "alpsbench_predictions": options.alpsbench_predictions,
    }  # fmt: skip


def extract_result(report, summary, output: Path, compare_gold: Path | None, alpsbench_predictions: bool):
    """The StageResult of extract-memories: its counts and the files it wrote beside the output."""
    from personaemp import results, summaries

    result = results.of_llm_stage(report, summary)
    if summary is None:  # --estimate, a batch round
        return result
    result.counts["memories"] = summary.memories
    result.files["conversations"] = conversations_path(output)
    if compare_gold is not None and summary.gold is not None:
        result.files["gold_comparison"] = output.with_name("gold_comparison.json")
    if alpsbench_predictions and summaries.wrote_rows(report):
        result.files["alpsbench_predictions"] = output.with_name(PREDICTIONS)
    return result


def warn_about_reading(read: ReadReport, console) -> None:
    """A line for each way the log's users may not be what it meant (before the LLM work)."""
    if not read.user_ids_given:
        console.print(
            f"[yellow]{read.input}: no user id in the data: each conversation is its own user "
            "(name the field with --user-field)[/]"
        )
    merged = read.counts.get("user_ids_merged", 0)
    if merged:
        console.print(
            f'[yellow]{read.input}: {merged} user ids came both as a number and as text (1 and "1"): '
            "each read as one user (1.0 stays apart from 1)[/]"
        )


def print_memories(summary: MemorySummary, console) -> None:
    """What extract-memories read, the memories it made and how they compare to the gold."""
    read = summary.read
    if read is not None:
        cut = ", ".join(
            f"{name.replace('_', ' ')} {value}"
            for name, value in sorted(read.counts.items())
            if name not in READ_COUNTS
        )
        caps = ", ".join(f"{name} {value}" for name, value in read.bounds.items())
        noted = [f"{read.counts[n]} {words}" for n, words in READ_COUNTS.items() if read.counts.get(n)]
        console.print(
            f"read: {read.users} users, {read.conversations} conversations ({read.format})"
            + "".join(f"; {line}" for line in noted)
            + (f"; {read.bad_rows_skipped} bad rows skipped" if read.bad_rows_skipped else "")
        )
        console.print(f"bounds: {caps}" + (f"; cut: {cut}" if cut else ""))
        if not read.user_ids_given:
            console.print("no user id in the data: each conversation is its own user")
    console.print(
        f"memories: {summary.memories} for {summary.with_memories} users "
        f"({summary.without_memories} users with none); checks: "
        + ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in summary.checks.items())
    )
    if summary.labels:
        console.print("label families: " + ", ".join(f"{k} {v}" for k, v in summary.labels.items()))
    if summary.gold is not None:
        overall, users = summary.gold["overall"], summary.gold["users_compared"]
        console.print(
            f"against the gold ({users} users): precision {overall['precision']:.3f}, "
            f"recall {overall['recall']:.3f}, F1 {overall['f1']:.3f} (gold_comparison.json)"
        )


async def from_options(options, console, settings, retry=False, full=None):
    """`personaemp extract-memories` on its [extract] options (ExtractOptions)."""
    return await aextract_memories(
        Path(options.input), options.output, settings, **extract_args(options), retry_failed=retry,
        full=full, console=console,
    )  # fmt: skip


def print_summary(result, console) -> None:
    """`personaemp extract-memories`' summary: the run report, then what it read and made."""
    if print_run_report(result, console):
        print_memories(result.summary, console)
