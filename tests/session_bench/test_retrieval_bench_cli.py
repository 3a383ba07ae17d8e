"""`amfs-server bench retrieval scale|quality`: the embedder a run is asked for is the one it measures, and a model
that cannot be loaded stops it before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from amfs_server.session_bench import retrieval_bench


def test_scale_measures_the_embedder_it_is_given_and_refuses_a_missing_model(monkeypatch, tmp_path: Path) -> None:
    from amfs_server.adapters.onnx_embedder import VARIANTS

    given: list[object] = []

    async def recording_scale(stores, sizes, queries, ingest_count, out_dir, cache_dir, embedder=None):
        given.append((stores, sizes, embedder))
        return {}

    monkeypatch.setattr(retrieval_bench, "run_scale", recording_scale)
    shipped = VARIANTS["chat-int8"].bundled
    retrieval_bench.main(["scale", "--stores", "sqlite", "--sizes", "100", "--embedder", str(shipped),
                          "--out", str(tmp_path)])
    stores, sizes, embedder = given[0]
    assert (stores, sizes) == (["sqlite"], [100]) and embedder.name == "onnx-file:model_int8.onnx.gz"
    retrieval_bench.main(["scale", "--stores", "sqlite", "--sizes", "100", "--out", str(tmp_path)])
    assert given[1][2] is None  # no --embedder: the server's default, loaded by the run
    with pytest.raises(SystemExit):
        retrieval_bench.main(["scale", "--embedder", "/nonexistent/model_int8.onnx"])
    assert len(given) == 2
