"""In-process approximate-nearest-neighbour index for the embedded SQLite store.

A thin, thread-safe wrapper around a ``usearch`` HNSW index (cosine metric,
float32).  Keys are the store's integer row ids; the store remains the source
of truth and this index is a derived, rebuildable cache of its vectors:

* ``add`` replaces ids that are already present; ``remove`` ignores unknown ids.
* ``search`` returns ``(id, cosine similarity)`` best first; ``search_among``
  the same among given ids only (an exact scan of their vectors), for a filter.
* ``save`` is atomic (temp file + ``os.replace``); ``open`` loads an existing
  file, and falls back to an empty index (``load_error`` set) if the file is
  unreadable or was built for another dimension.  Callers compare ``count`` /
  ``ids()`` / ``in_sync()`` with the store and call ``rebuild`` when they differ.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ._cxx_runtime import initialise_system_cxx_locale

initialise_system_cxx_locale()  # must precede the usearch import: see _cxx_runtime
from usearch.compiled import MetricKind, ScalarKind  # noqa: E402
from usearch.index import Index, search as exact_search  # noqa: E402

__all__ = ["VectorIndex", "VectorIndexError"]

log = logging.getLogger(__name__)

# HNSW parameters, measured on this (shared, 2-core) box; search k=50, 200 queries:
# * 20k real MiniLM vectors (docstring paragraphs), connectivity 32: expansion_search
#   64 -> recall@10 0.991 at ~0.5 ms; 128 -> recall@10 0.996 / recall@50 0.992 at
#   ~1 ms; 256 -> 0.999 at ~2.4 ms. Exact scan ~1.8 ms. Connectivity 16 is a little
#   worse (0.985 / 0.995 at 64 / 128).
# * Uniformly random 384-d unit vectors (no structure: the worst case) at 100k need
#   expansion_search ~2048 with connectivity 32 for recall@10 0.95 (~0.79 with
#   connectivity 16), several times slower than an exact scan. Real embeddings
#   are far easier; the defaults are tuned for them.
DEFAULT_CONNECTIVITY = 32
DEFAULT_EXPANSION_ADD = 128
DEFAULT_EXPANSION_SEARCH = 128
# Up to this many vector components (vectors x dimension), search scans every stored vector exactly (usearch's SIMD
# brute force; perfect recall); above it, the HNSW graph (always maintained) is walked instead. Measured on 6,000
# real chat-mpnet turn vectors (768-d) and 300 real questions, 2-core AMD EPYC with AVX2, k=64, p50 (0.7.20): the
# exact scan took 0.75 / 1.09 / 1.64 / 2.82 ms at 2,000 / 3,000 / 4,000 / 6,000 vectors, the graph 0.71 / 0.86 /
# 1.35 / 2.09 ms at recall@64 0.995 / 0.993 / 0.993 / 0.992 of the exact list (its top ten 0.998-0.999); at 10,000
# (mixtures of real vectors) 5.4 ms against 1.8. Until 0.7.19 the bound was 10,000 vectors, set for 384-d MiniLM
# (~1 ms at 10k): with 768-d chat-mpnet a whole retrieve at 10,000 entries took 2.2 ms longer on average, exact scan
# and graph taking turns (`python scripts/exact_scan_threshold.py --retrieve-store DIR`).
EXACT_SCAN_COMPONENTS = 3_000_000
# `search_among` keeps the vectors it gathered for the last id sets asked about (a conversation's turns, asked many
# questions in a row), up to this many bytes, until the index next changes: usearch hands vectors back one array
# per id, 9 ms for a scope of 2,500 768-d vectors on a 2-core AMD EPYC, where scanning them takes 1 ms.
GATHERED_CACHE_BYTES = 64 * 1024 * 1024


class VectorIndexError(Exception):
    """The on-disk index cannot be used (corrupt, wrong dimension or metric)."""


class VectorIndex:
    """usearch HNSW index keyed by integer row ids, cosine similarity."""

    def __init__(
        self,
        dimension: int,
        path: Path | str | None = None,
        *,
        connectivity: int = DEFAULT_CONNECTIVITY,
        expansion_add: int = DEFAULT_EXPANSION_ADD,
        expansion_search: int = DEFAULT_EXPANSION_SEARCH,
        exact_threshold: int | None = None,
    ) -> None:
        if int(dimension) < 1:
            raise ValueError("dimension must be >= 1")
        self.dimension = int(dimension)
        self.path = Path(path) if path is not None else None
        self.connectivity = int(connectivity)
        self.expansion_add = int(expansion_add)
        self.expansion_search = int(expansion_search)
        # vectors up to which search scans exactly: by default as many as EXACT_SCAN_COMPONENTS holds
        self.exact_threshold = EXACT_SCAN_COMPONENTS // self.dimension if exact_threshold is None else int(exact_threshold)
        self._lock = threading.RLock()
        self._index = self._new_index()
        # id set's digest -> (ids in the index, their vectors); emptied on every change (`_changed`)
        self._gathered: OrderedDict[bytes, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._gathered_bytes = 0
        self.dirty = False  # modified since the last save()/load()
        self.load_error: str | None = None  # why open() started empty, if it did

    # -- construction / persistence ------------------------------------------ #

    def _new_index(self) -> Index:
        return Index(
            ndim=self.dimension,
            metric=MetricKind.Cos,
            dtype=ScalarKind.F32,
            connectivity=self.connectivity,
            expansion_add=self.expansion_add,
            expansion_search=self.expansion_search,
        )

    @classmethod
    def open(cls, dimension: int, path: Path | str, **params: int) -> "VectorIndex":
        """Index bound to ``path``, loaded from it when the file exists.

        A file that cannot be used (corrupt, other dimension/metric) is logged
        and ignored: the result is empty with ``load_error`` set, so the caller's
        sync check fails and it rebuilds from the store.
        """
        index = cls(dimension, path, **params)
        if index.path is not None and index.path.exists():
            try:
                index.load()
            except VectorIndexError as exc:
                index.load_error = str(exc)
                log.warning("ignoring vector index %s: %s (it will need a rebuild)", path, exc)
        return index

    def load(self, path: Path | str | None = None) -> None:
        """Replace the in-memory contents with the file at ``path`` (default: self.path)."""
        src = Path(path) if path is not None else self.path
        if src is None:
            raise ValueError("no path to load the vector index from")
        try:
            meta = Index.metadata(str(src))
        except Exception as exc:
            raise VectorIndexError(f"{src}: not a usearch index ({exc})") from exc
        if meta is None:
            raise VectorIndexError(f"{src}: not a usearch index")
        if meta.get("dimensions") != self.dimension:
            raise VectorIndexError(
                f"{src}: built for dimension {meta.get('dimensions')}, expected {self.dimension}"
            )
        if meta.get("kind_metric") != MetricKind.Cos or meta.get("kind_scalar") != ScalarKind.F32:
            raise VectorIndexError(
                f"{src}: metric/dtype {meta.get('kind_metric')}/{meta.get('kind_scalar')}, expected Cos/F32"
            )
        fresh = self._new_index()
        try:
            fresh.load(str(src))
        except Exception as exc:
            raise VectorIndexError(f"{src}: failed to load ({exc})") from exc
        if fresh.ndim != self.dimension:  # pragma: no cover - guarded by the metadata check
            raise VectorIndexError(f"{src}: loaded dimension {fresh.ndim} != {self.dimension}")
        # usearch's Index declares these setters apart from their getters, so mypy sees read-only properties.
        fresh.expansion_search = self.expansion_search  # type: ignore[misc]
        fresh.expansion_add = self.expansion_add  # type: ignore[misc]
        with self._lock:
            self._index = fresh
            self._changed()
            self.dirty = False
            self.load_error = None

    def save(self, path: Path | str | None = None) -> Path:
        """Write the index atomically (temp file in the same directory + os.replace)."""
        dst = Path(path) if path is not None else self.path
        if dst is None:
            raise ValueError("no path to save the vector index to")
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with self._lock:
            try:
                self._index.save(str(tmp))
                with open(tmp, "rb+") as fh:
                    os.fsync(fh.fileno())
                os.replace(tmp, dst)
            finally:
                if tmp.exists():
                    tmp.unlink()
            if path is None or dst == self.path:
                self.dirty = False
        return dst

    # -- validation ------------------------------------------------------------ #

    def _prepare(self, ids: Sequence[int] | np.ndarray, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keys = np.asarray(ids, dtype=np.int64).reshape(-1)
        vecs = np.asarray(vectors, dtype=np.float32)
        if vecs.ndim == 1 and keys.size == 1:
            vecs = vecs.reshape(1, -1)
        if vecs.ndim != 2 or vecs.shape[1] != self.dimension:
            raise ValueError(f"vectors must have shape (n, {self.dimension}), got {vecs.shape}")
        if vecs.shape[0] != keys.size:
            raise ValueError(f"{keys.size} ids but {vecs.shape[0]} vectors")
        if keys.size and keys.min() < 0:
            raise ValueError("ids must be non-negative integers")
        if not np.isfinite(vecs).all():
            raise ValueError("vectors contain NaN or infinity")
        if keys.size and (np.einsum("ij,ij->i", vecs, vecs) == 0).any():
            raise ValueError("zero vectors have no cosine similarity")
        # Duplicate ids within one call: the last occurrence wins.
        if keys.size > 1:
            _, last_rev = np.unique(keys[::-1], return_index=True)
            if last_rev.size != keys.size:
                keep = np.sort(keys.size - 1 - last_rev)
                keys, vecs = keys[keep], vecs[keep]
        return keys.astype(np.uint64), np.ascontiguousarray(vecs)

    def _query(self, vector: np.ndarray) -> np.ndarray:
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dimension:
            raise ValueError(f"query must have {self.dimension} dimensions, got {q.shape[0]}")
        return np.ascontiguousarray(q)

    # -- mutation --------------------------------------------------------------- #

    def add(self, ids: Sequence[int] | np.ndarray, vectors: np.ndarray) -> None:
        """Insert vectors; an id already in the index has its vector replaced."""
        keys, vecs = self._prepare(ids, vectors)
        if keys.size == 0:
            return
        with self._lock:
            present = np.atleast_1d(self._index.contains(keys))
            if present.any():
                self._index.remove(keys[present])
            self._index.add(keys, vecs)
            self._changed()
            self.dirty = True

    def remove(self, ids: Iterable[int] | np.ndarray) -> int:
        """Remove ids (unknown ids are ignored). Returns how many were removed."""
        keys = np.unique(np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int64))
        keys = keys[keys >= 0].astype(np.uint64)
        if keys.size == 0:
            return 0
        with self._lock:
            present = np.atleast_1d(self._index.contains(keys))
            if not present.any():
                return 0
            self._index.remove(keys[present])
            self._changed()
            self.dirty = True
            return int(present.sum())

    def clear(self) -> None:
        with self._lock:
            self._index = self._new_index()
            self._changed()
            self.dirty = True

    def rebuild(self, ids: Sequence[int] | np.ndarray, vectors: np.ndarray) -> None:
        """Replace the whole contents with (ids, vectors), e.g. after a sync check failed.

        The new graph is built off to the side and swapped in, so concurrent
        searches keep using the old one meanwhile.
        """
        keys, vecs = self._prepare(ids, vectors)
        fresh = self._new_index()
        if keys.size:
            fresh.add(keys, vecs)
        with self._lock:
            self._index = fresh
            self._changed()
            self.dirty = True
            self.load_error = None

    def save_scrubbed(self, vectors: Sequence[np.ndarray]) -> Path | None:
        """Save (when bound to a file), then make sure none of ``vectors`` is left in the file.

        usearch keeps a removed vector's bytes in its slot, and writes them to the file, until the slot
        is reused. After saving, each of ``vectors`` (the vectors of removed ids: call after
        ``remove``) found exactly once in the file is overwritten in place with a random unit vector
        (never zeros: the tombstoned node still routes graph searches, and a zero vector has no cosine).
        A vector found more than once (another id has the same vector) cannot be told apart: then
        the graph is rebuilt from the live vectors, which drops every tombstoned slot, and saved again.
        Returns the path written, or None for an index without a file.
        """
        if self.path is None:
            return None
        rng = np.random.default_rng()
        with self._lock:
            self.save()
            data = bytearray(self.path.read_bytes())
            patches: list[tuple[int, bytes]] = []
            for vector in vectors:
                needle = np.asarray(vector, dtype=np.float32).reshape(-1).tobytes()
                first = data.find(needle)
                if first < 0:
                    continue
                if data.find(needle, first + 1) >= 0:
                    self.compact()
                    return self.save()
                noise = rng.standard_normal(self.dimension).astype(np.float32)
                patches.append((first, (noise / np.linalg.norm(noise)).astype(np.float32).tobytes()))
            if patches:
                with open(self.path, "rb+") as fh:
                    for offset, replacement in patches:
                        fh.seek(offset)
                        fh.write(replacement)
                    fh.flush()
                    os.fsync(fh.fileno())
                self.load()  # the in-memory tombstones now match the file
        return self.path

    def compact(self) -> None:
        """Rebuild the graph from the live vectors only, dropping removed ids' slots (and their bytes)."""
        with self._lock:
            keys = np.asarray(self._index.keys, dtype=np.uint64)
            vectors = np.asarray(self._index.get(keys), dtype=np.float32).reshape(len(keys), self.dimension) \
                if len(keys) else np.empty((0, self.dimension), dtype=np.float32)
        self.rebuild(keys.astype(np.int64), vectors)

    # -- queries ------------------------------------------------------------------ #

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to k ``(id, cosine similarity)`` pairs, best first. For a filter, see :meth:`search_among`."""
        q = self._query(vector)
        k = int(k)
        if k <= 0:
            return []
        with self._lock:
            n = len(self._index)
            if n == 0:
                return []
            # Asking for the whole index is an exact scan: the graph walk can miss a few, and costs more.
            return self._run(q, min(k, n), exact=n <= self.exact_threshold or k >= n)

    def search_among(self, vector: np.ndarray, ids: Sequence[int] | np.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to k ``(id, cosine similarity)`` pairs among ``ids`` only, best first: an exact scan of their
        vectors (ids not in the index are skipped), with the same distance kernel as :meth:`search`.

        For a caller that knows its allowed ids and holds few of the index's: widening `search`'s pool until enough
        of its hits pass a filter took four scans of a 10k index and 17 ms for an entity scope of 1/60 of it;
        gathering 300 vectors and scanning them takes 0.15 ms."""
        q = self._query(vector)
        keys = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1)).astype(np.uint64)
        if int(k) <= 0 or keys.size == 0:
            return []
        keys, vectors = self._gather(keys)
        if keys.size == 0:
            return []
        found = exact_search(vectors, q, min(int(k), keys.size), MetricKind.Cos, exact=True)
        positions = np.asarray(found.keys, dtype=np.int64)
        sims = (1.0 - np.asarray(found.distances, dtype=np.float64)).tolist()
        return list(zip(keys[positions].astype(np.int64).tolist(), sims))

    def _gather(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Those of `keys` (sorted, unique) in the index, and their vectors: from the cache when the same set was
        gathered since the index last changed."""
        digest = hashlib.blake2b(keys.tobytes(), digest_size=16).digest()
        with self._lock:
            if (cached := self._gathered.get(digest)) is not None:
                self._gathered.move_to_end(digest)
                return cached
            keys = keys[np.atleast_1d(self._index.contains(keys))]  # get() of an absent key returns garbage
            vectors = np.asarray(self._index.get(keys), dtype=np.float32).reshape(keys.size, self.dimension) \
                if keys.size else np.empty((0, self.dimension), dtype=np.float32)
            keys.flags.writeable = vectors.flags.writeable = False  # shared by later calls
            if vectors.nbytes <= GATHERED_CACHE_BYTES:
                self._gathered[digest] = (keys, vectors)
                self._gathered_bytes += vectors.nbytes
                while self._gathered_bytes > GATHERED_CACHE_BYTES:
                    self._gathered_bytes -= self._gathered.popitem(last=False)[1][1].nbytes
            return keys, vectors

    def _changed(self) -> None:
        """Forget gathered vectors (caller holds the lock): an id's vector may have been replaced or removed."""
        self._gathered.clear()
        self._gathered_bytes = 0

    def _run(self, q: np.ndarray, count: int, *, exact: bool) -> list[tuple[int, float]]:
        # usearch widens its beam to at least `count`, so large counts stay accurate.
        m = self._index.search(q, count, exact=exact)
        keys = m.keys.tolist()
        sims = (1.0 - m.distances.astype(np.float64)).tolist()
        return list(zip(keys, sims))

    def get(self, id: int) -> np.ndarray | None:
        """The stored vector for ``id`` (float32) or None."""
        with self._lock:
            if not self._index.contains(int(id)):
                return None
            return np.asarray(self._index.get(int(id)), dtype=np.float32).reshape(-1)

    # -- sync checks ------------------------------------------------------------------ #

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    @property
    def count(self) -> int:
        return len(self)

    def __contains__(self, id: object) -> bool:
        if not isinstance(id, (int, np.integer)) or int(id) < 0:
            return False
        with self._lock:
            return bool(self._index.contains(int(id)))

    def ids(self) -> np.ndarray:
        """All ids in the index, sorted (int64)."""
        with self._lock:
            keys = np.asarray(self._index.keys, dtype=np.uint64)
        return np.sort(keys.astype(np.int64))

    def in_sync(self, store_ids: Iterable[int] | np.ndarray) -> bool:
        """True when the index holds exactly ``store_ids`` (order irrelevant)."""
        expected = np.unique(np.asarray(
            store_ids if isinstance(store_ids, np.ndarray) else list(store_ids), dtype=np.int64
        ))
        mine = self.ids()
        return mine.shape == expected.shape and bool(np.array_equal(mine, expected))

    def __repr__(self) -> str:
        return (
            f"VectorIndex(dimension={self.dimension}, count={len(self)}, path={self.path}, "
            f"connectivity={self.connectivity}, expansion_search={self.expansion_search})"
        )
