"""The embedded model's chunks are untrusted data: pinned, checked, never imported.

Real installed distributions (a dist-info folder and data files on sys.path, as pip leaves
them), real files joined into a real cache folder.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import pytest

from personaemp.errors import PersonaempError
from personaemp.llm import models
from personaemp.llm.models import EmbeddedModel, assemble

ROOT = Path(__file__).resolve().parents[2]
PARTS = [b"GGUF" + bytes(range(256)) * 40, bytes(reversed(range(256))) * 33, b"tail"]


def install(site: Path, name: str, version: str, inside: str, data: bytes) -> Path:
    """What pip leaves for a chunk package: its dist-info and its files (an __init__ that
    would leave a mark if anything imported it)."""
    module = name.replace("-", "_")
    info = site / f"{module}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (site / module).mkdir(exist_ok=True)
    (site / module / "__init__.py").write_text(f"open({str(site / 'IMPORTED')!r}, 'w').close()\n")
    path = site / inside
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def chunked(tmp_path, monkeypatch):
    site = tmp_path / "site"
    chunks, files = [], []
    for i, data in enumerate(PARTS, 1):
        name, inside = f"fake-chunk-part{i}", f"fake_chunk_part{i}/data/part{i:02d}.bin"
        files.append(install(site, name, "0.9.0", inside, data))
        chunks.append((name, "0.9.0", inside))
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(PARTS)
    model = EmbeddedModel(
        name="fake-model", title="Fake", licence="MIT", origin="a test", chunks=tuple(chunks),
        size=len(whole), sha256=hashlib.sha256(whole).hexdigest(),
    )  # fmt: skip
    return model, files, site, tmp_path / "cache"


def test_the_chunks_join_into_the_checked_file_and_nothing_of_them_is_imported(chunked):
    model, _files, site, cache = chunked
    path = assemble(model, cache)
    assert path.read_bytes() == b"".join(PARTS)
    made = path.stat().st_mtime_ns
    assert assemble(model, cache) == path and path.stat().st_mtime_ns == made, "a checked copy is reused"
    assert not (site / "IMPORTED").exists(), "a chunk package's code ran"


def test_a_tampered_chunk_is_refused_and_nothing_is_kept(chunked):
    model, files, site, cache = chunked
    data = bytearray(files[1].read_bytes())
    data[7] ^= 0x01  # one bit, same size
    files[1].write_bytes(bytes(data))
    with pytest.raises(PersonaempError) as raised:
        assemble(model, cache)
    message = str(raised.value)
    assert "do not add up" in message and model.sha256 in message and "nothing was loaded" in message
    assert "--force-reinstall fake-chunk-part1==0.9.0" in raised.value.hint
    assert sorted(p.name for p in cache.iterdir()) == [], "no joined file, no partial one"
    assert not (site / "IMPORTED").exists()


def test_a_damaged_cached_copy_is_joined_again(chunked):
    model, _files, _site, cache = chunked
    path = assemble(model, cache)
    path.write_bytes(b"GGUF but not the model")
    assert assemble(model, cache).read_bytes() == b"".join(PARTS)


def test_a_chunk_package_at_another_version_is_refused(chunked, tmp_path, monkeypatch):
    model, _files, _site, cache = chunked
    other = tmp_path / "other"
    install(other, "fake-chunk-part2", "1.0.0", "fake_chunk_part2/data/part02.bin", PARTS[1])
    monkeypatch.syspath_prepend(str(other))  # found first, as a newer install would be
    with pytest.raises(PersonaempError, match="fake-chunk-part2 is 1.0.0, not the pinned 0.9.0"):
        assemble(model, cache)
    assert not cache.exists() or list(cache.iterdir()) == []


def test_a_missing_chunk_package_says_what_to_install(chunked):
    model, _files, _site, cache = chunked
    missing = EmbeddedModel(
        **{**model.__dict__, "chunks": (*model.chunks, ("fake-chunk-part9", "0.9.0", "x.bin"))}
    )
    with pytest.raises(PersonaempError, match="fake-chunk-part9 is not installed") as raised:
        assemble(missing, cache)
    assert "fake-chunk-part9==0.9.0" in raised.value.hint


def test_the_local_extra_pins_the_embedded_models_chunks():
    """Declared in llm/models.py; pyproject's `local` extra must install exactly those."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["local"]
    assert set(models.EMBEDDED.requirements) <= set(extra)
    pinned = [req for req in extra if "==" in req]
    assert sorted(pinned) == sorted(models.EMBEDDED.requirements)
