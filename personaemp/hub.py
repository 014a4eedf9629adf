"""The Hugging Face Hub as the toolkit sees it: a quick reachability check."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from personaemp.errors import PersonaempError


def check_hub_reachable(what: str, hint: str, error: type[PersonaempError] = PersonaempError) -> None:
    """Fail in a second with one line, instead of after the Hub client's retries.

    Skipped when the Hub is meant to be offline (cache only) or reached through a proxy,
    where a failed DNS look-up here would prove nothing.
    """
    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        return
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError as exc:
        raise error(
            f"{what}: cannot reach the Hugging Face Hub ({host}: {exc.strerror or exc})", hint
        ) from None
