"""The options of `personaemp push` (TOML `[push]`), declared once: each field makes
its flag, TOML key, env var and docs row (personaemp/options.py). A module of their own beside
the stage's code, so that `personaemp --help` reads them without importing it (pydantic only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import field_validator, model_validator

from personaemp.options import PROCESSED, Force, Opt, OptionProblem, Section, SplitsFolder, declare


@declare("push")
class PushOptions(Section):
    splits: SplitsFolder = PROCESSED / "splits"
    repo_id: Annotated[
        str | None, Opt("Hub dataset repo OWNER/NAME; without one, a dry run.", metavar="OWNER/NAME")
    ] = None
    dry_run: Annotated[bool, Opt("Write the repository to --out-dir instead of pushing it.")] = False
    out_dir: Annotated[
        Path, Opt("Folder of a dry run.", derive="processed:dataset", io="folder", renamed_from="out")
    ] = PROCESSED / "dataset"
    private: Annotated[bool, Opt("Create the repo private.")] = False
    revision: Annotated[str | None, Opt("Branch to push to.")] = None
    include_dialogue: Annotated[bool, Opt("Also publish the users' own messages.")] = False
    criteria: Annotated[
        Path,
        Opt(
            "Criteria file (`personaemp criteria`); published as a `criteria` column when it exists.",
            ("--criteria",),
            derive="processed:criteria.jsonl",
            io="read",
        ),
    ] = PROCESSED / "criteria.jsonl"
    dialogues: Annotated[
        Path,
        Opt(
            "Dialogues (`personaemp gen-dialogues`); published as a `dialogues` config when the file exists.",
            derive="processed:dialogues.jsonl",
            io="read",
        ),
    ] = PROCESSED / "dialogues.jsonl"
    force: Force = False

    @field_validator("repo_id")
    @classmethod
    def _owner_name(cls, value: str | None) -> str | None:
        if value is not None and value.count("/") != 1:
            raise OptionProblem("repo_id", f"must look like OWNER/NAME, not {value!r}")
        return value

    @model_validator(mode="after")
    def _one_target(self) -> PushOptions:
        if self.dry_run and self.repo_id:
            raise OptionProblem("dry_run", "and {repo_id} exclude each other", "give one of them")
        return self

    @property
    def is_dry_run(self) -> bool:
        """Without a repo id there is nothing to push to: a dry run into `out_dir`."""
        return self.dry_run or not self.repo_id
