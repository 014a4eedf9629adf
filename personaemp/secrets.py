"""The secrets a run knows (API keys, Hub token) and the one function that scrubs them.

Everything that reaches a file or a terminal line from outside the program (replies,
server error messages, exceptions) goes through `redact`, so an endpoint that echoes
the key cannot leak it into a cache, an output, a report or stderr.
"""

from __future__ import annotations

import os

ENV_SECRETS = ("OPENAI_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
MASK = "[redacted]"
_registered: set[str] = set()


def register(secret: str | None) -> None:
    """Remember a secret handed to the program another way than the environment."""
    if secret and len(secret) >= 4:
        _registered.add(secret)


def known() -> list[str]:
    found = {os.environ.get(name) for name in ENV_SECRETS} | _registered
    # Longest first, so a key that contains another is masked whole.
    return sorted((s for s in found if s and len(s) >= 4), key=len, reverse=True)


def redact(text: str | None) -> str | None:
    if not text:
        return text
    for secret in known():
        if secret in text:
            text = text.replace(secret, MASK)
    return text
