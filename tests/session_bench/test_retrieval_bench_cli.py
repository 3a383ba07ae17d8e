"""`amfs-server bench retrieval scale|quality`: the embedder a run is asked for is the one it measures, and a model
that cannot be loaded stops it before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from amfs_server.session_bench import retrieval_bench


def test_scale_measures_the_embedder_it_is_given_and_refuses_a_missing_model(monkeypatch, tmp_path: Path) -> None:
    from amfs_server.adapters.embedders import load_embedder
    from amfs_server.adapters.onnx_embedder import VARIANTS
    from amfs_server.core.embedding import DEFAULT_EMBEDDER

    given: list[object] = []

    async def recording_scale(stores, sizes, queries, ingest_count, out_dir, cache_dir, embedder=None,
                              real_vectors=None):
        given.append((stores, sizes, embedder))
        return {}

    monkeypatch.setattr(retrieval_bench, "run_scale", recording_scale)
    shipped = VARIANTS["chat-int8"].bundled
    retrieval_bench.main(["scale", "--stores", "sqlite", "--sizes", "100", "--embedder", str(shipped),
                          "--out", str(tmp_path)])
    stores, sizes, embedder = given[0]
    assert (stores, sizes) == (["sqlite"], [100]) and embedder.name == "onnx-file:model_int8.onnx.gz"
    retrieval_bench.main(["scale", "--stores", "sqlite", "--sizes", "100", "--out", str(tmp_path)])
    assert given[1][2] is load_embedder(DEFAULT_EMBEDDER)  # no --embedder: the server's default
    retrieval_bench.main(["scale", "--stores", "sqlite", "--sizes", "100", "--out", str(tmp_path), "--query-encoder", "fast"])
    assert given[2][2] is load_embedder(DEFAULT_EMBEDDER, query_encoder="fast")
    with pytest.raises(SystemExit):
        retrieval_bench.main(["scale", "--embedder", "/nonexistent/model_int8.onnx"])
    with pytest.raises(SystemExit):  # a candidate file embeds its own questions
        retrieval_bench.main(["scale", "--embedder", str(shipped), "--query-encoder", "fast"])
    assert len(given) == 3


def test_real_vectors_fill_keeps_the_real_ones_and_makes_distinct_unit_mixtures() -> None:
    import numpy as np

    from amfs_server.core.embedding import EntryVectors

    rng = np.random.default_rng(3)
    real = rng.normal(size=(50, 16)).astype("float32")
    real /= np.linalg.norm(real, axis=1, keepdims=True)
    passages = [rng.normal(size=(2, 16)).astype("float32") for _ in range(50)]
    filled = retrieval_bench.mixed_vectors(EntryVectors(real, passages), 1000)
    assert filled.vectors.shape == (1000, 16) and len(filled.passages) == 1000
    assert np.array_equal(filled.vectors[:50], real)
    assert np.allclose(np.linalg.norm(filled.vectors, axis=1), 1.0, atol=1e-5)
    # every mixture is a new vector: none repeats another, none is a real one
    assert len({row.tobytes() for row in filled.vectors}) == 1000
    # note 50 + i mixes note i (whose passages it carries) with another real note
    assert filled.passages[57] is passages[7] and float(filled.vectors[57] @ real[7]) > 0.5
    short = retrieval_bench.mixed_vectors(EntryVectors(real, passages), 20)
    assert short.vectors.shape == (20, 16)
    with pytest.raises(ValueError, match="distinct mixtures"):  # 50 vectors make at most 1,200 mixtures, not 2,000
        retrieval_bench.mixed_vectors(EntryVectors(real, passages), 2050)


def test_real_vectors_that_cannot_stand_for_the_largest_size_are_refused(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        retrieval_bench.main(["scale", "--stores", "sqlite", "--sizes", "100", "--real-vectors", "1",
                              "--out", str(tmp_path)])
    assert "--real-vectors: takes N >= 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        retrieval_bench.main(["scale", "--stores", "sqlite", "--sizes", "1000,100000", "--real-vectors", "400",
                              "--out", str(tmp_path)])
    assert "400 real vectors make at most 79600 distinct mixtures; 100000 entries need N >= 447" in capsys.readouterr().err
