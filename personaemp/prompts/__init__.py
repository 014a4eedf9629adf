"""Prompt templates: <name>.md files with sections (`## name`) and `$name` slots.

Two layouts. A step of the pipeline declares `## context` (which blocks of shared.md it
reads, in order; `task` among them marks where its task goes, else last), `## task` (its
instructions), optionally `## blocks` (the note on the data blocks that follow the task: it
names this request's KEY, so it comes after the task and the schema, which every request of
the step shares) and `## input` (what only this request carries): its request is the shared
preamble (system), then the context blocks, the task, the note and the input. Requests thus
open with the same bytes, which a provider's prefix cache serves at a fraction of the price;
what differs (the user, the dimension, the response) comes last. A plain
`## system` + `## user` template (the policy model's) is rendered as those two messages.

A step asked about one PERM dimension at a time (criteria, the judges) also declares
`## standard` (that dimension's standard), and may declare `## standards` (the three) and
`## ask` (a line naming the request's dimension). It is rendered in one of two LAYOUTS:
  paper   (the default) as the authors' prompts: the request holds its dimension's standard
          only, after the task and before the context; then the context, then the reply;
  shared  for a provider's prefix cache: the three standards follow the task, the same bytes
          for every request, and `## ask` names the dimension at the very end (after the
          reply). A step with no `## standards` (the fixed judge: its sheet is the query's
          own) puts its standard after the context, before the input.

The templates live in prompts/ at the root of a checkout, where they are read from; a
wheel carries them inside this package (setup.py copies them in at build time) and they
are read there with importlib.resources. The environment variable PERSONAEMP_PROMPTS
names a folder of templates to use instead. Its `compact/` subfolder holds the variants the
embedded model reads (COMPACT below).

A prompt's hash (of its file text) is recorded with every output made from it, and is
part of the stage fingerprint: editing a prompt re-runs the units it touches.

A template may declare, in a `## data` section, the slots that carry text written by a user
or by a model under test (query, memories, response...); every slot of a context block is
data too. Each such value is rendered as a block `<NAME-KEY>` ... `</NAME-KEY>`. KEY hashes
the values of the first context block, so that every request about a unit fences its
context the same way; when any value of the request contains that KEY, KEY hashes every
data value of the request instead. Either way no value contains the KEY its request uses, so
none can close its own block, and the same inputs give the same request (the reply cache
and the provider's prefix cache both work). `$fence` in a template is that KEY, for the
instructions to say which blocks are data.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from string import Template

from personaemp import vocabulary
from personaemp.errors import InputError

PACKAGE = "personaemp.prompts"
ENV_VAR = "PERSONAEMP_PROMPTS"
_SECTION = re.compile(
    r"^## (system|user|data|context|task|standard|standards|ask|blocks|input)\s*$", re.MULTILINE
)
_SHARED_SECTION = re.compile(r"^## (\w+)\s*$", re.MULTILINE)
SHARED = "shared"  # shared.md: `## preamble` and the context blocks steps name
PREAMBLE = "preamble"
FENCE_CHARS = 16  # hex digits of a block's key
LAYOUTS = vocabulary.LAYOUTS  # where a dimension's standard goes (see above)
# prompts/compact/: shorter versions of some build prompts for the embedded 0.5B model (same
# fields, same checks), used only on it (llm/session.py sets the engine's prompt_variant).
COMPACT = "compact"


def default_dir() -> Traversable:
    """The checkout's prompts/ folder when running from a checkout (editable install,
    PYTHONPATH), else the copies shipped inside the installed package."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "prompts").is_dir():
        return root / "prompts"
    return resources.files(PACKAGE)


def prompts_dir() -> Traversable:
    """Where templates are read from: $PERSONAEMP_PROMPTS if set, else the shipped ones."""
    override = os.environ.get(ENV_VAR)
    return Path(override) if override else default_dir()


@dataclass(frozen=True)
class Prompt:
    name: str
    system: Template  # the preamble (context layout) or the `## system` section
    user: Template  # the task (context layout) or the `## user` section
    hash: str  # of the template, and of the preamble and context blocks it uses
    data: tuple[str, ...] = ()  # slots whose values are fenced as data blocks
    context: tuple[Template, ...] = ()  # the context blocks before the task
    after: tuple[Template, ...] = ()  # ... and after it, before the input
    note: Template | None = None  # says which blocks are data: before the blocks after the task
    input: Template | None = None
    base: tuple[str, ...] = ()  # the slots of the first context block: they make the KEY
    standard: Template | None = None  # the request's dimension's standard
    standards: Template | None = None  # the three standards (shared layout)
    ask: Template | None = None  # names the dimension, last (shared layout)

    def render(self, layout: str = "paper", **values: str) -> list[dict[str, str]]:
        """Every section filled in; a `$name` slot without a value is an error.

        Context layout: the preamble (system), the context blocks and the task (user), and
        when the step has more (blocks after the task, its input) a second user turn: the
        engine states the reply's schema, when it must, at the end of the first user turn
        and sends the two as one, so the schema too is shared by the requests it suits."""
        if self.data:
            missing = [name for name in self.data if name not in values]
            if missing:
                raise InputError(f"prompt {self.name}: no value for ${missing[0]}")
            data = {name: str(values[name]) for name in self.data}
            values = {**values, **fence(data, shared=self.base)}
        try:
            system = self.system.substitute(values)
            first = [block.substitute(values) for block in self.context]
            user = self.user.substitute(values)
            shared = layout == "shared"
            if shared and self.standards is not None:
                user += "\n\n" + self.standards.substitute(values)
            rest = [block.substitute(values) for block in self.after]
            if self.note is not None:
                rest.insert(0, self.note.substitute(values))
            if self.standard is not None:
                standard = self.standard.substitute(values)
                if not shared:
                    rest.insert(0, standard)
                elif self.standards is None:
                    rest.append(standard)
            if self.input is not None:
                rest.append(self.input.substitute(values))
            if shared and self.ask is not None:
                rest.append(self.ask.substitute(values))
        except KeyError as exc:
            raise InputError(f"prompt {self.name}: no value for ${exc.args[0]}") from None
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": "\n\n".join([*first, user])},
        ]
        if rest:
            messages.append({"role": "user", "content": "\n\n".join(rest)})
        return messages


def step_prompts(steps, variant: str | None = None) -> dict[str, Prompt]:
    """The prompts of a stage's steps, by step name (`engine.prompt_variant` picks the variant)."""
    return {step.name: load_prompt(step.prompt, variant=variant) for step in steps}


def prompts_per_variant(steps) -> Callable[[str | None], tuple[dict[str, Prompt], dict[str, str]]]:
    """For one run of a stage: variant -> its steps' prompts and their hashes (what provenance
    and the fingerprint record), by step name, read once, so that the stage's fingerprint
    and its work see the same text."""

    @functools.cache
    def load(variant: str | None) -> tuple[dict[str, Prompt], dict[str, str]]:
        prompts = step_prompts(steps, variant)
        return prompts, {name: prompt.hash for name, prompt in prompts.items()}

    return load


def _read(path: Path | Traversable) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(f"{path}: cannot read the prompt ({reason})", f"set {ENV_VAR}") from None


def load_prompt(name: str, folder: Path | Traversable | None = None, variant: str | None = None) -> Prompt:
    """The template `name`; with a `variant` (COMPACT), its version in that subfolder when
    there is one (the shared blocks stay the main ones)."""
    folder = folder if folder is not None else prompts_dir()
    path = folder / f"{name}.md"
    if variant is not None and (folder / variant / f"{name}.md").is_file():
        path = folder / variant / f"{name}.md"
    text = _read(path)
    parts = _SECTION.split(text)
    sections = {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}
    data = tuple(re.findall(r"\w+", sections.get("data", "")))
    digest = hashlib.sha256(text.encode())
    if len(parts) // 2 != len(sections):
        raise InputError(f"{path}: needs exactly one of each section, not two")
    if {"system", "user"} == set(sections) - {"data"}:
        return Prompt(
            name, Template(sections["system"]), Template(sections["user"]), digest.hexdigest()[:12], data
        )
    if not {"context", "task"} <= set(sections) or {"system", "user"} & set(sections):
        raise InputError(
            f"{path}: needs exactly a '## system' and a '## user' section, or '## context' and '## task'"
        )
    shared_path = folder / f"{SHARED}.md"
    shared_text = _read(shared_path)
    digest.update(shared_text.encode())  # the preamble and the blocks are part of every request
    pieces = _SHARED_SECTION.split(shared_text)
    shared = {pieces[i]: pieces[i + 1].strip() for i in range(1, len(pieces) - 1, 2)}
    # `## context` names the blocks in order; `task` marks where the task goes (default: last).
    names = sections["context"].split()
    before, _, after = " ".join(names).partition("task")
    blocks = [n for n in names if n != "task"]
    unknown = [n for n in [PREAMBLE, *blocks] if n not in shared or (n == PREAMBLE and n in blocks)]
    if unknown or not blocks or names.count("task") > 1:
        raise InputError(
            f"{shared_path}: no context block '## {unknown[0] if unknown else '?'}' for prompt {name}"
        )
    slots = [tuple(Template(shared[n]).get_identifiers()) for n in blocks]
    return Prompt(
        name=name,
        system=Template(shared[PREAMBLE]),
        user=Template(sections["task"]),
        hash=digest.hexdigest()[:12],
        data=tuple(dict.fromkeys([*(s for group in slots for s in group), *data])),
        context=tuple(Template(shared[n]) for n in before.split()),
        after=tuple(Template(shared[n]) for n in after.split()),
        input=Template(sections["input"]) if sections.get("input") else None,
        note=Template(sections["blocks"]) if sections.get("blocks") else None,
        base=slots[0],
        **{
            name: Template(sections[name]) if sections.get(name) else None
            for name in ("standard", "standards", "ask")
        },
    )


def fence(values: dict[str, str], shared: tuple[str, ...] = ()) -> dict[str, str]:
    """Each value as a data block, and `fence`: the key the blocks' tags carry.

    The key hashes the `shared` values (the unit's context: the same key for every request
    about the unit), unless a value of the request contains that key; then, and without
    `shared`, it hashes every value (and a counter bumped until no value contains the key).
    So no value can contain a closing tag of its request: deterministic, and unforgeable."""
    if shared:
        base = sorted((name, values[name]) for name in shared)
        key = hashlib.sha256(json.dumps(["context", base]).encode()).hexdigest()[:FENCE_CHARS]
        if not any(key in text for text in values.values()):
            return _blocks(values, key)
    items = sorted(values.items())
    for salt in range(1000):
        key = hashlib.sha256(json.dumps([salt, items]).encode()).hexdigest()[:FENCE_CHARS]
        if not any(key in text for text in values.values()):
            break
    return _blocks(values, key)


def _blocks(values: dict[str, str], key: str) -> dict[str, str]:
    fenced = {name: f"<{name}-{key}>\n{text}\n</{name}-{key}>" for name, text in values.items()}
    return {**fenced, "fence": key}
