"""The review product's sections: [review] (the labelling page) and [agreement]; their
fields are the commands' flags and keys (see personaemp/options.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, model_validator

from personaemp.options import Opt, OptionProblem, Section, declare
from personaemp.shared_options import PROCESSED, Names


@declare("review")
class ReviewOptions(Section):
    input: Annotated[
        Path,
        Opt.input("Queries to review (gen-queries' output: accepted and rejected).", derive="queries.output"),
    ] = PROCESSED / "queries.jsonl"
    labels: Annotated[
        Path | None,
        Opt(
            "Labels file: every click is appended to it at once (JSON lines; several reviewers share "
            "it). Default: labels.jsonl beside --input (with --dialogues: dialogue_labels.jsonl beside "
            "the first dialogues file), where `agreement` and the card look.",
            ("--labels",),
            io="update",
        ),
    ] = None
    size: Annotated[
        int,
        Field(ge=1),
        Opt("Queries in the sample, taken in turn from each category/language/outcome stratum."),
    ] = 60
    seed: Annotated[
        int, Opt("Seed of the sample (the same seed gives the same queries in the same order).")
    ] = 0
    host: Annotated[
        str,
        Opt(
            "Address to serve the page on. Every API call needs the session's token (in the address "
            "printed at start); beyond loopback (0.0.0.0), whoever reaches it with that address can "
            "read the sample and label, over plain HTTP."
        ),
    ] = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535), Opt("Port of the page (0: any free port).")] = 8765
    dialogues: Annotated[
        Names,
        Opt(
            "Review dialogues (`personaemp gen-dialogues`) instead of queries; repeat for several "
            "supporters, each named by its file name: a query's dialogues are shown side by side. "
            "Labels default to dialogue_labels.jsonl beside the first file.",
            metavar="FILE",
            io="read",
        ),
    ] = []
    fidelity: Annotated[
        Path | None,
        Opt(
            "Review blinded pairs of `personaemp fidelity`'s output instead: which of two messages did "
            "this person write next? Labels default to fidelity_labels.jsonl beside it.",
            metavar="FILE",
            io="read",
        ),
    ] = None


@declare("agreement")
class AgreementOptions(Section):
    input: Annotated[
        Path,
        Opt.input("Queries the labels are about (gen-queries' output).", derive="queries.output"),
    ] = PROCESSED / "queries.jsonl"
    labels: Annotated[
        Path | None,
        Opt("Labels of `personaemp review` (or imported from Label Studio). Default: labels.jsonl "
            "beside --input (with --dialogues: dialogue_labels.jsonl beside the first dialogues "
            "file).", ("--labels",), io="read"),
    ] = None  # fmt: skip
    second_judge: Annotated[
        Path | None,
        Opt(
            "The second judge's verdicts, kept apart from the build's files (written with "
            "--judge-model, read when present). Default: second_judge.jsonl beside --input.",
            ("--second-judge",),
            io="update",
        ),
    ] = None
    judge_model: Annotated[
        str | None,
        Opt(
            "Re-run the check step on the same queries with this model as a second judge first "
            "(the other LLM options as given; its endpoint: --judge-base-url).",
            env="PERSONAEMP_SECOND_JUDGE_MODEL",
        ),
    ] = None
    judge_base_url: Annotated[
        Names,
        Opt("Endpoint of the second judge (default: the LLM options' endpoint).",
            env="PERSONAEMP_SECOND_JUDGE_BASE_URL", metavar="URL"),
    ] = []  # fmt: skip
    out: Annotated[
        Path | None,
        Opt(
            "Folder of agreement.json and agreement.png. Default: agreement/ beside --input.",
            ("--out-dir", "-o"),
            io="folder",
            beside=("agreement.json", "agreement.png"),
        ),
    ] = None
    resamples: Annotated[int, Field(ge=100), Opt("Bootstrap resamples of each interval.")] = 2000
    bootstrap_seed: Annotated[int, Opt("Seed of the bootstrap.")] = 0
    dialogues: Annotated[
        Names,
        Opt(
            "Dialogues people labelled (`personaemp review --dialogues`), as given there: people vs "
            "the in_character check, final emotion vs people's rating, the supporters' ranking. "
            "Labels default to dialogue_labels.jsonl beside the first file.",
            metavar="FILE",
            io="read",
        ),
    ] = []

    fidelity: Annotated[
        Path | None,
        Opt(
            "A fidelity file people labelled (`personaemp review --fidelity`): their accuracy (Wilson "
            "95% CI) and kappa between the LLM discriminator and them. Labels default to "
            "fidelity_labels.jsonl beside it.",
            metavar="FILE",
            io="read",
        ),
    ] = None

    def paths(self) -> tuple[Path, Path, Path]:
        """(labels, second judge, out), the defaults beside the input."""
        return (
            self.labels or self.input.with_name("labels.jsonl"),
            self.second_judge or self.input.with_name("second_judge.jsonl"),
            self.out or self.input.with_name("agreement"),
        )

    @model_validator(mode="after")
    def _an_endpoint_needs_a_model(self) -> AgreementOptions:
        if self.judge_base_url and not self.judge_model:
            raise OptionProblem("judge_base_url", "needs {judge_model}: which model is the second judge")
        return self
