"""`personaemp gen-dialogues`: multi-turn conversations between a simulated user and the
model under test, one per accepted query (docs/multi-turn.md).

The simulated user is the real user's grounding: persona, Big Five levels, the memories the
query cites (the others as background), the moment, and a hidden need the LLM writes once per
dialogue. It opens with the query; then, turn by turn, the supporter answers and the
simulator replies with its inner state (emotion 0-100, its change and reason, need met, end).
Each simulated turn goes through the rules (instruments/simulator_rules.py) and an LLM check
(in character, no invented facts); a reply that fails is asked again with a new sample, up
to `turn_attempts` times, else the dialogue goes to the failures file with the reason.

Two endpoints, one rule: the simulator (hidden need, turns, check) is [llm], as for every
build stage; the supporter is the model under test, [llm] too unless `supporter_model` /
`supporter_base_url` name another. The supporter is asked as `respond` asks a policy (its
prompt, context modes, thinking removed); earlier turns reach it as a transcript in its last
user turn, so its first request is respond's own and no assistant turn is replayed (thinking
endpoints refuse one without its reasoning, which is removed). The hidden need is never in
a supporter request.

Every request is cached by its content: a re-run replays the finished turns of a dialogue
from the cache and sends only the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from personaemp.aio import sync_twin
from personaemp.errors import InputError, UnitError
from personaemp.instruments import seekers
from personaemp.instruments.criteria import with_room
from personaemp.instruments.policy import CONTEXTS, RESPOND, ROOM, SUMMARY, context_text, listed, mismatched
from personaemp.instruments.simulator import (  # the simulated user, shared with training's Interaction
    GIVE_UP,
    HIDDEN_NEED,
    IN_CHARACTER,
    INITIAL_EMOTION,
    MAX_TURNS,
    SATISFIED,
    SIMULATE,
    SIMULATOR_STEPS,
    TURN_ATTEMPTS,
    SimulatedUser,
    read_units,
    simulate_user_turn,
    transcript,
    write_hidden_need,
)
from personaemp.instruments.voice import VOICE
from personaemp.io import iter_records
from personaemp.prompts import Prompt, prompts_per_variant
from personaemp.records import Dialogue, DialogueTurn
from personaemp.summaries import print_run_report

STAGE = "gen-dialogues"


STEPS = (*SIMULATOR_STEPS, RESPOND, SUMMARY)  # RESPOND and SUMMARY: the supporter's, as respond's


# --- the supporter -----------------------------------------------------------------------------------

_WRITES = "The user writes:\n"  # how policy.context_text hands over to the message


def supporter_context(
    view: dict, context: str, rag_k: int, earlier: Sequence[DialogueTurn], summary=None
) -> str:
    """respond's context for `view` (the unit as the policy sees it), with the conversation so
    far before the user's latest message when there is one."""
    base = context_text(view, context, rag_k, summary)
    if not earlier:
        return base
    head = base.removesuffix(_WRITES)
    so_far = transcript(earlier, "User", "You")
    return f"{head}Your conversation with the user so far:\n{so_far}\n\nThe user now writes:\n"


def build_supporter_messages(
    view: dict, turns: Sequence[DialogueTurn], context: str, rag_k: int, prompt: Prompt, summary=None
) -> list[dict]:
    """The supporter's request after `turns` (which end with a user turn): respond's on turn 1."""
    return prompt.render(
        context=supporter_context(view, context, rag_k, turns[:-1], summary), query=turns[-1].text
    )


# --- one dialogue --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DialogueOptions:
    max_turns: int = MAX_TURNS
    context: str = "memory"
    rag_k: int = 3
    mismatch_seed: int = 0
    turn_attempts: int = TURN_ATTEMPTS
    character_check: bool = True
    voice: int = VOICE  # the user's own messages shown (instruments/voice.py); 0: none
    seeker: str = seekers.DEFAULT  # a style of records.SEEKERS, or "auto" (instruments/seekers.py)

    def __post_init__(self) -> None:
        if self.seeker not in seekers.CHOICES:
            raise InputError(f"--seeker takes {', '.join(seekers.CHOICES)}, not {self.seeker!r}")
        if self.context not in CONTEXTS:
            raise InputError(f"--context takes {', '.join(CONTEXTS)}, not {self.context!r}")
        if self.max_turns < 1:
            raise InputError("--max-turns must be at least 1")
        if self.turn_attempts < 1:
            raise InputError("--turn-attempts must be at least 1")

    def tag(self) -> str:
        """What of these options a finished dialogue depends on (part of the fingerprint); a
        cooperative run's is what it was before styles, so its dialogues stay current."""
        values = dataclasses.astuple(self)
        if self.seeker == seekers.DEFAULT:
            values = values[:-1]
        return "|".join(str(v) for v in values)


async def run_dialogue(unit: dict, simulator, supporter, prompts: dict[str, Prompt], options: DialogueOptions,
                       view: dict, summary=None) -> dict:  # fmt: skip
    """One dialogue for one query unit: its Dialogue row (as JSON)."""
    user = SimulatedUser.of_unit(unit)
    need = await write_hidden_need(simulator, user, prompts)
    turns = [
        DialogueTurn(role="user", text=unit["query"], emotion=INITIAL_EMOTION, change=0,
                     reason="the opening message (the query)", need_met=False)
    ]  # fmt: skip
    ended_by, need_met_at = "max_turns", None
    for number in range(1, options.max_turns + 1):
        try:
            reply = await supporter.text(
                RESPOND,
                build_supporter_messages(
                    view, turns, options.context, options.rag_k, prompts[RESPOND.name], summary
                ),
            )
        except UnitError as error:
            error.fields["lost_to"] = "supporter"  # the model under test failed, not the simulator
            raise
        turns.append(DialogueTurn(role="assistant", text=reply.value))
        turn, ends = await simulate_user_turn(
            simulator, user, need, turns, prompts,
            attempts=options.turn_attempts, character_check=options.character_check,
        )  # fmt: skip
        turns.append(turn)
        if turn.need_met and need_met_at is None:
            need_met_at = number
        if ends:
            ended_by = "user"
        elif turn.emotion >= SATISFIED:
            ended_by = "satisfied"
        elif turn.emotion < GIVE_UP:
            ended_by = "gave_up"
        else:
            continue
        break
    hashes = {step.name: prompts[step.name].hash for step in SIMULATOR_STEPS}
    hashes[RESPOND.name] = prompts[RESPOND.name].hash
    if options.context == "memory-summary":
        hashes[SUMMARY.name] = prompts[SUMMARY.name].hash
    if user.seeker != seekers.DEFAULT:
        hashes[seekers.PROMPT_FILE] = seekers.style_text().hash
    dialogue = Dialogue(
        dialogue_id=unit["dialogue_id"], user_id=unit["user_id"], query_id=unit["query_id"],
        category=unit["category"], language=unit["language"], hidden_need=need,
        initial_emotion=INITIAL_EMOTION, final_emotion=turns[-1].emotion, need_met_at_turn=need_met_at,
        ended_by=ended_by, supporter_model=supporter.model, simulator_model=simulator.model,
        memory_ids=[m.memory_id for m in user.cited],
        background_memory_ids=[m.memory_id for m in user.background],
        context=options.context, seeker=user.seeker, turns=turns, provenance=simulator.provenance(hashes),
    )  # fmt: skip
    return dialogue.model_dump(mode="json")


# --- the units ---------------------------------------------------------------------------------------


def pick_dialogues(units: Sequence[dict], limit: int | None, per_user: int | None) -> set[str] | None:
    """The dialogue ids a run works on: the first `per_user` queries of each user, then the
    first `limit` of those (None: all)."""
    if limit is None and per_user is None:
        return None
    taken: Counter = Counter()
    chosen = []
    for unit in units:
        if per_user is None or taken[unit["user_id"]] < per_user:
            taken[unit["user_id"]] += 1
            chosen.append(unit["dialogue_id"])
    return set(chosen[:limit] if limit is not None else chosen)


# --- the stage ---------------------------------------------------------------------------------------


class _NotSent:
    """--estimate with a separate supporter endpoint: its requests stop the unit, uncounted."""

    def add(self, step: str, request: dict, key: str = "") -> None:
        pass


def supporter_settings(settings, model: str | None = None, base_urls: Sequence[str] = ()):
    """The supporter's engine settings: [llm]'s, with its own model and endpoint when given
    (None: the simulator's engine serves both)."""
    if not model and not base_urls:
        return None
    changes: dict[str, Any] = {"model": model or settings.model}
    if base_urls:
        changes.update(base_urls=list(base_urls), llm="remote")
    return dataclasses.replace(settings, **changes)


async def agenerate_dialogues(
    input_path: Path,
    output_path: Path,
    settings,
    *,
    options: DialogueOptions | None = None,
    limit: int | None = None,
    per_user: int | None = None,
    supporter_model: str | None = None,
    supporter_base_url: Sequence[str] = (),
    retry_failed: bool = False,
    console=None,
):
    """A dialogue for each accepted query of `input_path` (gen-queries' output or a split
    file; `per_user`, `limit`: the first ones); returns the StageResult (`.report`: the run
    report). The simulator is `settings` ([llm]); the supporter too unless `supporter_model` /
    `supporter_base_url`."""
    from personaemp.llm.ray_executor import EngineBeside, shared_per
    from personaemp.llm.session import open_engine
    from personaemp.llm.stage import LLMStage, arun_llm_stage
    from personaemp.results import of_llm_stage

    options = options or DialogueOptions()
    if settings.batch is not None or settings.llm == "vllm":
        raise InputError(
            f"gen-dialogues cannot work {'from batch files' if settings.batch else 'in vLLM rounds'}",
            "each turn waits for the one before it: serve the model (e.g. `vllm serve`) and give --base-url",
        )
    units = [
        {**unit, "seeker": seekers.style_for(options.seeker, unit["big_five"])}
        for unit in read_units(Path(input_path), voice=options.voice)
    ]
    selected = pick_dialogues(units, limit, per_user)
    stand_in = (
        mismatched(units, options.mismatch_seed, Path(input_path)) if options.context == "mismatch" else {}
    )
    memories_of = {unit["user_id"]: unit["memories"] for unit in units}
    settings = with_room(settings, ROOM)
    separate = supporter_settings(settings, supporter_model, supporter_base_url)
    loaded = prompts_per_variant(STEPS)
    notes: dict[str, dict[str, Any]] = {}

    def view_of(unit: dict) -> dict:
        if unit["user_id"] not in stand_in:
            return unit
        return {**unit, "memories": memories_of[stand_in[unit["user_id"]]]}

    async with contextlib.AsyncExitStack() as stack:
        supporter = None  # its own engine; a Ray worker opens one there (EngineBeside)

        def count_supporter() -> None:
            """The supporter's note, from its accounting here (on Ray: the workers', merged)."""
            engine = supporter.engine
            totals = engine.accounting.totals()
            notes["supporter"].update(
                text=f"supporter {engine.model}: {totals.requests} requests, "
                f"{totals.prompt_tokens} prompt and {totals.completion_tokens} completion tokens",
                requests=totals.requests, prompt_tokens=totals.prompt_tokens,
                completion_tokens=totals.completion_tokens,
            )  # fmt: skip

        if separate is not None:
            opened = await stack.enter_async_context(
                open_engine(separate, offline=_NotSent() if settings.estimate else None)
            )
            supporter = EngineBeside(separate, opened, on_count=count_supporter)
            notes["supporter"] = {"text": f"supporter: {opened.model} (its own endpoint)"}

        def fingerprint(engine) -> str:
            hashes = loaded(engine.prompt_variant)[1]
            support = supporter or engine
            parts = [engine.fingerprint(step, hashes[step.name]) for step in SIMULATOR_STEPS]
            parts.append(support.fingerprint(RESPOND, hashes[RESPOND.name]))
            if options.context == "memory-summary":
                parts.append(support.fingerprint(SUMMARY, hashes[SUMMARY.name]))
            if options.seeker != seekers.DEFAULT:
                parts.append(f"{seekers.PROMPT_FILE}={seekers.style_text().hash}")
            return "|".join([*parts, options.tag()])

        @shared_per("user_id")  # on Ray too: a user's dialogues on one worker, which summarises once
        def make_work(engine):
            prompts = loaded(engine.prompt_variant)[0]
            summaries: dict[str, asyncio.Future] = {}  # one summary per user (memory-summary)

            async def summarise(view: dict, support) -> str:
                if view["user_id"] not in summaries:
                    messages = prompts[SUMMARY.name].render(memories=listed(view["memories"]))
                    summaries[view["user_id"]] = asyncio.ensure_future(support.text(SUMMARY, messages))
                return (await summaries[view["user_id"]]).value

            async def work(unit: dict) -> dict:
                support = await supporter.get() if supporter is not None else engine
                view = view_of(unit)
                try:
                    try:
                        summarised = options.context == "memory-summary"
                        summary = await summarise(view, support) if summarised else None
                    except UnitError as error:
                        error.fields["lost_to"] = "supporter"  # it writes the summary
                        raise
                    row = await run_dialogue(unit, engine, support, prompts, options, view, summary)
                except UnitError as error:
                    # Who lost it, so a card or report counts dialogues lost per supporter.
                    error.fields = {
                        "user_id": unit["user_id"], "query_id": unit["query_id"],
                        "supporter_model": support.model, "seeker": unit["seeker"], "lost_to": "simulator",
                        **error.fields,
                    }  # fmt: skip
                    lost = notes.setdefault("lost", {"simulator": 0, "supporter": 0})
                    lost[error.fields["lost_to"]] += 1
                    lost["text"] = (
                        f"dialogues lost this run: {lost['simulator']} to the simulator (its rules or "
                        f"replies), {lost['supporter']} to the supporter"
                    )
                    if supporter is not None and not settings.estimate:
                        supporter.counted()  # what a failed dialogue sent is counted too
                    raise
                if unit["user_id"] in stand_in:
                    row["memories_of"] = stand_in[unit["user_id"]]
                if supporter is not None:
                    supporter.counted()  # one process: the note; a Ray worker: nothing
                return row

            return work

        turns = options.max_turns
        plan = LLMStage(
            STAGE, units, make_work, key="dialogue_id", output=Path(output_path), fingerprint=fingerprint,
            selected=selected, full=selected is None, input_path=Path(input_path), retry_failed=retry_failed,
            steps=[HIDDEN_NEED, RESPOND, SIMULATE, IN_CHARACTER],
            calls={RESPOND.name: turns, SIMULATE.name: turns, IN_CHARACTER.name: turns}, notes=notes,
        )  # fmt: skip
        report = await arun_llm_stage(plan, settings=settings, console=console)
        return of_llm_stage(report)


generate_dialogues = sync_twin(agenerate_dialogues)


def read_dialogues(path: Path) -> list[Dialogue]:
    """The rows of a gen-dialogues output, validated (what the later steps read)."""
    return [
        dialogue for _, dialogue in iter_records(path, Dialogue, "a dialogue", "pass gen-dialogues' output")
    ]


# --- from options (the command and pe.*) ----------------------------------------------------------


async def from_options(options, console, settings, retry=False):
    """`personaemp gen-dialogues` on its options."""
    return await agenerate_dialogues(
        options.input, options.output, settings,
        options=DialogueOptions(
            max_turns=options.max_turns, context=options.context, rag_k=options.rag_k,
            mismatch_seed=options.mismatch_seed, turn_attempts=options.turn_attempts,
            character_check=options.character_check, voice=options.voice, seeker=options.seeker,
        ),
        limit=options.limit, per_user=options.per_user, supporter_model=options.supporter_model,
        supporter_base_url=options.supporter_base_url, retry_failed=retry, console=console,
    )  # fmt: skip


def print_summary(result, console) -> None:
    """`personaemp gen-dialogues`'s summary: its run report (its last line says what it wrote)."""
    print_run_report(result, console)
