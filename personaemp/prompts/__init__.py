"""Prompt templates: <name>.md files with `## system` and `## user` sections, `$name` slots.

The templates live in prompts/ at the root of a checkout, where they are read from; a
wheel carries them inside this package (setup.py copies them in at build time) and they
are read there with importlib.resources. The environment variable PERSONAEMP_PROMPTS
names a folder of templates to use instead.

A prompt's hash (of its file text) is recorded with every output made from it, and is
part of the stage fingerprint: editing a prompt re-runs the units it touches.
"""

from __future__ import annotations

import hashlib
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
_SECTION = re.compile(r"^## (system|user)\s*$", re.MULTILINE)


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

    def render(self, **values: str) -> list[dict[str, str]]:
        """Both sections filled in; a `$name` slot without a value is an error."""
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
    if set(sections) != {"system", "user"}:
        raise InputError(f"{path}: needs exactly a '## system' and a '## user' section")
    return Prompt(
        name=name,
        system=Template(sections["system"]),
        user=Template(sections["user"]),
        hash=hashlib.sha256(text.encode()).hexdigest()[:12],
    )
