"""The secrets a run knows (API keys, Hub token) and the one function that scrubs them.

Everything that reaches a file or a terminal line from outside the program (replies,
server error messages, exceptions) goes through `redact`, so an endpoint that echoes
the key cannot leak it into a cache, an output, a report or stderr.
"""

from __future__ import annotations

import functools
import os
import re

ENV_SECRETS = ("OPENAI_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
MASK = "[redacted]"
# The keys local servers are given because the client wants one (the README's `none`, vLLM's
# `EMPTY`, Ollama's `ollama`...): no secret, and words that output holds ("context none",
# `none.toml`), which masking them would mangle.
PLACEHOLDERS = frozenset({"none", "empty", "null", "dummy", "ollama", "no-key", "not-needed"})
_registered: set[str] = set()


def is_secret(value: str | None) -> bool:
    """Whether `value` is worth masking: 4 characters or more, and not a placeholder key."""
    return bool(value) and len(value) >= 4 and value.strip().lower() not in PLACEHOLDERS


def register(secret: str | None) -> None:
    """Remember a secret handed to the program another way than the environment."""
    if is_secret(secret):
        _registered.add(secret)


def known() -> list[str]:
    found = {os.environ.get(name) for name in ENV_SECRETS} | _registered
    # Longest first, so a key that contains another is masked whole.
    return sorted((s for s in found if is_secret(s)), key=len, reverse=True)


def redact(text: str | None) -> str | None:
    """`text` with every known secret masked, in any letter case and URL-encoded too (a
    server may echo the key upper-cased, or percent-encoded from a query string)."""
    if not text:
        return text
    secrets = tuple(known())
    if not secrets:
        return text
    if "%" not in text and not any(" " in secret for secret in secrets):
        # No encoded form can be there: a case-blind look is enough (100x faster than the pattern).
        lowered = text.lower()
        if not any(secret.lower() in lowered for secret in secrets):
            return text
    return _pattern(secrets).sub(MASK, text)


@functools.lru_cache(maxsize=8)
def _pattern(secrets: tuple[str, ...]) -> re.Pattern[str]:
    # Longest first (known() sorts), so a key that contains another is masked whole.
    return re.compile("|".join(_spelled(secret) for secret in secrets), re.IGNORECASE)


def _spelled(secret: str) -> str:
    """A pattern for `secret` where each character may also be %XX (either hex case; %25XX
    when encoded twice), and a space '+' (form encoding, maybe encoded again); IGNORECASE
    does the letter case."""
    parts = []
    for char in secret:
        forms = [re.escape(char), "".join(f"%(?:25)?{byte:02x}" for byte in char.encode())]
        if char == " ":
            forms += [r"\+", "%(?:25)?2b"]  # form-encoded, then percent-encoded
        parts.append(f"(?:{'|'.join(forms)})")
    return "".join(parts)


# Names (a config key, a --set path, a key=value part of a flag) whose value is a credential:
# that value is never shown, and is masked wherever it is echoed later.
SECRET_WORDS = ("key", "token", "secret", "password")
NOT_SECRETS = {"max_tokens", "key_env"}  # a count; the *name* of the variable holding a key


def secret_name(name: str) -> bool:
    """Whether a value given under `name` (a key, or a dotted path of keys) is a credential."""
    parts = [part.strip().lower().replace("-", "_") for part in name.split(".")]
    return any(part not in NOT_SECRETS and any(word in part for word in SECRET_WORDS) for part in parts)


def shown_assignment(item: str, separator: str = "=") -> str:
    """`name=value` as an error may show it: the value masked when the name is a credential's.
    (Not registered for `redact`: a refused value may be any word, "none" or "true", which
    would then be masked in every later line of the process.)"""
    name, equals, _ = item.partition(separator)
    return f"{name}{equals}{MASK}" if equals and secret_name(name) else item


# Query parameters that carry a credential (Azure's api-key, Google's key, signed URLs...).
URL_SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "sig", "auth", "credential")


def _secret_parameter(name: str) -> bool:
    name = name.lower().replace("-", "_")
    return any(word in name for word in URL_SECRET_WORDS)


def url_secrets(url: str) -> list[str]:
    """The credentials a URL carries: its userinfo (user:password, or a lone user, which is
    then the key) and the values of query parameters named like a credential."""
    from urllib.parse import parse_qsl, unquote, urlsplit

    try:
        parts = urlsplit(url)
        password, username = parts.password, parts.username
    except ValueError:  # a malformed port or address: no credential can be picked out
        return []
    found = [unquote(password)] if password else [unquote(username)] if username else []
    found += [
        value for name, value in parse_qsl(parts.query, keep_blank_values=True) if _secret_parameter(name)
    ]
    return [secret for secret in found if secret]


def register_url(url: str) -> None:
    """Remember the credentials of an endpoint's URL, so `redact` masks them everywhere."""
    for secret in url_secrets(url):
        register(secret)


def redact_url(url: str) -> str:
    """`url` as it may be shown or stored: userinfo and credential parameters masked (the
    structure kept, so the endpoint is still recognisable), then every known secret."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return redact(url) or url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rsplit('@', 1)[1]}"
    pieces = [piece.partition("=") for piece in parts.query.split("&")] if parts.query else []
    query = "&".join(
        f"{name}={MASK}" if equals and _secret_parameter(unquote(name)) else name + equals + value
        for name, equals, value in pieces
    )
    shown = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)) if host or netloc else url
    return redact(shown) or shown
