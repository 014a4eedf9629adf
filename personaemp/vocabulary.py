"""The closed sets of names the options and the stages share, each declared once.

Each is one `Literal` (what an option's type and a checker see); its tuple, where code loops
over the names, is derived from it with `get_args`. The stages import their names from here,
and so do the options modules, so `personaemp --help` reads them without loading a stage.
"""

from __future__ import annotations

from typing import Literal, get_args

# Input readers (personaemp.sources) and conversation-log readers (personaemp.sources.logs).
Format = Literal["auto", "task1", "raw", "hf"]
FORMATS: tuple[str, ...] = get_args(Format)
LogReader = Literal["wildchat", "messages", "sharegpt", "table"]
LOG_READERS: tuple[str, ...] = get_args(LogReader)
LogFormat = Literal["auto", LogReader, "task1"]  # extract-memories --format
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)

# The checks of a generated query (personaemp.instruments.query_check): the judge's first.
Judged = Literal["emotional_support", "logical_consistency", "role_awareness"]
JUDGED: tuple[str, ...] = get_args(Judged)
Check = Literal[
    Judged, "memory_ids_valid", "category_match", "length_ok", "language_match", "not_duplicate",
    "not_copied", "no_scaffolding", "no_internal_ids",
]  # fmt: skip
CHECKS: tuple[str, ...] = get_args(Check)

# Checked on every persona trait statement and Big Five rationale (personaemp.dataset.persona).
PersonaCheck = Literal["no_internal_ids", "level_matches_rationale"]
PERSONA_CHECKS: tuple[str, ...] = get_args(PersonaCheck)

# The LLM steps, each a `Step` of its stage's module ([llm.steps.<step>] samples one).
StepName = Literal[
    "persona", "situations", "check",
    "criteria", "respond", "summary", "judge", "judge_dynamic", "bystander", "judge_joint",
    "extract_memories", "hidden_need", "simulate", "in_character",
]  # fmt: skip
STEP_NAMES: tuple[str, ...] = get_args(StepName)
StepKey = Literal["temperature", "max_tokens"]
STEP_KEYS: tuple[str, ...] = get_args(StepKey)

# What a policy sees of the user (personaemp.instruments.policy: respond, export's prompts).
Context = Literal["none", "memory", "memory-summary", "rag", "mismatch", "persona"]
CONTEXTS: tuple[str, ...] = get_args(Context)

# Where a request about one PERM dimension holds its standard (personaemp.prompts).
LayoutName = Literal["paper", "shared"]
LAYOUTS: tuple[str, ...] = get_args(LayoutName)

# The split files (personaemp.splits): two settings, two parts each.
SplitName = Literal["random", "ood"]
Part = Literal["train", "test"]

# What the training reward scores a rollout it could not judge (training.reward_instrument.FALLBACKS).
Fallback = Literal["lowest", "neutral", "floor"]

# How hard a simulated user is to help (personaemp.instruments.seekers, prompts/seekers.md);
# `gen-dialogues --seeker` also takes auto (by the user's Big Five levels).
Seeker = Literal["cooperative", "guarded", "resistant", "validation-seeking", "escalating"]
SEEKERS: tuple[str, ...] = get_args(Seeker)
SeekerChoice = Literal[Seeker, "auto"]
SEEKER_CHOICES: tuple[str, ...] = get_args(SeekerChoice)

# Why a simulated dialogue ended (personaemp.records.Dialogue.ended_by).
Ending = Literal["max_turns", "user", "satisfied", "gave_up"]
ENDINGS: tuple[str, ...] = get_args(Ending)

# What the behaviour judge looks for in a supporter's reply (personaemp.instruments.behaviours,
# which describes each): the risky ones cost reward, the protective ones are counted.
Risky = Literal[
    "agrees_with_false_belief", "validates_harmful_plan", "escalates_emotion", "misses_risk_signal",
    "claims_human_or_therapist",
]  # fmt: skip
Protective = Literal["gentle_pushback", "grounds_in_facts", "points_to_help", "keeps_boundary"]
Behaviour = Literal[Risky, Protective]
BEHAVIOURS: tuple[str, ...] = get_args(Behaviour)

# Output formats of `export` (personaemp.training.export) and `table` (personaemp.evaluation.table).
ExportFormat = Literal["trl", "verl"]
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)
TableFormat = Literal["markdown", "csv", "latex"]
TABLE_FORMATS: tuple[str, ...] = get_args(TableFormat)
