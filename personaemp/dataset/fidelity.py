"""`personaemp fidelity`: does the simulated user write like the real person it plays?
(docs/fidelity.md)

For each user of a build, a *cut*: a real user message that follows an assistant reply (the
last such message, or `cuts` of them per user, seeded). The simulator sees the real
conversation up to the cut and writes the user's next message; the real one is held out.
Each *variant* gives it a different context about the person (VARIANTS), on the same cuts;
two *controls* need no model: `self`, the same user's other real message (the ceiling: how
close a person is to themselves), and `other`, another user's real message at a similar
point, in the same language (the floor). Every message is measured by the deterministic
metrics of instruments/realism.py and compared with the real one.

No leakage: nothing from the cut on reaches a prompt. The conversation stops before the cut;
the voice (the person's own messages, instruments/voice.py) is taken from before the cut;
a memory is given only when every part of its evidence is found in the user's messages
before the cut and none in the held-out message or after it (else it is withheld, counted
per cut); the persona and Big Five are inferred again from what precedes the cut, by
infer-persona's own step (dataset/persona.py, the same prompt and cache), since the build's
persona read the whole history, the held-out message included.

`discriminator`: a blinded LLM is shown the conversation so far and two candidates (the
real next message and a variant's, or the `self` control's) and asked which one the person
wrote; each pair in both orders, so position bias cancels.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

from personaemp.aio import sync_twin
from personaemp.dataset.fidelity_cuts import Skipped, make_cuts
from personaemp.errors import InputError, UnitError
from personaemp.instruments import realism, simulator_rules
from personaemp.instruments.voice import VOICE, VOICE_RULE, pick_voice, render_voice
from personaemp.options import Opt, Section, declare
from personaemp.shared_options import PROCESSED, _split_commas

STAGE = "fidelity"
VARIANTS = ("none", "persona", "memories", "full", "full-novoice")
VARIANT_TEXT = {
    "none": "the conversation only",
    "persona": "the conversation, the profile and the Big Five levels",
    "memories": "the conversation and the memories",
    "full": "what gen-dialogues' simulator gets: profile, Big Five, memories and the voice",
    "full-novoice": "full with --voice 0",
}
CONTROLS = ("other", "self")  # the floor and the ceiling
NOT_GIVEN = "(not given)"
# The rows' shape: bumped when a row gains a field, so that rows of an older shape are made
# again (from the reply cache: no request) rather than reused.
ROWS = 3  # 2: the conversation shown (dialogue, reply), for review --fidelity; 3: a variant's `failed`
# A variant whose every attempt the model got wrong (not JSON, cut off, copying the reply): a
# measured outcome of that simulator on that cut, kept in the row; the other variants go on.
# Any other failure (the endpoint's) fails the cut, to be retried.
OWN_FAILURES = frozenset({"invalid", "truncated", "empty"})
LEAKAGE_RULE = (
    "nothing from the cut on reaches a prompt: the conversation stops before the cut; the voice and the "
    "persona's messages are from before it; a memory is given only when its evidence is found before the "
    "cut and not from it on; the persona and Big Five are inferred again from what precedes the cut "
    "(infer-persona's step, its cache)"
)

Variant = Literal["none", "persona", "memories", "full", "full-novoice"]


@declare("fidelity")
class FidelityOptions(Section):
    """[fidelity]: the simulated user against the real person, on held-out real messages."""

    input: Annotated[
        Path,
        Opt.input(
            "A build's users with their sessions (filter's output with --turns all, or infer-persona's "
            "output over it).",
            derive="processed:personas.jsonl",
        ),
    ] = PROCESSED / "personas.jsonl"
    output: Annotated[
        Path,
        Opt.output(
            "One row per cut: the real message, each variant's simulated one, the controls, the metrics; "
            "the report (fidelity.json) goes beside it.",
            derive="processed:fidelity.jsonl",
            beside=("fidelity.failures.jsonl", "{stem}.json"),
        ),
    ] = PROCESSED / "fidelity.jsonl"
    cuts: Annotated[
        int | None,
        Field(ge=1),
        Opt("Cuts per user, chosen at random (--cut-seed) among the messages after an assistant reply "
            "(default: the last such message)."),
    ] = None  # fmt: skip
    cut_seed: Annotated[int, Opt("Seed of the cuts (--cuts) and of the `other` control's ties.")] = 0
    context: Annotated[
        list[Variant],
        BeforeValidator(_split_commas),
        Opt("Variants (what the simulator is told about the person), on the same cuts: "
            + "; ".join(f"{name}: {text}" for name, text in VARIANT_TEXT.items()) + "."),
    ] = list(VARIANTS)  # fmt: skip
    voice: Annotated[
        int,
        Field(ge=0, le=20),
        Opt(
            "The person's own earlier messages shown as their voice in `full` (0: none); " + VOICE_RULE + "."
        ),
    ] = VOICE
    discriminator: Annotated[
        bool,
        Opt(
            "Also ask a blinded LLM which of two messages the person wrote next (two requests a pair: both "
            "orders), for every variant and the `self` control."
        ),
    ] = False
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N users.")] = None


# --- the steps -----------------------------------------------------------------------------------


class NextMessage(BaseModel):
    thought: str = Field(description="what they want from the reply, never shown")
    end: bool = Field(description="they leave the chat after this message")
    text: str = Field(min_length=1, description="the message they send next")


class Pick(BaseModel):
    reason: str
    pick: Literal["A", "B"]


def _steps():
    from personaemp.dataset.persona import PERSONA_STEP
    from personaemp.llm.step import Step

    next_message = Step("fidelity_next", NextMessage, prompt="fidelity_user")
    pick = Step("fidelity_pick", Pick, prompt="fidelity_pick", temperature=0.0)
    return PERSONA_STEP, next_message, pick


def variant_values(unit: dict, variant: str, persona: dict | None) -> dict[str, str]:
    """The simulator's slots for one variant: only what that variant gives, from before the cut."""
    from personaemp.records import BIG_FIVE, Memory
    from personaemp.render import render_memories

    gives_persona = variant in ("persona", "full", "full-novoice")
    gives_memories = variant in ("memories", "full", "full-novoice")
    profile, big_five = NOT_GIVEN, NOT_GIVEN
    if gives_persona:
        profile = (persona or {}).get("profile") or "(none)"
        levels = (persona or {}).get("big_five")
        big_five = ", ".join(f"{t} {levels[t]}" for t in BIG_FIVE) if levels else "(unknown)"
    if variant == "full" and unit["voice"]:
        profile += f"\n\nHow they write (their own earlier messages):\n{render_voice(unit['voice'])}"
    memories = NOT_GIVEN
    if gives_memories:
        memories = render_memories([Memory.model_validate(m) for m in unit["memories"]]) or "(none)"
    return {"profile": profile, "memories": memories, "big_five": big_five}


def build_next_messages(unit: dict, variant: str, persona: dict | None, language: str, prompt) -> list[dict]:
    return prompt.render(
        **variant_values(unit, variant, persona),
        dialogue=unit["dialogue"],
        reply=unit["reply"],
        language=language,
    )


def no_echo(text: str, unit: dict, variant: str) -> str:
    """The simulated message, unless it copies LEAK_WORDS words of the reply or of a voice
    exemplar shown (ValueError: the engine asks again, saying why)."""
    sources = {"the assistant's latest reply": unit["reply"]}
    if variant == "full":
        sources.update({f"their earlier message {n}": v for n, v in enumerate(unit["voice"], 1)})
    passed, why = simulator_rules.no_echo(text, sources)
    if not passed:
        raise ValueError(f"text {why}; write the person's own new message")
    return text


def build_pick_messages(unit: dict, first: str, second: str, prompt) -> list[dict]:
    earlier = render_voice(pick_voice([t["text"] for t in unit["persona_source"]["turns"]], VOICE))
    return prompt.render(turns=earlier or "(none)", dialogue=unit["dialogue"], first=first, second=second)


# --- the stage -----------------------------------------------------------------------------------


def read_users(path: Path, limit: int | None) -> list[dict]:
    from personaemp.io import ErrorPolicy, iter_jsonl
    from personaemp.records import User

    rows = []
    for lineno, _, row in iter_jsonl(Path(path), ErrorPolicy("fail")):
        try:
            User.model_validate(row)
        except Exception as exc:  # pydantic's ValidationError: the row is not a user
            raise InputError(
                f"{path}:{lineno}: not a user row ({str(exc).splitlines()[0]})",
                "pass filter's output (--turns all) or infer-persona's",
            ) from None
        rows.append(row)
        if limit is not None and len(rows) == limit:
            break
    return rows


@dataclass
class FidelityOptionsUsed:
    variants: tuple[str, ...] = VARIANTS
    cuts: int | None = None
    seed: int = 0
    voice: int = VOICE
    discriminator: bool = False

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown or not self.variants:
            raise InputError(f"--context takes {', '.join(VARIANTS)}, not {', '.join(unknown) or 'nothing'}")
        self.variants = tuple(dict.fromkeys(self.variants))

    def tag(self) -> str:
        return f"rows={ROWS}|variants={','.join(self.variants)}|voice={self.voice}|disc={self.discriminator}"


async def ameasure_fidelity(
    input_path: Path,
    output_path: Path,
    settings,
    *,
    options: FidelityOptionsUsed | None = None,
    limit: int | None = None,
    retry_failed: bool = False,
    console=None,
):
    """Fidelity of the simulated user on the users of `input_path`: fidelity.jsonl (one row per
    cut) at `output_path` and its report (fidelity.json) beside it; returns the StageResult, as
    `pe.measure_fidelity` does (`.report`: the run report, `.summary`: the fidelity report)."""
    from personaemp.dataset.persona import parse_persona, persona_schema, profile_text
    from personaemp.language import LANGUAGE_NAMES, user_language
    from personaemp.llm.stage import LLMStage, arun_llm_stage
    from personaemp.prompts import prompts_per_variant
    from personaemp.records import User
    from personaemp.results import of_llm_stage

    options = options or FidelityOptionsUsed()
    if settings.batch is not None:
        raise InputError("fidelity cannot work from batch files", "serve the model and give --base-url")
    skipped = Skipped()
    rows = read_users(Path(input_path), limit)
    units = make_cuts(rows, cuts=options.cuts, seed=options.seed, voice=options.voice, skipped=skipped)
    if not units:
        raise InputError(
            f"{input_path}: no cut to measure ({_skipped_text(skipped)})",
            "fidelity needs users with at least two messages, one after an assistant reply",
        )
    persona_step, next_step, pick_step = _steps()
    steps = (persona_step, next_step, pick_step)
    loaded = prompts_per_variant(steps)
    wants_persona = any(v in ("persona", "full", "full-novoice") for v in options.variants)

    def fingerprint(engine) -> str:
        hashes = loaded(engine.prompt_variant)[1]
        parts = [engine.fingerprint(step, hashes[step.name]) for step in steps]
        return "|".join([*parts, options.tag()])

    def make_work(engine):
        prompts, made_with = loaded(engine.prompt_variant)

        async def infer(unit: dict) -> dict | None:
            source = User.model_validate(unit["persona_source"])
            if not source.memories:
                return None  # nothing to ground a persona on: the profile says "(none)"
            result = await engine.call(
                persona_step,
                _persona_messages(source, prompts[persona_step.name]),
                schema=persona_schema(source, engine.shared_schemas, levels_required=True),
                parse=lambda reply: parse_persona(source, reply, require_depth=False),
            )
            parsed = result.parsed
            levels = (
                {t: getattr(parsed.big_five, t).level for t in realism_big_five()}
                if parsed.big_five
                else None
            )
            return {"profile": profile_text(parsed.traits), "big_five": levels}

        async def work(unit: dict) -> dict:
            persona = await infer(unit) if wants_persona else None
            code = user_language([t["text"] for t in unit["persona_source"]["turns"]]) or unit["language"]
            language = LANGUAGE_NAMES.get(code or "", code or "the language of their earlier messages")
            messages: dict[str, dict] = {}
            for variant in options.variants:
                try:
                    result = await engine.call(
                        next_step,
                        build_next_messages(unit, variant, persona, language, prompts[next_step.name]),
                        parse=lambda reply, v=variant: no_echo(reply.text.strip(), unit, v),
                    )
                except UnitError as error:  # the engine's LLMError, without importing openai here
                    if error.kind not in OWN_FAILURES:
                        raise
                    messages[variant] = {"text": None, "end": None, "failed": f"{error.kind}: {error}"}
                    continue
                messages[variant] = {"text": result.parsed, "end": result.value.end}
            row = measured(unit, messages, persona)
            if options.discriminator:
                row["discriminator"] = {}
                for source in [*options.variants, "self"]:
                    candidate = messages[source]["text"] if source != "self" else unit["self"]
                    if candidate is None:
                        continue  # the variant wrote no message of its own: nothing to compare
                    correct = []
                    for real_first in (True, False):
                        first, second = (unit["real"], candidate) if real_first else (candidate, unit["real"])
                        verdict = await engine.call(
                            pick_step, build_pick_messages(unit, first, second, prompts[pick_step.name])
                        )
                        correct.append(verdict.value.pick == ("A" if real_first else "B"))
                    row["discriminator"][source] = correct
            row["provenance"] = engine.provenance(made_with).model_dump(mode="json")
            return row

        return work

    n = len(options.variants)
    calls = {persona_step.name: int(wants_persona), next_step.name: n}
    if options.discriminator:
        calls[pick_step.name] = 2 * (n + 1)
    output_path = Path(output_path)
    plan = LLMStage(
        STAGE, units, make_work, key="cut_id", output=output_path, fingerprint=fingerprint, full=True,
        input_path=Path(input_path), retry_failed=retry_failed,
        steps=[step for step in steps if calls.get(step.name)], calls=calls,
        notes={"skipped": {"text": _skipped_text(skipped), **dict(skipped.counts)}},
    )  # fmt: skip
    report = await arun_llm_stage(plan, settings=settings, console=console)
    if settings.estimate:
        return of_llm_stage(report)
    from personaemp.io import ErrorPolicy, iter_jsonl

    wanted = {unit["cut_id"] for unit in units}
    done = [row for _, _, row in iter_jsonl(output_path, ErrorPolicy("fail")) if row["cut_id"] in wanted]
    summary = summarize(done, options, skipped, units=len(units))
    write_json(report_path(output_path), summary)
    return of_llm_stage(report, summary)


def realism_big_five() -> tuple[str, ...]:
    from personaemp.records import BIG_FIVE

    return BIG_FIVE


def _persona_messages(user, prompt):
    from personaemp.dataset.persona import build_persona_messages

    return build_persona_messages(user, prompt)


def _skipped_text(skipped: Skipped) -> str:
    if not skipped.counts:
        return "skipped: none"
    return "skipped: " + "; ".join(f"{n} {reason}" for reason, n in skipped.counts.items())


def report_path(output: Path) -> Path:
    return output.with_suffix(".json")


def write_json(path: Path, value: Any) -> None:
    from personaemp.io import write_json_atomic

    write_json_atomic(path, value)


# --- the measures (no LLM) ------------------------------------------------------------------------


def measured(unit: dict, messages: dict[str, dict], persona: dict | None) -> dict:
    """A cut's row: the messages, their features and each one's comparison with the real one."""
    language = unit["language"]
    texts = {"real": unit["real"], "self": unit["self"], "other": unit["other"]}
    texts.update({variant: made["text"] for variant, made in messages.items()})
    feats = {
        name: realism.features(text, language) if text is not None else None for name, text in texts.items()
    }
    scores, ending = {}, {}
    stops = {"self": unit["self_stops"], "other": unit["other_stops"]}
    stops.update({variant: made["end"] for variant, made in messages.items()})
    for name in texts:
        if name == "real":
            continue
        scores[name] = realism.compare(feats["real"], feats[name]) if feats[name] is not None else None
        ending[name] = None if stops[name] is None else float(stops[name] == unit["real_stops"])
    return {
        "cut_id": unit["cut_id"], "user_id": unit["user_id"], "language": language,
        "position": unit["position"],
        "dialogue": unit["dialogue"], "reply": unit["reply"],  # what the simulator saw (review --fidelity)
        "real": unit["real"], "real_stops": unit["real_stops"],
        "simulated": messages, "self": unit["self"], "other": unit["other"], "other_user": unit["other_user"],
        "memories_given": [m["memory_id"] for m in unit["memories"]],
        "memories_withheld": unit["memories_withheld"], "memories_unplaced": unit["memories_unplaced"],
        "voice_messages": len(unit["voice"]),
        "persona": persona, "features": feats, "scores": scores, "ending": ending,
    }  # fmt: skip


def _metric_names() -> list[str]:
    return [m.name for m in realism.METRICS] + [realism.ENDING]


def _kind(metric: str) -> str:
    return realism.BY_NAME[metric].kind if metric in realism.BY_NAME else "bool"


def _values(rows: Sequence[dict], source: str, metric: str) -> list[float]:
    out = []
    for row in rows:
        if metric == realism.ENDING:
            value = row["ending"].get(source)
        else:
            value = (row["scores"].get(source) or {}).get(metric)
        if value is not None:
            out.append(value)
    return out


def _mean(values: Sequence[float]) -> float | None:
    """The plain mean (a placement needs no bootstrap interval)."""
    return sum(values) / len(values) if values else None


def summarize(rows: Sequence[dict], options: FidelityOptionsUsed, skipped: Skipped, units: int) -> dict:
    """The report: per source (each variant, each control) and metric, the mean comparison with
    the real message (n, 95% bootstrap CI) overall and per language; each variant placed between
    its controls; the population distances; the voice's effect; the discriminator."""
    sources = [*CONTROLS, *options.variants]
    languages = sorted({row["language"] or "?" for row in rows})
    of_language = {
        language: [r for r in rows if (r["language"] or "?") == language] for language in languages
    }
    metrics: dict[str, dict] = {}
    for metric in _metric_names():
        metrics[metric] = {
            "kind": "distance" if _kind(metric) == "number" else "match",
            "rule": realism.BY_NAME[metric].rule if metric in realism.BY_NAME
            else "1 when the message's stop (its session's last user message; for a variant, the "
                 "simulator's end) agrees with the real user's",
            "overall": {source: realism.mean_ci(_values(rows, source, metric)) for source in sources},
            "by_language": {
                language: {source: realism.mean_ci(_values(of_language[language], source, metric))
                           for source in sources}
                for language in languages
            },
        }  # fmt: skip
    placed, answered = {}, {}
    for variant in options.variants:
        # like with like: the variant and its controls on the cuts the variant answered
        mine = [row for row in rows if _text(row, variant) is not None]
        answered[variant] = realism.wilson(len(mine), len(rows))
        placed[variant] = {}
        for metric in metrics:
            low, mid, high = (_mean(_values(mine, s, metric)) for s in ("other", variant, "self"))
            if None in (low, mid, high):
                placed[variant][metric] = None
                continue
            span = high - low
            placed[variant][metric] = {
                "other": low, "variant": mid, "self": high,
                "between": min(low, high) <= mid <= max(low, high),
                "share_of_gap": (mid - low) / span if span else None,
            }  # fmt: skip
    summary = {
        "stage": STAGE,
        "cuts": {
            "measured": len(rows),
            "units": units,
            "per_user": options.cuts or "last",
            "seed": options.seed,
        },
        "users": len({row["user_id"] for row in rows}),
        "languages": dict(Counter(row["language"] or "?" for row in rows)),
        "variants": {v: VARIANT_TEXT[v] for v in options.variants},
        "voice": {"k": options.voice, "rule": VOICE_RULE},
        "leakage": {
            "rule": LEAKAGE_RULE,
            "memories_withheld_per_cut": realism.mean_ci([row["memories_withheld"] for row in rows]),
            "memories_unplaced_per_cut": realism.mean_ci([row["memories_unplaced"] for row in rows]),
            "memories_given_per_cut": realism.mean_ci([len(row["memories_given"]) for row in rows]),
        },  # fmt: skip
        "skipped": dict(skipped.counts),
        # per metric, the cuts whose real message it cannot read (no token, no marker list for the
        # language, no cased letter): left out of that metric's figures, counted here
        "not_applicable": {
            metric.name: sum(row["features"]["real"][metric.name] is None for row in rows)
            for metric in realism.METRICS
        },
        # per variant, the share of cuts where the model wrote a valid message of its own (the
        # rest: every attempt not JSON, cut off, or copying the reply or an exemplar)
        "answered": answered,
        "all_answered": sum(all(_text(row, v) is not None for v in options.variants) for row in rows),
        "metrics": metrics,
        "between_controls": placed,
        "population": population(rows, sources),
    }
    if "full" in options.variants and "full-novoice" in options.variants:
        summary["voice"]["effect"] = voice_effect(rows)
    if any("discriminator" in row for row in rows):
        summary["discriminator"] = discriminator(rows, [*options.variants, "self"])
    return summary


def population(rows: Sequence[dict], sources: Sequence[str]) -> dict:
    """Per metric, the Wasserstein-1 distance between the real messages' values and each
    source's; and uniformity: the coefficient of variation across users of their mean length."""
    out: dict[str, Any] = {"distance": "Wasserstein-1 (a bool: the difference of shares)", "metrics": {}}
    for metric in realism.METRICS:
        if metric.kind == "label":
            continue
        real = [realism.numeric(row["features"]["real"][metric.name]) for row in rows]
        out["metrics"][metric.name] = {
            source: realism.wasserstein(
                real, [realism.numeric((row["features"].get(source) or {}).get(metric.name)) for row in rows]
            )
            for source in sources
        }
    per_user: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        for source in ["real", *sources]:
            words = realism.word_count(row["real"] if source == "real" else _text(row, source) or "")
            if words is not None:
                per_user[source][row["user_id"]].append(words)
    out["length_cv_across_users"] = {
        source: realism.variation([sum(v) / len(v) for v in users.values()])
        for source, users in per_user.items()
    }
    return out


def _text(row: dict, source: str) -> str | None:
    if source in ("self", "other"):
        return row[source]
    made = row["simulated"].get(source)
    return made["text"] if made else None


def voice_effect(rows: Sequence[dict]) -> dict:
    """full minus full-novoice, per metric, paired on the same cuts (mean, 95% bootstrap CI, n)."""
    effect = {}
    for metric in _metric_names():
        pairs = []
        for row in rows:
            if metric == realism.ENDING:
                a, b = row["ending"].get("full"), row["ending"].get("full-novoice")
            else:
                a = (row["scores"].get("full") or {}).get(metric)
                b = (row["scores"].get("full-novoice") or {}).get(metric)
            if a is not None and b is not None:
                pairs.append(a - b)
        effect[metric] = realism.mean_ci(pairs)
    return effect


def discriminator(rows: Sequence[dict], sources: Sequence[str]) -> dict:
    """Per source, the share of answers that picked the real message (both orders), Wilson 95% CI."""
    out = {}
    for source in sources:
        answers = [c for row in rows for c in (row.get("discriminator") or {}).get(source, [])]
        out[source] = realism.wilson(sum(answers), len(answers))
        orders = [row["discriminator"][source] for row in rows if source in (row.get("discriminator") or {})]
        out[source]["real_first"] = realism.wilson(sum(o[0] for o in orders), len(orders))
        out[source]["real_second"] = realism.wilson(sum(o[1] for o in orders), len(orders))
    return out


# --- the table ------------------------------------------------------------------------------------


def _cell(figure: dict) -> str:
    if not figure or figure.get("mean") is None:
        return "-"
    return f"{figure['mean']:.2f} [{figure['low']:.2f},{figure['high']:.2f}]"


def print_report(summary: dict | None, console) -> None:
    """The report as a table: a row per metric, each variant between `other` and `self`."""
    if summary is None:
        return
    from rich.table import Table

    variants = list(summary["variants"])
    table = Table(title=f"fidelity: {summary['cuts']['measured']} cuts, {summary['users']} users; mean [95% "
                        "bootstrap CI] (distance: lower is closer; match: higher is closer)")  # fmt: skip
    table.add_column("metric")
    for source in ["other", *variants, "self"]:
        table.add_column(source)
    table.add_column("n")
    for metric, figures in summary["metrics"].items():
        sizes = sorted({figures["overall"][s]["n"] for s in ["other", *variants, "self"]})
        table.add_row(f"{metric} ({figures['kind']})",
                      *(_cell(figures["overall"][s]) for s in ["other", *variants, "self"]),
                      f"{sizes[0]}-{sizes[-1]}" if len(sizes) > 1 else str(sizes[0]))  # fmt: skip
    console.print(table)
    answered = summary.get("answered", {})
    if any(f["share"] is not None and f["share"] < 1 for f in answered.values()):
        parts = [f"{v} {round(f['share'] * f['n'])}/{f['n']}" for v, f in answered.items()]
        console.print(
            "cuts where the simulator wrote a message of its own (else every attempt was not JSON, cut off "
            "or copied the reply; each variant is placed between its controls on its own cuts): "
            + ", ".join(parts)
        )
    if "discriminator" in summary:
        parts = [
            f"{s} {f['share']:.2f} [{f['low']:.2f}, {f['high']:.2f}] n={f['n']}"
            for s, f in summary["discriminator"].items() if f["share"] is not None
        ]  # fmt: skip
        console.print("discriminator picked the real message (0.5: indistinguishable): " + "; ".join(parts))
    effect = summary["voice"].get("effect")
    if effect:
        parts = [f"{m} {f['mean']:+.2f} [{f['low']:+.2f},{f['high']:+.2f}]" for m, f in effect.items()
                 if f["mean"] is not None]  # fmt: skip
        n = max(f["n"] for f in effect.values())
        console.print(f"the voice (full minus full-novoice, same cuts, n={n}): " + "; ".join(parts))
    missing = {m: n for m, n in summary["not_applicable"].items() if n}
    if missing:
        console.print("real messages a metric cannot read (left out of it): "
                      + ", ".join(f"{m} {n}" for m, n in missing.items()))  # fmt: skip
    leak = summary["leakage"]["memories_withheld_per_cut"]
    if leak["mean"] is not None:
        console.print(f"memories withheld per cut (evidence from the cut on): {leak['mean']:.2f} "
                      f"(n={leak['n']}); "
                      "persona and Big Five re-inferred from what precedes each cut")  # fmt: skip
    if summary["skipped"]:
        console.print("skipped: " + "; ".join(f"{n} {r}" for r, n in summary["skipped"].items()))


def print_summary(result, console) -> None:
    """`personaemp fidelity`'s summary: its run report, then the table when it wrote rows."""
    from personaemp.summaries import print_run_report

    if print_run_report(result, console):
        print_report(result.summary, console)


# --- from options (the command and pe.*) ----------------------------------------------------------


async def from_options(options: FidelityOptions, console, settings, retry=False):
    """`personaemp fidelity` on its options."""
    return await ameasure_fidelity(
        options.input, options.output, settings,
        options=FidelityOptionsUsed(
            variants=tuple(options.context), cuts=options.cuts, seed=options.cut_seed, voice=options.voice,
            discriminator=options.discriminator,
        ),
        limit=options.limit, retry_failed=retry, console=console,
    )  # fmt: skip


measure_fidelity = sync_twin(ameasure_fidelity)
