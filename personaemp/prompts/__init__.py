"""Prompt templates: <name>.md files with `## system` and `## user` sections, `$name` slots.

The templates live in prompts/ at the root of a checkout, where they are read from; a
wheel carries them inside this package (setup.py copies them in at build time) and they
are read there with importlib.resources. The environment variable PERSONAEMP_PROMPTS
names a folder of templates to use instead.

A prompt's hash (of its file text) is recorded with every output made from it, and is
part of the stage fingerprint: editing a prompt re-runs the units it touches.

A template may declare, in a `## data` section, the slots that carry text written by a user
or by a model under test (query, memories, response...). Each such value is rendered as a
block `<NAME-KEY>` ... `</NAME-KEY>`, where KEY is a hash of every data value of the request:
a text cannot hold its own closing tag (it would have to contain a hash of itself), and
the same inputs give the same request, so the cache still works. `$fence` in the template
is that KEY, for the system prompt to say which blocks are data.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from string import Template

from personaemp.errors import InputError

PACKAGE = "personaemp.prompts"
ENV_VAR = "PERSONAEMP_PROMPTS"
_SECTION = re.compile(r"^## (system|user|data)\s*$", re.MULTILINE)
FENCE_CHARS = 16  # hex digits of a block's key


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
    system: Template
    user: Template
    hash: str
    data: tuple[str, ...] = ()  # slots whose values are fenced as data blocks

    def render(self, **values: str) -> list[dict[str, str]]:
        """Both sections filled in; a `$name` slot without a value is an error."""
        if self.data:
            missing = [name for name in self.data if name not in values]
            if missing:
                raise InputError(f"prompt {self.name}: no value for ${missing[0]}")
            values = {**values, **fence({name: str(values[name]) for name in self.data})}
        try:
            system, user = self.system.substitute(values), self.user.substitute(values)
        except KeyError as exc:
            raise InputError(f"prompt {self.name}: no value for ${exc.args[0]}") from None
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def load_prompt(name: str, folder: Path | Traversable | None = None) -> Prompt:
    path = (folder if folder is not None else prompts_dir()) / f"{name}.md"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(f"{path}: cannot read the prompt ({reason})", f"set {ENV_VAR}") from None
    parts = _SECTION.split(text)
    sections = {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}
    if not {"system", "user"} <= set(sections) or len(parts) // 2 != len(sections):
        raise InputError(f"{path}: needs exactly a '## system' and a '## user' section")
    return Prompt(
        name=name,
        system=Template(sections["system"]),
        user=Template(sections["user"]),
        hash=hashlib.sha256(text.encode()).hexdigest()[:12],
        data=tuple(re.findall(r"\w+", sections.get("data", ""))),
    )


def fence(values: dict[str, str]) -> dict[str, str]:
    """Each value as a data block, and `fence`: the key the blocks' tags carry.

    The key hashes every value (and a counter bumped until no value contains the key), so
    no value can contain a closing tag of its request: deterministic, and unforgeable."""
    items = sorted(values.items())
    for salt in range(1000):
        key = hashlib.sha256(json.dumps([salt, items]).encode()).hexdigest()[:FENCE_CHARS]
        if not any(key in text for text in values.values()):
            break
    fenced = {name: f"<{name}-{key}>\n{text}\n</{name}-{key}>" for name, text in values.items()}
    return {**fenced, "fence": key}
