"""VectorIndex.save_scrubbed: a removed vector's bytes leave the usearch file, live vectors stay intact."""

from __future__ import annotations

import numpy as np

from amfs_server.adapters.vector_index import VectorIndex


def unit_rows(count: int, dimension: int = 16, seed: int = 3) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((count, dimension)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_a_removed_vector_is_overwritten_in_the_file_and_the_others_still_search_exactly(tmp_path) -> None:
    path = tmp_path / "v.usearch"
    vectors = unit_rows(50)
    index = VectorIndex(16, path)
    index.add(list(range(50)), vectors)
    index.save()
    assert vectors[7].tobytes() in path.read_bytes()
    index.remove([7])
    index.save()
    assert vectors[7].tobytes() in path.read_bytes()  # what usearch alone leaves behind
    index.save_scrubbed([vectors[7]])
    data = path.read_bytes()
    assert vectors[7].tobytes() not in data
    assert all(vectors[i].tobytes() in data for i in range(50) if i != 7)
    reopened = VectorIndex.open(16, path)
    assert len(reopened) == 49 and 7 not in reopened
    assert reopened.search(vectors[8], 1)[0][0] == 8


def test_a_vector_shared_with_a_live_id_is_removed_by_rebuilding(tmp_path) -> None:
    path = tmp_path / "v.usearch"
    vectors = unit_rows(10)
    vectors[3] = vectors[2]  # two ids, one vector: overwriting bytes in place could hit the live one
    index = VectorIndex(16, path)
    index.add(list(range(10)), vectors)
    index.remove([3])
    index.save_scrubbed([vectors[3]])
    data = path.read_bytes()
    assert data.count(vectors[2].tobytes()) == 1  # only the live id's copy is left
    reopened = VectorIndex.open(16, path)
    assert sorted(reopened.ids().tolist()) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    np.testing.assert_array_equal(reopened.get(2), vectors[2])
