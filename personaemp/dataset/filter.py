"""`personaemp filter`: keep users whose memories show personality and emotional experience."""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from personaemp import locks, manifest
from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy, atomic_output, write_json_atomic
from personaemp.language import LanguageWorker, load_in_background, release_model
from personaemp.manifest import record_stage
from personaemp.progress import emit
from personaemp.records import FilterMatch, Memory
from personaemp.results import StageResult, of_filter
from personaemp.rules import Rules, RuleSet, load_rules
from personaemp.sources import read_users
from personaemp.sources.normalize import SourceUser, decide_languages, settle_languages, unseen_languages

# Gates in the order they are applied; a dropped user is counted under the first it fails.
GATES = ("intents", "min_memories", "memory_labels", "language")
TOP_LABELS = 15
LANGUAGE_BATCH = 64  # kept users whose languages are decided together
WORKER_AFTER = 256  # kept users before their languages go to a second process (its start: ~1 s)
WORKER_AHEAD = 4  # batches the worker may have in hand: it never waits, memory stays bounded


@dataclass
class FilterReport:
    input: str
    output: str
    users_in: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(GATES, 0))
    bad_rows_skipped: int = 0
    skipped_rows: list[str] = field(default_factory=list)
    users_without_intents: int = 0
    memories_in: int = 0
    flagged_memories_dropped: int = 0
    matched_rules: dict[str, int] = field(default_factory=dict)
    top_labels_all: dict[str, int] = field(default_factory=dict)
    top_labels_kept: dict[str, int] = field(default_factory=dict)
    languages_kept: dict[str, int] = field(default_factory=dict)
    nobody_kept: str | None = None  # why, when users were read and none was kept
    # Set when the stage was skipped: its one line ("filter: unchanged since ..."), not saved.
    unchanged_since: str | None = None

    def saved(self, folder: Path | None = None) -> dict:
        """What filter_report.json holds; in a file of `folder`, the output relative to it
        when it lies there (a moved build names its own file)."""
        kept = {key: value for key, value in self.__dict__.items() if key != "unchanged_since"}
        if folder is not None:
            kept["output"] = manifest.stored(self.output, folder)
        return kept

    def balanced(self) -> bool:
        return self.users_in == self.kept + sum(self.dropped.values())


@dataclass
class Decision:
    """What the gates made of one user."""

    memories: list[Memory]  # the user's memories minus annotator-flagged ones
    flagged: int
    gate: str | None  # the gate that dropped the user; None when kept
    match: FilterMatch | None = None


def select_user(user: SourceUser, rules: RuleSet) -> Decision:
    """Apply the gates to one user; the language gate comes last as it is the costly one."""
    memories = [m for m in user.memories if not rules.is_flagged(m)]
    flagged = len(user.memories) - len(memories)
    matched_rules: list[str] = []
    if user.intents:
        intent_rule = rules.match_intents(user.intents)
        if intent_rule is None:
            return Decision(memories, flagged, "intents")
        matched_rules.append(intent_rule)
    if len(memories) < rules.rules.memories.min_memories:
        return Decision(memories, flagged, "min_memories")
    matched_ids = []
    for memory in memories:
        rule = rules.match_memory(memory)
        if rule:
            matched_ids.append(memory.memory_id)
            if rule not in matched_rules:
                matched_rules.append(rule)
    if len(matched_ids) < rules.rules.memories.min_matched_memories:
        return Decision(memories, flagged, "memory_labels")
    if not rules.language_allowed(user):
        return Decision(memories, flagged, "language")
    match = FilterMatch(
        matched_rules=matched_rules, matched_memory_ids=matched_ids, flagged_memories_dropped=flagged
    )
    return Decision(memories, flagged, None, match)


def _label_key(label: str) -> str:
    return "/".join(label.split("/")[:2])


def filter_users(
    source: str | Path,
    output: str | Path,
    *,
    fmt: str = "auto",
    rules_path: Path | None = None,
    split: str | None = None,
    hf_config: str | None = None,
    on_error: str = "fail",
    keep_turns: str = "user",
    report_path: Path | None = None,
    console: Console | None = None,
    on_kept: Callable[[bytes], None] | None = None,
    force: bool = False,
) -> StageResult:
    """Read users from `source`, write the kept ones to `output` (atomically); returns the
    StageResult (`.report`: the funnel, a FilterReport), as `pe.filter_users` does.

    `keep_turns`: "user" keeps only the user's own turns (all later stages need), "all"
    keeps assistant turns too. Nothing is written if the run stops on a bad row.
    `on_kept(line)`: each kept row's line as it is written (`run` streams them, streaming.py).
    When the input, rules, options and code are those of the last finished run and its
    output is as that run left it, nothing is read: the last report comes back, with its
    `unchanged_since` line (manifest.py); `force` runs it anyway.
    """
    if keep_turns not in ("user", "all"):
        raise InputError(f"--turns must be 'user' or 'all', not {keep_turns!r}")
    source, output = str(source), Path(output)  # a library caller may pass either
    stamp = filter_fingerprint(source, fmt, rules_path, split, hf_config, on_error, keep_turns, report_path)
    last = manifest.current("filter", output, stamp, force)
    if last is not None:
        return of_filter(_unchanged(last, output, on_kept), report_path)
    roles = ("user",) if keep_turns == "user" else None
    rules = RuleSet(load_rules(rules_path))
    policy = ErrorPolicy(on_error)
    users = read_users(source, policy, fmt=fmt, split=split, hf_config=hf_config)
    # Every kept user is written with a language: the model (about 0.7 s to load, LZMA and
    # copies that release the GIL) loads on the other core while the first users are read.
    load_in_background()
    report = FilterReport(input=source, output=str(output))
    all_labels, kept_labels, rules_hit, languages = Tally(), Tally(), Tally(), Tally()
    # Kept users wait here for their language, decided LANGUAGE_BATCH at a time (one pass of
    # the model for all: about half the cost per user). Their turns are read and decoded in
    # order, so a malformed one is met where it was; they are written in order.
    # `run` streams each kept row to its LLM stages as soon as it is kept: no waiting there.
    waiting: list[tuple[SourceUser, Decision, list[dict]]] = []
    batch = 1 if on_kept is not None else LANGUAGE_BATCH
    # Past WORKER_AFTER kept users, a big input: their languages go to a second process and
    # the reading goes on; batches come back, and are written, in order.
    worker: LanguageWorker | None = None
    in_flight: deque = deque()  # (batch, its histories to settle): sent to the worker, in order

    def write(rows: list[tuple[SourceUser, Decision, list[dict]]]) -> None:
        for user, decision, turns in rows:
            kept = user.to_user(decision.memories, decision.match, roles, turns)
            languages.add([kept.language or "unknown"])
            line = kept.model_dump_json().encode() + b"\n"
            handle.write(line)
            if on_kept is not None:
                on_kept(line)

    def write_done(ahead: int) -> None:
        """Write the batches back from the worker, leaving at most `ahead` in flight."""
        while len(in_flight) > ahead:
            rows, todo = in_flight.popleft()
            settle_languages(todo, worker.receive())
            write(rows)

    def write_waiting() -> None:
        nonlocal worker
        users = [user for user, _, _ in waiting]
        if worker is None and on_kept is None and report.kept >= WORKER_AFTER and LanguageWorker.worth_it():
            release_model()  # before the worker loads its own: the two never add up
            worker = cleanup.enter_context(LanguageWorker())
        if worker is None:
            decide_languages(users)
            write(waiting)
        else:
            todo, histories = unseen_languages(users)
            worker.send(histories)
            in_flight.append((list(waiting), todo))
            write_done(ahead=WORKER_AHEAD)
        waiting.clear()

    with (
        locks.exclusive(output),
        atomic_output(output) as handle,
        _progress(console) as progress,
        contextlib.ExitStack() as cleanup,  # the worker, if one started
    ):
        task = progress.add_task("filter", total=None)
        for user in users:
            try:
                decision = select_user(user, rules)
                turns = user._turn_dicts(roles) if decision.match else None
            except RowError as error:  # a malformed turn, found when the turns are first read
                policy.handle(error)
                continue
            report.users_in += 1
            if not user.intents:
                report.users_without_intents += 1
            report.memories_in += len(user.memories)
            report.flagged_memories_dropped += decision.flagged
            all_labels.add(_label_key(m.label) for m in decision.memories)
            if decision.gate is None:
                report.kept += 1
                matched = set(decision.match.matched_memory_ids)
                kept_labels.add(_label_key(m.label) for m in decision.memories if m.memory_id in matched)
                rules_hit.add(decision.match.matched_rules)
                waiting.append((user, decision, turns))
                if len(waiting) >= batch:
                    write_waiting()
            else:
                report.dropped[decision.gate] += 1
            if report.users_in % 500 == 0:
                progress.update(task, completed=report.users_in, description=f"filter: {report.kept} kept")
                emit("filter", report.users_in, None)
        write_waiting()
        write_done(ahead=0)
        progress.update(task, completed=report.users_in, description=f"filter: {report.kept} kept")
        emit("filter", report.users_in, report.users_in)
        if report.users_in == 0:  # raised inside the block: the previous output stays as it was
            raise InputError(f"{source}: no users to read", "check --input and --format")
    report.bad_rows_skipped = len(policy.skipped)
    report.skipped_rows = policy.skipped[:100]
    report.top_labels_all = all_labels.top(TOP_LABELS)
    report.top_labels_kept = kept_labels.top(TOP_LABELS)
    report.matched_rules = rules_hit.top()
    report.languages_kept = languages.top()
    if report.kept == 0:
        report.nobody_kept = why_nobody_kept(report, rules.rules, rules_path)
    if report_path is not None:
        write_json_atomic(report_path, report.saved(Path(report_path).parent))
    record_stage(output, "filter", report=report_path, failures=None, full=True)
    manifest.record("filter", output, stamp, [output, report_path or output], report.saved(output.parent))
    return of_filter(report, report_path)


def filter_fingerprint(source, fmt, rules_path, split, hf_config, on_error, keep_turns, report_path):
    """What the filter's output depends on (manifest.py): its input, rules, options, code."""
    options = {
        "source": str(source), "fmt": fmt, "rules": rules_path, "split": split, "hf_config": hf_config,
        "on_error": on_error, "keep_turns": keep_turns, "report": report_path,
    }  # fmt: skip
    return manifest.fingerprint([source, rules_path], options)


def filter_is_current(args: dict) -> bool:
    """Whether filter_users(**args) would read nothing (its output current)."""
    if args.get("force"):
        return False
    keys = ("source", "fmt", "rules_path", "split", "hf_config", "on_error", "keep_turns", "report_path")
    stamp = filter_fingerprint(*(args.get(key) for key in keys))
    return manifest.current("filter", Path(args["output"]), stamp) is not None


def _unchanged(last: dict, output: Path, on_kept: Callable[[bytes], None] | None) -> FilterReport:
    """The last run's report; its kept rows handed to `on_kept` from the output, if asked."""
    report = FilterReport(**{**last["result"], "output": str(output)})
    report.unchanged_since = manifest.unchanged("filter", last)
    if on_kept is not None:
        with output.open("rb") as handle:
            for line in handle:
                on_kept(line)
    emit("filter", report.users_in, report.users_in)
    return report


GATE_RULES = {
    "intents": "[intents] keywords (an intent's category or subtype must contain one)",
    "min_memories": "[memories] min_memories (unflagged memories a user needs)",
    "memory_labels": "[labels] prefixes and [unmapped] keywords (memories that must match: "
    "[memories] min_matched_memories)",
    "language": "[language] allow",
}


def why_nobody_kept(report: FilterReport, rules: Rules, rules_path: Path | None) -> str:
    """Which gates dropped the users, the rules behind them, and what to do."""
    dropped = ", ".join(
        f"{count} by {gate} ({GATE_RULES[gate]})"
        for gate, count in sorted(report.dropped.items(), key=lambda item: -item[1])
        if count
    )
    source = f"the rules in {rules_path}" if rules_path else "the shipped rules"
    return (
        f"nobody kept: of {report.users_in} users, {dropped}. A memory matches when its label "
        f"starts with one of {', '.join(rules.labels.prefixes) or '(none)'}, or is UNMAPPED with "
        f"one of the [unmapped] keywords in its label_suggestion ({source}). If your labels "
        "differ: personaemp filter --show-rules > my_rules.toml, edit it, and pass --rules my_rules.toml"
    )


class Tally(Counter):
    """Counts of strings (labels, rules, languages: a few hundred distinct at most).

    A Counter, not polars: `run` forks the filter (streaming.py), and polars' thread pool
    hangs in a process forked after the parent used it."""

    def add(self, values: Iterable[str]) -> None:
        self.update(values)

    def top(self, limit: int | None = None) -> dict[str, int]:
        """Most frequent first, ties by name, so the report is deterministic."""
        return dict(sorted(self.items(), key=lambda item: (-item[1], item[0]))[:limit])


def _progress(console: Console | None) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed} users"),
        TimeElapsedColumn(),
        console=console or Console(quiet=True),  # a library call prints only when given a console
        transient=True,
    )


# --- from options (the command, pe.* and `run`) ---------------------------------------------------


def filter_args(options) -> dict:
    """filter_users' arguments from its options, for the command and `run`'s streamed filter."""
    return {
        "source": options.input, "output": options.output, "fmt": options.format,
        "rules_path": options.rules, "split": options.benchmark_split, "hf_config": options.hf_config,
        "on_error": options.on_error, "keep_turns": options.turns,
        "report_path": options.output.with_name("filter_report.json"), "force": options.force,
    }  # fmt: skip


def from_options(options, console):
    """`personaemp filter` on its options."""
    return filter_users(**filter_args(options), console=console)


def print_summary(result, console) -> None:
    """`personaemp filter`'s summary: the funnel, the labels kept, where it wrote."""
    print_funnel(result.report, console)


def print_funnel(report, console) -> None:
    """The filter funnel of a FilterReport (also what `run` prints for its streamed filter)."""
    if report.unchanged_since:  # skipped (personaemp.manifest): its one line
        return console.print(report.unchanged_since)
    funnel = Table(title="filter funnel", title_justify="left")
    funnel.add_column("step")
    funnel.add_column("users", justify="right")
    funnel.add_row("users read", str(report.users_in))
    for gate, count in report.dropped.items():
        funnel.add_row(f"  dropped by {gate}", str(count))
    funnel.add_row("[bold]kept[/]", f"[bold]{report.kept}[/]")
    console.print(funnel)
    console.print(
        f"bad rows skipped: {report.bad_rows_skipped} · users without intents (passed the "
        f"intent gate): {report.users_without_intents} · flagged false memories dropped: "
        f"{report.flagged_memories_dropped} of {report.memories_in}"
    )
    if report.top_labels_kept:
        labels = Table(title="most frequent matched labels", title_justify="left")
        labels.add_column("label")
        labels.add_column("memories", justify="right")
        for label, count in report.top_labels_kept.items():
            labels.add_row(label, str(count))
        console.print(labels)
    if report.nobody_kept:
        console.print(f"[yellow]{escape(report.nobody_kept)}[/]")
    console.print(f"wrote {report.output}")
