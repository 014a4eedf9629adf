"""A Hugging Face dataset (`hf:OWNER/NAME` or `hf:LOCAL_FOLDER`) read with `datasets`, streamed.

Rows may be raw-export records or task1 rows that carry their `gold` memories.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy
from personaemp.sources.normalize import SourceUser
from personaemp.sources.raw import user_from_raw
from personaemp.sources.task1 import user_from_joined_row

PREFIX = "hf:"


def _check_hub_reachable(dataset_id: str) -> None:
    """Fail in a second with one line instead of after the Hub client's retries."""
    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        return  # the local cache is all that will be used
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY")):
        return
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        socket.getaddrinfo(host, 443)
    except OSError as exc:
        raise InputError(
            f"hf:{dataset_id}: cannot reach the Hugging Face Hub ({host}: {exc.strerror or exc})",
            "check your network, or download the dataset and pass its folder as --input",
        ) from None


def read_hf(spec: str, policy: ErrorPolicy, config: str | None, split: str | None) -> Iterator[SourceUser]:
    dataset_id = spec[len(PREFIX) :]
    if not dataset_id:
        raise InputError("--input hf: needs a dataset id, e.g. hf:OWNER/NAME")
    if not Path(dataset_id).exists():
        _check_hub_reachable(dataset_id)
    from datasets import load_dataset
    from datasets.utils.logging import set_verbosity_error

    set_verbosity_error()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    try:
        dataset = load_dataset(dataset_id, config, split=split or "train", streaming=True)
        for number, row in enumerate(dataset):
            location = f"hf:{dataset_id}[{split or 'train'}] row {number}"
            try:
                if isinstance(row.get("gold"), dict) and "input" in row:
                    yield user_from_joined_row(row, location, spec)
                else:
                    yield user_from_raw(row, location, spec, number)
            except RowError as error:
                policy.handle(error)
    except (InputError, GeneratorExit):
        raise
    except Exception as exc:  # datasets raises many kinds; the user needs one line
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"hf:{dataset_id}: could not load the dataset ({first_line})") from None
