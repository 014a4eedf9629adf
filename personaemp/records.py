"""Pydantic models for the rows every stage writes (the contract between stages)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator
from pydantic_core import PydanticCustomError

from personaemp.vocabulary import ENDINGS, SEEKERS, Ending, Seeker  # noqa: F401 - read from here too


class Record(BaseModel):
    # Later stages extend a row with new fields; reading it back must keep working.
    model_config = ConfigDict(extra="ignore")


class Turn(Record):
    role: str
    text: str
    session_id: str | None = None
    index: int | None = None


class Memory(Record):
    memory_id: str
    label: str
    label_suggestion: str | None = None
    value: str
    evidence_text: str | None = None
    type: str | None = None
    confidence: float | None = None
    emotion: str | None = None


class Intent(Record):
    category: str
    subtype: str | None = None


class Source(Record):
    format: str
    path: str
    benchmark_id: str | None = None
    line_index: int | None = None


class FilterMatch(Record):
    matched_rules: list[str]
    matched_memory_ids: list[str]
    flagged_memories_dropped: int = 0


class User(Record):
    """One user as the filter writes it: memories never include annotator-flagged ones."""

    user_id: str
    source: Source
    language: str | None = None
    turns: list[Turn]
    memories: list[Memory]
    intents: list[Intent] = []
    filter: FilterMatch | None = None


# --- infer-persona -------------------------------------------------------------------

Aspect = Literal[
    "emotional_traits",
    "stress_response",
    "social_context",
    "values_motivations",
    "support_preferences",
    "sensitivities",
]
Level = Literal["low", "medium", "high"]
BIG_FIVE = ("openness", "conscientiousness", "extraversion", "agreeableness", "neuroticism")


class Trait(Record):
    aspect: Aspect
    statement: str
    evidence: list[str]  # memory ids, all checked to exist for this user
    checks: dict[str, bool] | None = None  # persona check -> passed (None: rows from before them)
    reasons: dict[str, str] = {}  # check -> why it failed


class TraitLevel(Record):
    level: Level
    evidence: list[str]
    rationale: str
    thin_evidence: bool  # no valid memory supports the level (the prompt says: choose medium)
    checks: dict[str, bool] | None = None  # persona check -> passed (None: rows from before them)
    reasons: dict[str, str] = {}  # check -> why it failed


class BigFive(Record):
    openness: TraitLevel
    conscientiousness: TraitLevel
    extraversion: TraitLevel
    agreeableness: TraitLevel
    neuroticism: TraitLevel


class Grounding(Record):
    """What the deterministic grounding check removed from the model's reply."""

    traits_proposed: int = 0
    traits_dropped: int = 0  # no valid evidence left
    citations_dropped: int = 0  # ids that are not this user's memories


class Provenance(Record):
    model: str
    endpoint_kind: str
    prompts: dict[str, str]  # prompt name -> hash
    created_at: str


class Persona(User):
    """A persona row: the user row plus the inferred persona (DESIGN.md "Persona")."""

    eligible: bool
    gate_reason: str
    topics: list[str] = []
    traits: list[Trait] = []
    profile: str = ""
    big_five: BigFive | None = None
    grounding: Grounding = Grounding()
    enforced: list[str] | None = None  # the persona checks it had to pass (None: rows from before them)
    provenance: Provenance

    @model_validator(mode="after")
    def _eligible_is_complete(self) -> Persona:
        """An eligible persona is what later stages build on: it needs all three parts."""
        if self.eligible:
            for name, value in (
                ("traits", self.traits),
                ("profile", self.profile),
                ("big_five", self.big_five),
            ):
                if not value:
                    raise PydanticCustomError("eligible_incomplete", f"an eligible persona needs {name}")
        return self


# --- gen-queries ---------------------------------------------------------------------

Category = Literal["ES", "HEQ", "SS"]
CATEGORIES = ("ES", "HEQ", "SS")
# The one definition of each query category (name, what the user wants): the situations
# prompt and the judge's prompt both render it.
CATEGORY_DEFINITIONS = {
    "ES": ("emotional support", "they want to feel heard, validated, comforted."),
    "HEQ": (
        "high-EQ interaction",
        "an emotionally delicate interpersonal moment: a conflict, keeping a relationship "
        "going, calming a tense situation.",
    ),
    "SS": (
        "social strategy",
        "they want to know what to say or do to reach a goal with other people: etiquette, "
        "persuasion, how to frame or ask for something.",
    ),
}


def category_definitions(categories=CATEGORIES) -> str:
    """The definitions as prompt lines, for the prompts' $category_definitions slot."""
    return "\n".join(
        f"- {code} ({CATEGORY_DEFINITIONS[code][0]}): {CATEGORY_DEFINITIONS[code][1]}" for code in categories
    )


class Situation(Record):
    topic: str
    text: str
    memory_ids: list[str]


class Checks(Record):
    """Every check a query went through; `passed` is their conjunction."""

    emotional_support: bool  # LLM judge: needs an emotionally intelligent answer
    logical_consistency: bool  # LLM judge: agrees with memories and situation
    role_awareness: bool  # LLM judge: fits the persona, written from the user's side
    language: str | None  # LLM judge: the language it names
    memory_ids_valid: bool
    category_match: bool  # the judge's category equals the situation's
    length_ok: bool
    language_match: bool  # detected language equals the user's
    not_duplicate: bool
    not_copied: bool = True  # repeats no long stretch of the user's own text (older rows: unchecked)
    no_scaffolding: bool = True  # holds no text of our prompts (older rows: unchecked)
    no_internal_ids: bool = True  # it and its moment name no id of ours (older rows: unchecked)
    passed: bool
    reasons: dict[str, str] = {}  # check -> why it failed (and the judge's note)
    enforced: list[str] | None = None  # the checks `passed` is made of (None: rows from before it was kept)


class Query(Record):
    query_id: str
    category: Category
    situation: Situation
    query: str
    memory_ids: list[str]
    checks: Checks
    provenance: Provenance


# --- criteria, respond, evaluate -------------------------------------------------------

Dimension = Literal["resonation", "expression", "reception"]
# The one definition of each PERM dimension (extended with the user's persona and
# memories): the criteria prompt and both judge prompts render it.
DIMENSION_DEFINITIONS = {
    "resonation": "does the response understand this user's emotions and the needs under "
    "them, given what they have lived through and who they are?",
    "expression": "are the response's strategy, tone and style the ones that suit this particular person?",
    "reception": "would this user, as the memories and persona describe them, feel "
    "supported by the response?",
}
DIMENSIONS = tuple(DIMENSION_DEFINITIONS)


class Criterion(Record):
    name: str
    weight: float  # normalised: a query's criteria for one dimension sum to 100
    description: str
    given_weight: float | None = None  # what the model wrote before normalising


class Response(Record):
    """A row of a responses file: what `evaluate` needs (bring your own with these two)."""

    query_id: str
    response: str | None


# --- gen-dialogues -------------------------------------------------------------------

EMOTION_MAX = 100  # a simulated emotion is 0..EMOTION_MAX
MAX_CHANGE = 10  # a turn moves the emotion by at most this much either way (SAGE's clamp)
# The simulated user leaves satisfied at SATISFIED and gives up below GIVE_UP: a dialogue ends
# on the first simulated turn that reaches either (gen-dialogues and the training Interaction).
SATISFIED, GIVE_UP = EMOTION_MAX, 10


def _no_bool(value: Any) -> Any:
    """A number field given true/false (which pydantic would read as 1/0) is refused."""
    if isinstance(value, bool):
        raise PydanticCustomError("dialogue_invalid", "a boolean where a number belongs")
    return value


def _only_bool(value: Any) -> Any:
    """need_met given a number or text (which pydantic would read as a boolean) is refused."""
    if value is not None and not isinstance(value, bool):
        raise PydanticCustomError(
            "dialogue_invalid", "need_met is true or false, not {value}", {"value": repr(value)}
        )
    return value


REJECTED_KEYS = ("text", "thought")  # a rejected entry's reserved keys beside its failed rules


class DialogueTurn(Record):
    """One turn; emotion, change, reason, need_met and thought are the simulated user's inner
    state after reading the supporter (user turns only; the opening turn has the initial emotion)."""

    role: Literal["user", "assistant"]
    text: str
    emotion: int | None = None  # 0-100
    change: int | None = None  # clamped to the step bound (MAX_CHANGE)
    reason: str | None = None
    need_met: bool | None = None
    thought: str | None = None  # the simulated user's inner thought, never shown (as SAGE keeps it)
    # The checks that ran on the reply kept (user turns the simulator wrote): a check that did
    # not run (the LLM's under --no-character-check) is absent, never True.
    checks: dict[str, bool] | None = None
    # Replies asked again, each: failed rule -> why, plus "text" (the reply) and "thought".
    rejected: list[dict[str, str]] = []

    _numbers = field_validator("emotion", "change", mode="before")(_no_bool)
    _booleans = field_validator("need_met", mode="before")(_only_bool)


def _invalid(message: str):
    return PydanticCustomError("dialogue_invalid", message)


class Dialogue(Record):
    """A gen-dialogues row (DESIGN.md "Dialogue"): the field names are a published contract.
    Its invariants are checked here, so every reader (personaemp.io.iter_records) refuses a row
    that cannot be true."""

    dialogue_id: str
    user_id: str
    query_id: str
    category: Category
    language: str | None
    hidden_need: str  # never in a supporter request
    initial_emotion: int
    final_emotion: int
    need_met_at_turn: int | None  # the supporter turn after which the need was first met
    ended_by: Ending
    supporter_model: str
    simulator_model: str
    memory_ids: list[str]  # the memories the query cites: the simulator's ground
    background_memory_ids: list[str]  # the user's other memories, shown as background
    context: str  # what the supporter saw besides the conversation (respond's --context)
    seeker: Seeker = "cooperative"  # the simulated user's style (gen-dialogues --seeker)
    turns: list[DialogueTurn]
    provenance: Provenance  # the simulator's (its prompts' hashes, the supporter's prompt too)

    _numbers = field_validator("initial_emotion", "final_emotion", "need_met_at_turn", mode="before")(
        _no_bool
    )

    def supporter_turns(self) -> int:
        return sum(t.role == "assistant" for t in self.turns)

    @model_validator(mode="after")
    def _can_be_true(self) -> Dialogue:
        for name in ("initial_emotion", "final_emotion"):
            if not 0 <= getattr(self, name) <= EMOTION_MAX:
                raise _invalid(f"{name} {getattr(self, name)} is outside 0-{EMOTION_MAX}")
        if not self.turns:
            raise _invalid("turns is empty: a dialogue opens with the user's message")
        emotion = None
        for number, turn in enumerate(self.turns, 1):
            expected = "user" if number % 2 else "assistant"
            if turn.role != expected:
                raise _invalid(f"turn {number} is the {turn.role}'s: turns alternate, the user's first")
            if not turn.text.strip():
                raise _invalid(f"turn {number} has no text")
            if turn.role == "assistant":
                continue
            if turn.emotion is None:
                raise _invalid(f"user turn {number} has no emotion")
            if not 0 <= turn.emotion <= EMOTION_MAX:
                raise _invalid(f"turn {number}'s emotion {turn.emotion} is outside 0-{EMOTION_MAX}")
            if turn.change is not None and abs(turn.change) > MAX_CHANGE:
                raise _invalid(f"turn {number}'s change {turn.change} is beyond ±{MAX_CHANGE}")
            if emotion is None:
                if turn.emotion != self.initial_emotion:
                    raise _invalid(f"the opening turn's emotion {turn.emotion} is not {self.initial_emotion}")
            elif turn.change is not None and turn.emotion != max(0, min(EMOTION_MAX, emotion + turn.change)):
                raise _invalid(f"turn {number}'s emotion {turn.emotion} is not {emotion} {turn.change:+d}")
            elif turn.change is None and abs(turn.emotion - emotion) > MAX_CHANGE:
                raise _invalid(
                    f"turn {number}'s emotion {turn.emotion} moves {turn.emotion - emotion:+d} "
                    f"from {emotion} with no change, beyond ±{MAX_CHANGE}"
                )
            if emotion is not None and number < len(self.turns) and not GIVE_UP <= turn.emotion < SATISFIED:
                raise _invalid(
                    f"the dialogue goes on after turn {number}'s emotion {turn.emotion}: it ends at "
                    f"{SATISFIED} (satisfied) or below {GIVE_UP} (gave up)"
                )
            emotion = turn.emotion
        if self.turns[-1].role != "user":
            raise _invalid("it ends on the supporter's turn: the simulated user answers every supporter turn")
        if self.final_emotion != emotion:
            raise _invalid(f"final_emotion {self.final_emotion} is not the last user turn's {emotion}")
        self._ending_fits(emotion)
        supporter = self.supporter_turns()
        if self.need_met_at_turn is not None and not 1 <= self.need_met_at_turn <= supporter:
            raise _invalid(
                f"need_met_at_turn {self.need_met_at_turn} is beyond its {supporter} supporter turns"
            )
        # the supporter turn whose reply first says the need was met (turn 2k+1 answers turn 2k)
        met = next((n // 2 for n, t in enumerate(self.turns) if n and t.role == "user" and t.need_met), None)
        if self.need_met_at_turn != met:
            said = f"turn {2 * met + 1} is the first with need_met" if met else "no turn has need_met true"
            raise _invalid(f"need_met_at_turn {self.need_met_at_turn} disagrees with its turns ({said})")
        query_owner, _, number = self.query_id.rpartition("-q")
        if query_owner and number.isdigit() and query_owner != self.user_id:
            raise _invalid(f"user_id {self.user_id!r} is not the user of query {self.query_id!r}")
        return self

    def _ending_fits(self, final: int) -> None:
        """ended_by as the final emotion allows: satisfied at SATISFIED, gave_up below GIVE_UP,
        max_turns between them; `user` (the simulated user said goodbye) at any emotion."""
        fits = {
            "satisfied": final >= SATISFIED,
            "gave_up": final < GIVE_UP,
            "max_turns": GIVE_UP <= final < SATISFIED,
            "user": True,
        }
        if not fits[self.ended_by]:
            raise _invalid(f"ended_by {self.ended_by!r} contradicts final_emotion {final}")
