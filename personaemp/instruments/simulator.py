"""The simulated user: who it plays (SimulatedUser: one user's grounding and the moment of one
query), its steps (the hidden need, its next message, the in-character check) and one checked
turn (`simulate_user_turn`). gen-dialogues (dataset/dialogues.py) and the training Interaction
(training/interaction.py) ask it the same way; the rules it must keep are simulator_rules.py."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from personaemp import records
from personaemp.errors import UnitError
from personaemp.instruments import seekers, simulator_rules
from personaemp.instruments.criteria import query_units
from personaemp.instruments.voice import VOICE, pick_voice, render_voice
from personaemp.language import LANGUAGE_NAMES
from personaemp.llm.step import Step, edit_schema
from personaemp.prompts import Prompt
from personaemp.records import BIG_FIVE, MAX_CHANGE, REJECTED_KEYS, DialogueTurn, Memory
from personaemp.render import render_memories

INITIAL_EMOTION = 40  # where every simulated user starts (SAGE's start)
# The emotion's bounds where a dialogue ends: declared with the Dialogue's invariants.
SATISFIED, GIVE_UP = records.SATISFIED, records.GIVE_UP
MAX_TURNS = 6  # supporter turns
TURN_ATTEMPTS = 3  # replies asked per simulated turn before the dialogue fails


# --- reply models and steps ------------------------------------------------------------------------


class NeedReply(BaseModel):
    need: str = Field(description="what would actually help this person here, in one or two sentences")


class UserTurnReply(BaseModel):
    thought: str = Field(description="your inner reaction to the reply, never shown")
    change: int = Field(ge=-MAX_CHANGE, le=MAX_CHANGE, description="how the reply moved your emotion")
    reason: str = Field(description="why it moved that way")
    need_met: bool
    end: bool = Field(description="you leave the chat with this message")
    text: str = Field(min_length=1, description="the message you send")


class CharacterReply(BaseModel):
    reason: str
    in_character: bool
    grounded: bool


HIDDEN_NEED = Step("hidden_need", NeedReply, prompt="dialogue_need")
SIMULATE = Step("simulate", UserTurnReply, prompt="dialogue_user")
IN_CHARACTER = Step("in_character", CharacterReply, prompt="dialogue_check", temperature=0.0)
SIMULATOR_STEPS = (HIDDEN_NEED, SIMULATE, IN_CHARACTER)
# The change as a list of its values: a grammar-constrained endpoint (llama.cpp) does not hold
# an integer to its bounds, a list it does.
CHANGES = edit_schema(
    SIMULATE.schema, ("properties", "change"), enum=list(range(-MAX_CHANGE, MAX_CHANGE + 1))
)


# --- the simulated user ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimulatedUser:
    """What the simulator stands on: one user's grounding and the moment of one query."""

    user_id: str
    language: str | None
    profile: str
    big_five: dict[str, str] | None
    cited: tuple[Memory, ...]  # the memories the query cites
    background: tuple[Memory, ...]  # the user's other memories
    situation: str
    query: str
    voice: str  # their own recent messages, for how they write
    seeker: str = seekers.DEFAULT  # how hard they are to help (instruments/seekers.py)

    @classmethod
    def of_unit(cls, unit: dict[str, Any]) -> SimulatedUser:
        memories = [Memory.model_validate(m) for m in unit["memories"]]
        cited = set(unit["memory_ids"])
        return cls(
            user_id=unit["user_id"], language=unit["language"], profile=unit["profile"],
            big_five=unit["big_five"], cited=tuple(m for m in memories if m.memory_id in cited),
            background=tuple(m for m in memories if m.memory_id not in cited),
            situation=unit["situation"], query=unit["query"], voice=unit["voice"],
            seeker=unit.get("seeker") or seekers.DEFAULT,
        )  # fmt: skip

    def values(self) -> dict[str, str]:
        """The prompt slots every simulator step fills the same way (its context blocks)."""
        memories = render_memories(self.cited) or "(none)"
        if self.background:
            memories += "\n\nBackground (other memories):\n" + render_memories(self.background)
        profile = self.profile or "(none)"
        if self.voice:
            profile += f"\n\nHow they write (their own recent messages):\n{self.voice}"
        return {"profile": profile, "memories": memories, "situation": self.situation, "query": self.query}

    def levels(self) -> str:
        if not self.big_five:
            return "(unknown)"
        return ", ".join(f"{trait} {self.big_five[trait]}" for trait in BIG_FIVE)

    def language_name(self) -> str:
        return LANGUAGE_NAMES.get(self.language or "", self.language or "the language of their first message")


def transcript(turns: Sequence[DialogueTurn], user: str = "User", assistant: str = "Assistant") -> str:
    return "\n\n".join(f"{user if t.role == 'user' else assistant}: {t.text}" for t in turns) or "(nothing)"


def build_need_messages(user: SimulatedUser, prompt: Prompt) -> list[dict]:
    # In the user's language: no_need_leak compares it with what they write.
    messages = prompt.render(**user.values(), big_five=user.levels(), language=user.language_name())
    added = seekers.style_text().part(user.seeker, "need", user.language)
    return seekers.with_style(messages, added, seekers.NEED_HEADING)


def build_user_turn_messages(
    user: SimulatedUser, hidden_need: str, turns: Sequence[DialogueTurn], emotion: int, prompt: Prompt
) -> list[dict]:
    """The simulator's request for its next message: `turns` end with the supporter's reply."""
    supporter_turn = sum(t.role == "assistant" for t in turns)
    messages = prompt.render(
        **user.values(), big_five=user.levels(), need=hidden_need, dialogue=transcript(turns[:-1]),
        reply=turns[-1].text, emotion=str(emotion), turn=str(supporter_turn), language=user.language_name(),
    )  # fmt: skip
    added = seekers.style_text().part(user.seeker, "turn", user.language)
    return seekers.with_style(messages, added, seekers.TURN_HEADING)


def build_check_messages(user: SimulatedUser, turns: Sequence[DialogueTurn], text: str, prompt: Prompt):
    messages = prompt.render(**user.values(), dialogue=transcript(turns), message=text)
    added = seekers.style_text().part(user.seeker, "check")
    return seekers.with_style(messages, added, seekers.CHECK_HEADING)


# The need prompt's example (prompts/dialogue_need.md): a need that copies it was not written
# for this person, and is asked again.
NEED_EXAMPLE = "to hear that wanting a break is not laziness before deciding anything"


def parse_need(reply: NeedReply) -> str:
    need = " ".join(reply.need.split())
    if not need:
        raise ValueError("need: empty; write what would help this person")
    copied = simulator_rules.no_echo(need, {"the prompt's example": NEED_EXAMPLE})
    if not copied[0]:
        raise ValueError(f"need: {copied[1]}; write this person's own need")
    return need


REASK = (
    "Your earlier messages for this turn could not be used; write a new one that keeps every rule.\n{broken}"
)


def with_verdicts(messages: list[dict], rejected: Sequence[dict[str, str]]) -> list[dict]:
    """The turn's request asked again: every rejected reply so far and the rules it broke,
    inside the last user turn (as the engine's own re-asks), so each re-ask is a new request."""
    broken = "\n".join(
        f"{number}. <<<{entry.get('text', '')[:400]}>>> broke: "
        + "; ".join(f"{rule} ({why})" for rule, why in entry.items() if rule not in REJECTED_KEYS)
        for number, entry in enumerate(rejected, 1)
    )
    note = REASK.format(broken=broken)
    last = messages[-1]
    return [*messages[:-1], {**last, "content": f"{last['content']}\n\n{note}"}]


def clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


async def write_hidden_need(engine, user: SimulatedUser, prompts: dict[str, Prompt]) -> str:
    reply = await engine.call(
        HIDDEN_NEED, build_need_messages(user, prompts[HIDDEN_NEED.name]), parse=parse_need
    )
    return reply.parsed


async def simulate_user_turn(
    engine,
    user: SimulatedUser,
    hidden_need: str,
    turns: Sequence[DialogueTurn],
    prompts: dict[str, Prompt],
    *,
    attempts: int = TURN_ATTEMPTS,
    character_check: bool = True,
) -> tuple[DialogueTurn, bool]:
    """The simulated user's next turn after `turns` (which end with the supporter's reply), and
    whether it ends the conversation. Each reply is checked (the rules, then the LLM check); a
    failing one is asked again as a new sample, up to `attempts` replies, else UnitError.
    The step the verl Interaction calls too."""
    emotion = next(t.emotion for t in reversed(turns) if t.role == "user" and t.emotion is not None)
    supporter_turn = sum(t.role == "assistant" for t in turns)
    prompt = prompts[SIMULATE.name]
    asked = build_user_turn_messages(user, hidden_need, turns, emotion, prompt)
    echoes = {simulator_rules.SUPPORTER: turns[-1].text}
    echoes.update({f"its own message {n}": t.text for n, t in enumerate(turns[:-1:2], 1) if t.role == "user"})
    echoes["the simulator prompt"] = prompt_text(prompt)
    # the voice block: a turn that copies one of the person's real messages is asked again
    echoes.update({f"their real message {n}": line.removeprefix("- ")
                   for n, line in enumerate(user.voice.splitlines(), 1)})  # fmt: skip
    style = seekers.style_text().part(user.seeker, "turn", user.language)
    if style:
        echoes["the seeker style's text"] = style
    messages, rejected = asked, []
    text = ""
    for sample in range(attempts):
        result = await engine.call(SIMULATE, messages, schema=CHANGES, sample=sample)
        value = result.value
        text = value.text.strip()
        change = clamp(value.change, -MAX_CHANGE, MAX_CHANGE)
        found = simulator_rules.check_turn(
            text, language=user.language, hidden_need=hidden_need, ends=value.end,
            supporter_turn=supporter_turn, need_met=value.need_met, change=change, echoes=echoes,
        )  # fmt: skip
        kept = seekers.style_kept(user.seeker, text, need_met=value.need_met, change=change)
        if kept is not None:
            found[seekers.RULE] = kept
        failed = {name: reason for name, (passed, reason) in found.items() if not passed}
        outcome = {name: passed for name, (passed, _) in found.items()}
        if not failed and character_check:
            verdict = (
                await engine.call(
                    IN_CHARACTER, build_check_messages(user, turns, text, prompts[IN_CHARACTER.name])
                )
            ).value
            outcome.update(in_character=verdict.in_character, grounded=verdict.grounded)
            failed.update({name: verdict.reason for name in simulator_rules.JUDGED if not outcome[name]})
        if failed:
            engine.reject(result)  # never replayed: --retry-failed asks again
            rejected.append({**failed, "text": text, "thought": value.thought.strip()})
            messages = with_verdicts(asked, rejected)
            continue
        turn = DialogueTurn(
            role="user", text=text, emotion=clamp(emotion + change, 0, SATISFIED), change=change,
            reason=value.reason.strip(), need_met=value.need_met, thought=value.thought.strip(),
            checks=outcome, rejected=rejected,
        )  # fmt: skip
        return turn, value.end
    broken = [{k: v for k, v in entry.items() if k not in REJECTED_KEYS} for entry in rejected]
    rules = ", ".join(sorted({name for failed in broken for name in failed}))
    last = "; ".join(f"{name}: {reason}" for name, reason in broken[-1].items())
    raise UnitError(
        "simulator_rules",
        f"turn {supporter_turn}: no simulated reply kept the rules ({rules}) in {attempts} tries; "
        f"last: {last}",
        text,
        attempts=attempts,
    )


def prompt_text(prompt: Prompt) -> str:
    """The simulator prompt's own words (its task, slots left out): what a turn must not echo."""
    templates = (prompt.system, prompt.user)
    return " ".join(re.sub(r"\$\{?\w+\}?", " ", t.template) for t in templates if t)


# --- the units ---------------------------------------------------------------------------------------

HINT = "pass gen-queries' output or a split file written by `personaemp split`"


def read_units(path: Path, hint: str = HINT, voice: int = VOICE) -> list[dict[str, Any]]:
    """One unit per accepted query of a gen-queries or split file, in file order: what the
    simulator stands on (`SimulatedUser.of_unit`) and what its dialogue is keyed by. `voice`:
    how many of the user's own messages it is shown (instruments/voice.py's rule; 0: none)."""
    return query_units(path, hint, functools.partial(simulator_unit, voice=voice))


def simulator_unit(record, levels, voice: int = VOICE):
    own = [turn.text for turn in record.turns if turn.role == "user"]
    voice = render_voice(pick_voice(own, voice))
    memories = [m.model_dump(mode="json", include={"memory_id", "label", "label_suggestion", "value"})
                for m in record.memories]  # fmt: skip
    big_five = dict(zip(BIG_FIVE, levels, strict=True)) if levels else None
    return lambda query: {
        "dialogue_id": f"{query.query_id}-d1", "query_id": query.query_id, "user_id": record.user_id,
        "category": query.category, "query": query.query, "situation": query.situation.text,
        "language": record.language, "profile": record.profile, "big_five": big_five,
        "memories": memories, "memory_ids": list(query.memory_ids), "voice": voice,
    }  # fmt: skip
