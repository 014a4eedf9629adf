"""A Hugging Face dataset (`hf:OWNER/NAME` or `hf:LOCAL_FOLDER`) read with `datasets`, streamed.

Rows may be raw-export records or task1 rows that carry their `gold` memories.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from personaemp.errors import InputError, RowError
from personaemp.hub import check_hub_reachable
from personaemp.io import ErrorPolicy
from personaemp.sources.normalize import SourceUser
from personaemp.sources.raw import user_from_raw
from personaemp.sources.task1 import user_from_joined_row

PREFIX = "hf:"


def read_hf(spec: str, policy: ErrorPolicy, config: str | None, split: str | None) -> Iterator[SourceUser]:
    dataset_id = spec[len(PREFIX) :]
    if not dataset_id:
        raise InputError("--input hf: needs a dataset id, e.g. hf:OWNER/NAME")
    if not Path(dataset_id).exists():
        check_hub_reachable(
            f"hf:{dataset_id}",
            "check your network, or download the dataset and pass its folder as --input",
            InputError,
        )
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
