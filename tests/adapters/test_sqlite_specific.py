"""SQLite-only details behind the contract: the FTS5 row count the keyword ranking reads without counting, and when
a filtered semantic search scans the filter's own vectors."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from amfs_server.adapters import sqlite as sqlite_adapter
from amfs_server.adapters.sqlite import SQLiteStore, fts_row_count
from amfs_server.adapters.vector_index import VectorIndex
from amfs_server.core.models import Actor, EntryFilter, MemoryType, NewEntry, Tier, utcnow


def _index(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE VIRTUAL TABLE entries_fts USING fts5 (search_text, tokenize = 'porter unicode61')")
    return conn


def test_fts_row_count_reads_the_averages_record_and_follows_inserts_and_deletes(tmp_path: Path) -> None:
    conn = _index(tmp_path / "fts.db")
    assert fts_row_count(conn) == 0  # no averages record yet: counted
    for n in range(300):  # past one varint byte (127) into two
        conn.execute("INSERT INTO entries_fts (rowid, search_text) VALUES (?, ?)", (n + 1, f"note {n}"))
    assert fts_row_count(conn) == 300
    conn.execute("DELETE FROM entries_fts WHERE rowid <= 17")
    assert fts_row_count(conn) == 283 == conn.execute("SELECT count(*) FROM entries_fts").fetchone()[0]
    assert conn.execute("SELECT block FROM entries_fts_data WHERE id = 1").fetchone()[0]  # really read, not counted


async def test_a_filter_holding_few_of_the_index_scans_its_own_vectors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The path that took a conversation-scoped search at 10k entries from 17 ms to under 1: an entity scope holding
    at most 1/SCOPED_SCAN_SHARE of the index (and at most SCOPED_SCAN_MAX entries) is scanned exactly; a search
    without one, or a scope holding more, walks the index as before. Both give the scope's nearest (contract suite)."""
    actor = Actor("agent/test", "session-1")
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((40, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    now = utcnow()
    store = SQLiteStore(tmp_path / "amfs.db")
    await store.open()
    try:
        await store.insert_versions([
            NewEntry(entity_path="chat/a" if n < 8 else "chat/b", key=f"t{n}", value="x", value_json='"x"', confidence=1.0,
                     memory_type=MemoryType.BELIEF if 8 <= n < 12 else MemoryType.FACT, agent_id=actor.agent_id, session_id=actor.session_id, written_at=now,
                     ttl_at=None, importance_score=None, importance_dimensions=None, tier=Tier.HOT, priority_score=0.5,
                     embedding=vector.tolist(), search_text=f"t{n}")
            for n, vector in enumerate(vectors)
        ], actor)
        scanned: list[int] = []
        among = VectorIndex.search_among

        def spy(self: VectorIndex, vector: np.ndarray, ids: list[int], k: int) -> list[tuple[int, float]]:
            scanned.append(len(ids))
            return among(self, vector, ids, k)

        monkeypatch.setattr(VectorIndex, "search_among", spy)
        query = vectors[0].tolist()
        assert [e.key for e, _ in await store.semantic_candidates(query, EntryFilter(entity_path="chat/a"), now, 3)][0] == "t0"
        assert scanned == [8]  # 8 of 40 entries: at most a quarter of the index
        await store.semantic_candidates(query, EntryFilter(), now, 3)
        await store.semantic_candidates(query, EntryFilter(entity_path="chat/b"), now, 3)  # 32 of 40
        # A filter without an entity path is not counted on the key index: it walks the index even when small (4)
        assert len(await store.semantic_candidates(query, EntryFilter(memory_type=MemoryType.BELIEF), now, 5)) == 4
        assert scanned == [8]
        monkeypatch.setattr(sqlite_adapter, "SCOPED_SCAN_MAX", 7)
        await store.semantic_candidates(query, EntryFilter(entity_path="chat/a"), now, 3)
        assert scanned == [8]  # more than SCOPED_SCAN_MAX: the index's search
    finally:
        await store.close()


def test_entries_in_scope_counts_the_path_and_below_and_stops_past_at_most(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "scope.db", isolation_level=None)
    conn.execute("CREATE TABLE entries (entity_path TEXT, key TEXT, is_current INTEGER)")
    conn.execute("CREATE UNIQUE INDEX entries_current_key ON entries (entity_path, key) WHERE is_current = 1")
    rows = [("chat", "a", 1), ("chat", "old", 0), ("chat/x", "b", 1), ("chat/x/y", "c", 1), ("chat-2", "d", 1),
            ("chatter", "e", 1), *[("chat/z", f"k{n}", 1) for n in range(6)]]
    conn.executemany("INSERT INTO entries VALUES (?, ?, ?)", rows)
    assert sqlite_adapter.entries_in_scope(conn, "chat") == 9  # not its old version, not chat-2 or chatter
    assert sqlite_adapter.entries_in_scope(conn, "chat/x") == 2
    assert sqlite_adapter.entries_in_scope(conn, "chat", at_most=4) == 6  # the path's own 1 + the range's 4 + 1
    assert sqlite_adapter.entries_in_scope(conn, "chat", at_most=100) == 9
    assert sqlite_adapter.entries_in_scope(conn, "none") == 0
