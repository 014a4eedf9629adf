"""The simulated user as verl's multi-turn `Interaction`: the policy under training is the
supporter; after each of its replies this object answers as the user would (the simulator
of `gen-dialogues`, instruments/simulator.py: the same prompts, rules, checks and re-asks).

verl 0.4-0.7 builds it from an interaction YAML (`actor_rollout_ref.rollout.multi_turn.
interaction_config_path`), by class path, with the YAML's `config` dict (verl 0.8 removed that
API: there training/agent_loop.py's agent loop drives this class):

    interaction:
      - name: personaemp
        class_name: personaemp.training.interaction.SimulatedUserInteraction
        config: {config: personaemp.toml, max_turns: 6, session_reward: emotion}

and names it per sample in `extra_info.interaction_kwargs` (`personaemp export --dialogues`
writes them: the name and the simulated user's grounding). The calls:

  start_interaction(instance_id, **interaction_kwargs)  the hidden need, written once (cached by
                                                        its request, so every rollout of a query
                                                        plays the same person with the same need);
  generate_response(instance_id, messages, **kwargs)    the policy's last reply (reasoning removed)
                                                        -> (should_terminate, the user's message,
                                                        turn score, extra);
  calculate_score(instance_id)                          the session reward now;
  finalize_interaction(instance_id)                     the session forgotten.

Scores. A turn's score is the reward the session has so far: the simulated user's emotion / 100
(0-1); the turn that ends the session scores the session reward, by `session_reward`:
"emotion" (final emotion / 100, RLVER's), "peregrm" (H of the dynamic session judge over the
supporter's side, @`samples`), or "both" ((1 - weight) * emotion / 100 + weight * H), less
the safety term: each supporter turn judged for the risky behaviours of instruments/behaviours.py
(each with a quote the turn must contain), `safety` off per risky behaviour (once per turn), at
most `safety_bound` in all ([reward] safety and safety_bound of the config, 0.1 and 0.5 by
default; the YAML keys of the same names override them, `safety: 0` turns it off), so a
supporter that flatters a user into a higher emotion does not earn more for it. A session
ends when the user leaves, the emotion reaches a bound (100, or below 10) or after `max_turns`
supporter turns; give verl `max_assistant_turns` = max_turns + 1 so the session, not verl, ends
it. `compute_score` below is a verl reward function that returns the last turn score.

One engine per process (endpoints, HTTP client, cache, the [llm] concurrency cap), as the
single-turn reward's per-rollout calls: its event loop runs in a daemon thread, and every
Interaction of the process with the same settings hands its calls to it, from any loop. Keys
come from the environment only (OPENAI_API_KEY); the settings from the personaemp.toml named
by `config` (else $PERSONAEMP_CONFIG), as the reward reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import statistics
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from personaemp.errors import InputError, UnitError
from personaemp.instruments import behaviours as behaviour_judge
from personaemp.instruments import seekers
from personaemp.instruments.judges import NEUTRAL, harmonic
from personaemp.instruments.session_judges import ROOM, SESSION_JUDGE_DYNAMIC, dialogue_text, session_messages
from personaemp.instruments.simulator import (
    GIVE_UP,
    INITIAL_EMOTION,
    MAX_TURNS,
    SATISFIED,
    SIMULATOR_STEPS,
    TURN_ATTEMPTS,
    SimulatedUser,
    simulate_user_turn,
    write_hidden_need,
)
from personaemp.llm.reply import split_reasoning
from personaemp.prompts import load_prompt, prompts_per_variant
from personaemp.records import DIMENSIONS, DialogueTurn
from personaemp.units import ENDPOINT_KINDS

NAME = "personaemp"  # the interaction's name in verl's YAML and in interaction_kwargs
CLASS_PATH = "personaemp.training.interaction.SimulatedUserInteraction"
SESSION_REWARDS = ("emotion", "peregrm", "both")
CONFIG_VAR = "PERSONAEMP_CONFIG"
# What a simulated user needs (SimulatedUser.of_unit, and the opening query).
USER_KEYS = (
    "user_id",
    "language",
    "profile",
    "big_five",
    "memories",
    "memory_ids",
    "situation",
    "query",
    "voice",
)


@dataclasses.dataclass(frozen=True)
class InteractionOptions:
    """The YAML `config` keys (all optional)."""

    config: str | None = None  # personaemp.toml ([llm]); else $PERSONAEMP_CONFIG, else the defaults
    max_turns: int = MAX_TURNS  # supporter turns
    session_reward: str = "emotion"
    weight: float = 0.5  # of PereGRM's H in "both"
    samples: int = 1  # k of the dynamic session judge
    turn_attempts: int = TURN_ATTEMPTS
    character_check: bool = True
    # The user's real messages shown as their voice: the newest `voice` of those export wrote
    # (instruments/voice.py's rule); 0: none; None: all export wrote.
    voice: int | None = None
    # the safety term ([reward] safety / safety_bound of the config when not given here)
    safety: float | None = None
    safety_bound: float | None = None
    seeker: str = seekers.DEFAULT  # the users' style where their row names none

    def __post_init__(self) -> None:
        if self.seeker not in seekers.CHOICES:
            raise InputError(f"seeker takes {', '.join(seekers.CHOICES)}, not {self.seeker!r}")
        for name in ("safety", "safety_bound"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise InputError(f"{name} must be between 0 and 1, not {value}")
        if self.session_reward not in SESSION_REWARDS:
            raise InputError(
                f"session_reward takes {', '.join(SESSION_REWARDS)}, not {self.session_reward!r}"
            )
        if not 0 <= self.weight <= 1:
            raise InputError(f"weight must be between 0 and 1, not {self.weight}")
        if self.max_turns < 1 or self.samples < 1 or self.turn_attempts < 1:
            raise InputError("max_turns, samples and turn_attempts must be at least 1")
        if self.voice is not None and self.voice < 0:
            raise InputError(f"voice must be 0 or more, not {self.voice}")

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> InteractionOptions:
        """From the YAML's dict, each value read as its type (YAML and hydra may hand "4" for
        4, "no" for false): a value that is not one is an error naming the key."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - set(known) - {"name"})
        if unknown:
            raise InputError(
                f"interaction config: no key {unknown[0]!r}", f"the keys are {', '.join(sorted(known))}"
            )
        return cls(**{k: _typed(k, v, known[k].type) for k, v in config.items() if k in known})


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _typed(key: str, value: Any, kind: str) -> Any:
    """`value` as the option's type (`kind`, the annotation's text)."""
    wrong = InputError(f"interaction config: {key} takes {kind.replace(' | None', '')}, not {value!r}")
    if value is None:
        if "None" in kind:
            return None
        raise wrong
    kind = kind.replace(" | None", "")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise wrong
    if kind in ("int", "float"):
        if isinstance(value, bool):
            raise wrong
        try:
            number = float(str(value).strip()) if kind == "float" else int(str(value).strip())
        except ValueError:
            raise wrong from None
        return number
    if not isinstance(value, str):
        raise wrong
    return value


def safety_from(path: str | None, env: Mapping[str, str] | None = None) -> tuple[float, float]:
    """[reward] safety and safety_bound of a personaemp.toml (env vars over the file)."""
    from personaemp.config import Resolver

    env = os.environ if env is None else env
    path = path or env.get(CONFIG_VAR) or None
    config = Resolver(Path(path) if path else None, env=env).section("reward")
    return config.safety, config.safety_bound


def settings_from(path: str | None, env: Mapping[str, str] | None = None):
    """The engine's settings from a personaemp.toml's [llm] (env vars over the file)."""
    from personaemp.config import Resolver, llm_settings
    from personaemp.instruments.criteria import with_room

    env = os.environ if env is None else env
    path = path or env.get(CONFIG_VAR) or None
    resolver = Resolver(Path(path) if path else None, env=env)
    return with_room(with_room(llm_settings(resolver.section("llm"), env), ROOM), behaviour_judge.ROOM)


# --- one engine per process ------------------------------------------------------------------------


class _Service:
    """An engine on its own event loop in a daemon thread: every call, from any thread or
    loop, runs there, so the process has one HTTP client, one cache and one concurrency cap."""

    def __init__(self, settings):
        self.settings = settings
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="personaemp-interaction", daemon=True
        )
        self.thread.start()
        self.engine = None
        self._stack: contextlib.AsyncExitStack | None = None

    async def _open(self):
        if self.engine is None:
            from personaemp.llm.session import open_engine

            stack = contextlib.AsyncExitStack()
            self.engine = await stack.enter_async_context(open_engine(self.settings))
            self._stack = stack
        return self.engine

    async def _run(self, work: Callable):
        return await work(await self._open())

    async def call(self, work: Callable):
        """`await work(engine)` on the service's loop, awaited from the caller's."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._run(work), self.loop))

    def close(self) -> None:
        async def shut() -> None:
            if self._stack is not None:
                await self._stack.aclose()
            self._stack = self.engine = None

        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(shut(), self.loop).result()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()


_services: dict[tuple[int, str], _Service] = {}
_services_lock = threading.Lock()


def service_for(settings) -> _Service:
    """The process's service for these settings (a forked child starts its own)."""
    key = (os.getpid(), repr(settings))
    with _services_lock:
        found = _services.get(key)
        if found is None:
            found = _services[key] = _Service(settings)
        return found


# --- the Interaction ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Session:
    user: SimulatedUser
    unit: dict
    need: str
    turns: list[DialogueTurn]
    ended_by: str | None = None
    need_met_at: int | None = None
    reward: float | None = None
    behaviours: list[dict] | None = None  # each supporter turn's, judged when the reward is computed
    safety_penalty: float = 0.0


class SimulatedUserInteraction:
    """verl's Interaction (verl.interactions.base.BaseInteraction's methods; verl need not be
    installed to import it). `config`: the YAML's, see InteractionOptions."""

    def __init__(self, config: Mapping[str, Any] | None = None, *, settings=None):
        config = dict(config or {})
        self.config = config
        self.name: str = config.get("name", NAME)
        self.options = InteractionOptions.of(config)
        self.settings = settings if settings is not None else settings_from(self.options.config)
        weight, bound = self.options.safety, self.options.safety_bound
        if weight is None or bound is None:
            configured = safety_from(self.options.config)
            weight = configured[0] if weight is None else weight
            bound = configured[1] if bound is None else bound
        self.safety, self.safety_bound = weight, bound
        self.behaviour_prompt = load_prompt(behaviour_judge.BEHAVIOUR_JUDGE.prompt)
        self.prompts = prompts_per_variant(SIMULATOR_STEPS)  # variant -> (prompts, hashes)
        self.judge_prompt = load_prompt(SESSION_JUDGE_DYNAMIC.prompt)
        self.sessions: dict[str, Session] = {}
        self.counts: Counter = Counter()  # sessions, turns, ended_by, simulator failures, fallbacks

    def prompts_of(self, engine) -> dict:
        """The simulator's prompts in the variant the engine reads (prompts/compact/ on the
        embedded model, where one exists)."""
        return self.prompts(engine.prompt_variant)[0]

    @property
    def service(self) -> _Service:
        return service_for(self.settings)

    async def start_interaction(self, instance_id: str | None = None, **kwargs) -> str:
        instance_id = instance_id or str(uuid.uuid4())
        if instance_id in self.sessions:  # it would replace a live session's turns silently
            raise InputError(
                f"interaction: instance_id {instance_id!r} is a session still open",
                "call finalize_interaction on it first, or pass a new id",
            )
        unit = kwargs.get("user")
        if not isinstance(unit, Mapping):
            raise InputError(
                "interaction_kwargs: no simulated user (`user`)",
                "write the data with `personaemp export --dialogues`",
            )
        unit = _plain(unit)
        style = unit.get("seeker") or self.options.seeker
        unit["seeker"] = seekers.style_for(style, unit.get("big_five"))
        missing = [key for key in USER_KEYS if key not in unit]
        if missing:
            raise InputError(
                f"interaction_kwargs: the simulated user has no {', '.join(missing)}",
                "write the data with `personaemp export --dialogues`",
            )
        if self.options.voice is not None:
            shown = unit["voice"].splitlines()[-self.options.voice :] if self.options.voice else []
            unit = {**unit, "voice": "\n".join(shown)}
        user = _simulated_user(unit)
        need = await self.service.call(
            lambda engine: write_hidden_need(engine, user, self.prompts(engine.prompt_variant)[0])
        )
        opening = DialogueTurn(role="user", text=unit["query"], emotion=INITIAL_EMOTION, change=0,
                               reason="the opening message (the query)", need_met=False)  # fmt: skip
        self.sessions[instance_id] = Session(user, unit, need, [opening])
        self.counts["sessions"] += 1
        return instance_id

    def session(self, instance_id: str | None) -> Session:
        if instance_id not in self.sessions:
            raise InputError(
                f"interaction: no session {instance_id!r} (never started, or finalized)",
                "call start_interaction first and use the id it returns",
            )
        return self.sessions[instance_id]

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs
    ) -> tuple[bool, str, float | None, dict[str, Any]]:
        session = self.session(instance_id)
        if session.ended_by is not None:
            raise InputError(f"interaction: session {instance_id!r} has ended ({session.ended_by})")
        if not isinstance(messages, list | tuple) or not all(isinstance(m, Mapping) for m in messages):
            wrong = (
                messages
                if not isinstance(messages, list | tuple)
                else next(m for m in messages if not isinstance(m, Mapping))
            )
            raise InputError(
                f"interaction: generate_response's messages must be a list of chat messages (dicts with "
                f"role and content), not one holding {type(wrong).__name__}",
                'pass [{"role": "assistant", "content": ...}, ...]',
            )
        reply = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
        text = split_reasoning(_content(reply))[0].strip() if reply is not None else ""
        if not text:
            raise InputError(
                f"interaction: session {instance_id!r}: no supporter message to answer (the last "
                "assistant message is empty or missing)",
                "pass the conversation with the policy's reply last",
            )
        session.turns.append(DialogueTurn(role="assistant", text=text))
        number = sum(t.role == "assistant" for t in session.turns)
        self.counts["turns"] += 1
        try:
            turn, ends = await self.service.call(
                lambda engine: simulate_user_turn(
                    engine, session.user, session.need, session.turns, self.prompts_of(engine),
                    attempts=self.options.turn_attempts, character_check=self.options.character_check,
                )
            )  # fmt: skip
        except UnitError as error:
            if error.kind in ENDPOINT_KINDS:
                raise  # an endpoint that cannot be used stops the step, as in the reward
            # No reply kept the rules: the simulator failed, not the policy. The session ends,
            # marked, with no reward (None: verl keeps no turn score, TRL leaves the rollout
            # out of its group's baseline and gives it no advantage; docs/multi-turn-training.md).
            self.counts["simulator_failures"] += 1
            session.ended_by = "simulator_failed"
            session.turns.pop()
            return (
                True,
                "",
                None,
                {"ended_by": session.ended_by, "simulator_failed": True, "session_reward": None},
            )
        session.turns.append(turn)
        if turn.need_met and session.need_met_at is None:
            session.need_met_at = number
        if ends:
            session.ended_by = "user"
        elif turn.emotion >= SATISFIED:
            session.ended_by = "satisfied"
        elif turn.emotion < GIVE_UP:
            session.ended_by = "gave_up"
        elif number >= self.options.max_turns:
            session.ended_by = "max_turns"
        extra = {"turn": number, "emotion": turn.emotion, "change": turn.change, "need_met": turn.need_met}
        if session.ended_by is None:
            return False, turn.text, turn.emotion / 100, extra
        self.counts[f"ended_by_{session.ended_by}"] += 1
        reward = await self.calculate_score(instance_id)
        extra.update(ended_by=session.ended_by, session_reward=reward, safety_penalty=session.safety_penalty,
                     risky=behaviour_judge.risky_count(session.behaviours or []))  # fmt: skip
        return True, turn.text, reward, extra

    async def calculate_score(self, instance_id: str | None = None, **kwargs) -> float | None:
        """The session reward of `instance_id` now (see the module's docstring); None for a
        session the simulator failed (no reward: leave it out)."""
        session = self.session(instance_id)
        if session.ended_by == "simulator_failed":
            return None
        if session.reward is not None and session.ended_by is not None:
            return session.reward
        emotion = next(t.emotion for t in reversed(session.turns) if t.emotion is not None) / 100
        how = self.options.session_reward
        spoke = any(t.role == "assistant" for t in session.turns)
        if how == "emotion" or not spoke:
            reward = emotion
        else:
            h = await self.service.call(lambda engine: self._peregrm(engine, session))
            reward = h if how == "peregrm" else (1 - self.options.weight) * emotion + self.options.weight * h
        if self.safety > 0 and spoke:
            session.safety_penalty = await self.service.call(lambda engine: self._safety(engine, session))
            reward -= session.safety_penalty
        if session.ended_by is not None:
            session.reward = reward
        return reward

    @staticmethod
    def _person(session: Session) -> str:
        """What the behaviour judge knows of the person: the moment and their memories, as
        evaluate --dialogues gives it."""
        return behaviour_judge.person_text(
            session.unit.get("situation", ""), session.unit.get("memories") or ()
        )

    async def _safety(self, engine, session: Session) -> float:
        """The safety term: each supporter turn judged for risky behaviours (quotes checked),
        `safety` per risky behaviour, `safety_bound` at most. A turn the judge cannot answer
        counts as the bound (a judge failure never pays), counted."""
        judged = []
        for number, (text, messages) in enumerate(
            behaviour_judge.turn_requests(session.turns, self.behaviour_prompt, self._person(session)), 1
        ):
            try:
                reply = await engine.call(behaviour_judge.BEHAVIOUR_JUDGE, messages)
            except UnitError as error:
                if error.kind in ENDPOINT_KINDS:
                    raise
                self.counts["safety_fallbacks"] += 1
                session.behaviours = judged
                return self.safety_bound
            judged.append({"turn": number, **behaviour_judge.parse_turn(text, reply.value)})
        session.behaviours = judged
        return behaviour_judge.safety_penalty(
            behaviour_judge.risky_count(judged), self.safety, self.safety_bound
        )

    async def _peregrm(self, engine, session: Session) -> float:
        """H of the dynamic session judge over the supporter's side, each dimension @k; an
        unreadable judgment counts 3 of 5 (the authors' reward), counted."""
        unit = {**session.unit, "response": dialogue_text(session.turns), "criteria": None}
        scores = {}
        for dimension in DIMENSIONS:
            messages = session_messages(unit, dimension, self.judge_prompt, "paper")
            got = []
            for sample in range(self.options.samples):
                try:
                    got.append(
                        (await engine.call(SESSION_JUDGE_DYNAMIC, messages, sample=sample)).value.score
                    )
                except UnitError as error:
                    if error.kind in ENDPOINT_KINDS:
                        raise
                    self.counts["judge_fallbacks"] += 1
                    got.append(NEUTRAL)
            scores[dimension] = statistics.fmean(got)
        return harmonic(scores)

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs) -> None:
        self.sessions.pop(instance_id, None)


def _simulated_user(unit: dict) -> SimulatedUser:
    """The simulated user of `interaction_kwargs["user"]`, its memories checked as export
    writes them (a list of memory objects, memory_ids a list of ids): an error names the key."""
    from pydantic import ValidationError

    from personaemp.errors import first_problem

    hint = "write the data with `personaemp export --dialogues`"
    memories, ids = unit["memories"], unit["memory_ids"]
    if not isinstance(memories, list) or not all(isinstance(m, Mapping) for m in memories):
        shown = f"{memories!r:.80}"
        raise InputError(f"interaction_kwargs: user.memories must be a list of memories, not {shown}", hint)
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise InputError(f"interaction_kwargs: user.memory_ids must be a list of ids, not {ids!r:.80}", hint)
    try:
        return SimulatedUser.of_unit(unit)
    except ValidationError as error:
        raise InputError(f"interaction_kwargs: user.memories.{first_problem(error)}", hint) from None


def _content(message: Mapping[str, Any]) -> str:
    """A chat message's text (a string, or a list of text parts)."""
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return str(content)


def _plain(value: Any) -> Any:
    """numpy arrays and scalars (a parquet row read by pandas) as lists, dicts and numbers."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def compute_score(data_source=None, solution_str="", ground_truth=None, extra_info=None, **kwargs) -> float:
    """verl's custom reward for rollouts driven by the Interaction: the last turn score (the
    session reward when the session ended it; see the module's docstring)."""
    found = (extra_info or {}).get("turn_scores") if isinstance(extra_info, Mapping) else None
    found = _plain(found) if found is not None else []
    if not isinstance(found, list) or not all(
        score is None or (isinstance(score, int | float) and not isinstance(score, bool)) for score in found
    ):
        raise InputError(
            f"compute_score: extra_info['turn_scores'] must be a list of numbers, not {found!r:.80}",
            "pass the agent loop's extra_fields.turn_scores",
        )
    scores = [float(score) for score in found if score is not None]  # None: the simulator failed a turn
    if any(not math.isfinite(score) for score in scores):
        raise InputError(
            f"compute_score: extra_info['turn_scores'] holds a number that is not finite ({scores})"
        )
    return scores[-1] if scores else 0.0


__all__ = ["CLASS_PATH", "NAME", "InteractionOptions", "SimulatedUserInteraction", "compute_score"]
