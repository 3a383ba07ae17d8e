"""SQLite-only details behind the contract: the FTS5 row count the keyword ranking reads without counting, and when
a filtered semantic search scans the filter's own vectors."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from datetime import timedelta
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


async def test_a_small_scope_ranks_as_the_whole_store_search_filtered_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scope holding few of the store's entries is searched from its own ids (keyword: the FTS rowids of each
    word kept when in the scope; semantic: the scope's vectors ranked, rows read best first) instead of matching
    the whole store and filtering, with ties on score (a vocabulary of 12 words, equal vectors), expired,
    superseded and forgotten entries, entries without a vector, and filters beyond the path. Keyword search and
    common_terms must answer exactly as the whole-store path (SCOPED_SCAN_MAX 0); semantic search as an exact scan
    of the filter's entries, ties newest first (the index's search is approximate: among 100 equal vectors it
    returned an arbitrary few, so it is no reference)."""
    actor = Actor("agent/test", "session-1")
    rng = np.random.default_rng(11)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima"]
    now = utcnow()
    paths = [f"chat/{n % 9}" if n % 9 else f"chat/{n % 9}/deep" for n in range(360)]
    current: dict[str, NewEntry] = {}  # key -> its current version

    def entry(n: int, path: str, written: float, **changes: object) -> NewEntry:
        text = " ".join(rng.choice(words, size=int(rng.integers(1, 5))))
        vector = rng.standard_normal(8).astype(np.float32)
        if n % 4 == 0:
            vector = np.ones(8, dtype=np.float32)  # equal vectors: ties on similarity, across the limit
        fields: dict[str, object] = dict(
            entity_path=path, key=f"t{n}", value=text, value_json=f'"{text}"', confidence=1.0,
            memory_type=MemoryType.BELIEF if n % 5 == 0 else MemoryType.FACT, agent_id=actor.agent_id,
            session_id=actor.session_id, written_at=now - timedelta(seconds=written), ttl_at=None,
            importance_score=None, importance_dimensions=None, tier=Tier.HOT, priority_score=0.5,
            embedding=None if n % 23 == 0 else vector.tolist(), search_text=text)
        fields.update(changes)
        current[fields["key"]] = made = NewEntry(**fields)  # type: ignore[arg-type]
        return made

    def scanned(vector: list[float], flt: EntryFilter, limit: int, row_ids: dict[str, int]) -> list[tuple[str, float]]:
        """The filter's live entries with a vector, by exact cosine, then newest write, then latest row."""
        query = np.asarray(vector, dtype=np.float64)
        found = []
        for made in current.values():
            if made.embedding is None or (made.ttl_at is not None and made.ttl_at <= now):
                continue
            if not (made.entity_path == flt.entity_path or made.entity_path.startswith(f"{flt.entity_path}/")):
                continue
            if flt.memory_type is not None and made.memory_type != flt.memory_type:
                continue
            stored = np.asarray(made.embedding, dtype=np.float64)
            cosine = float(stored @ query / np.linalg.norm(stored) / np.linalg.norm(query))
            found.append((cosine, made.written_at, row_ids[made.key], made.key))
        return [(key, cosine) for cosine, _, _, key in sorted(found, reverse=True)[:limit]]

    store = SQLiteStore(tmp_path / "amfs.db")
    await store.open()
    try:
        # Write times in whole minutes: many entries share one, so ties go on to the row id.
        await store.insert_versions([entry(n, path, 60.0 * (n % 7)) for n, path in enumerate(paths)], actor)
        # A conversation written in one go: its rows lie in a narrow range of row ids, which keyword search seeks.
        await store.insert_versions([entry(n, "chat/block", 60.0 * (n % 7)) for n in range(360, 400)], actor)
        await store.insert_versions([entry(n, paths[n], 0.0) for n in range(2, 360, 37)], actor)
        await store.insert_versions([  # expired but not purged, and new versions of a few keys
            *[entry(n, paths[n], 0.0, ttl_at=now - timedelta(seconds=1)) for n in range(0, 360, 13)],
            *[entry(n, paths[n], 0.0) for n in range(5, 360, 29)],
            *[entry(n, "chat/block", 0.0, ttl_at=now - timedelta(seconds=1)) for n in (361, 375)],
        ], actor)
        for n in range(7, 360, 31):
            await store.forget(paths[n], f"t{n}")
            del current[f"t{n}"]
        filters = [EntryFilter(entity_path=path) for path in ("chat/1", "chat/0", "chat/0/deep", "chat/4", "chat/block")]
        filters += [EntryFilter(entity_path="chat/2", memory_type=MemoryType.FACT)]
        queries = [list(rng.choice(words, size=int(rng.integers(1, 6)), replace=False)) for _ in range(25)]
        vectors = [rng.standard_normal(8).tolist() for _ in range(10)] + [[1.0] * 8]

        async def searches() -> list[list[object]]:
            keyword: list[object] = []
            common: list[object] = []
            semantic: list[object] = []
            for flt in filters:
                for terms in queries:
                    keyword.append([(e.key, e.version, round(s, 12)) for e, s in await store.keyword_candidates(terms, flt, now, 7)])
                    common.append(sorted(await store.common_terms(terms, 5, flt.entity_path)))
                for vector in vectors:
                    semantic.append([(e.key, s) for e, s in await store.semantic_candidates(vector, flt, now, 6)])
            return [keyword, common, semantic]

        read_scopes: list[str] = []
        scope_ids = sqlite_adapter.scope_row_ids
        monkeypatch.setattr(sqlite_adapter, "scope_row_ids", lambda conn, path: read_scopes.append(path) or scope_ids(conn, path))
        small = await searches()
        with closing(sqlite3.connect(tmp_path / "amfs.db")) as conn:
            row_ids = dict(conn.execute("SELECT key, row_id FROM entries WHERE is_current = 1").fetchall())
        exact = [scanned(vector, flt, 6, row_ids) for flt in filters for vector in vectors]
        assert [[key for key, _ in found] for found in small[2]] == [[key for key, _ in found] for found in exact]
        for found, wanted in zip(small[2], exact):
            assert [cosine for _, cosine in found] == pytest.approx([cosine for _, cosine in wanted], abs=1e-5)
        # The scope's own path: every keyword and semantic search, and common_terms for a query with a word common
        # in the store (counted again within the scope).
        assert len(read_scopes) > len(filters) * (len(queries) + len(vectors))
        assert "chat/block" in read_scopes
        monkeypatch.setattr(sqlite_adapter, "SCOPED_SCAN_MAX", 0)
        read_scopes.clear()
        whole = await searches()
        assert read_scopes == []
        for kind, small_found, whole_found in zip(["keyword", "common"], small, whole):
            assert small_found == whole_found, kind
            assert sum(1 for found in whole_found if found) > len(whole_found) / 2, kind  # something to compare
        assert all(len(found) == 6 for found in exact)
    finally:
        await store.close()


async def test_statements_with_many_ids_fit_an_sqlite_that_takes_999_parameters(tmp_path: Path) -> None:
    """SQLite builds before 3.32 take at most 999 parameters in one statement. A keyword search with over a
    thousand tied candidates, a scoped scan reading over a thousand tied rows, a vector search widened past a
    thousand and forgetting a key of over a thousand versions each name their rows by id in parts
    (IDS_PER_STATEMENT)."""
    actor = Actor("agent/test", "session-1")
    now = utcnow()
    same = [1.0] + [0.0] * 7

    def entry(path: str, key: str, vector: list[float], memory_type: MemoryType = MemoryType.FACT,
              text: str = "tied words", seconds: int = 0) -> NewEntry:
        return NewEntry(entity_path=path, key=key, value=text, value_json=f'"{text}"', confidence=1.0,
                        memory_type=memory_type, agent_id=actor.agent_id, session_id=actor.session_id,
                        written_at=now - timedelta(seconds=seconds), ttl_at=None, importance_score=None,
                        importance_dimensions=None, tier=Tier.HOT, priority_score=0.5, embedding=vector,
                        search_text=text)

    rng = np.random.default_rng(2)
    store = SQLiteStore(tmp_path / "amfs.db")
    await store.open()
    try:
        store._connection().setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
        await store.insert_versions([entry("chat/tie", f"t{n}", same, seconds=n) for n in range(1200)], actor)
        others = rng.standard_normal((3800, 8))
        await store.insert_versions([
            entry(f"other/{n % 7}", f"o{n}", vector.tolist(), MemoryType.BELIEF if n < 3 else MemoryType.FACT, f"note {n}")
            for n, vector in enumerate(others)
        ], actor)
        scope = EntryFilter(entity_path="chat/tie")  # 1,200 of 5,000: a small scope
        found = await store.keyword_candidates(["tied"], scope, now, 10)
        assert [e.key for e, _ in found] == [f"t{n}" for n in range(10)]  # all tie: newest first
        found = await store.semantic_candidates(same, scope, now, 10)
        assert [e.key for e, _ in found] == [f"t{n}" for n in range(10)]
        # A filter without a path: the index's search widens past 1,000 before its 3 beliefs are all in.
        assert len(await store.semantic_candidates(same, EntryFilter(memory_type=MemoryType.BELIEF), now, 5)) == 3
        for version in range(1100):
            await store.insert_versions([entry("chat/long", "k", same, text=f"version {version}")], actor)
        assert await store.forget("chat/long", "k") == 1100
        assert await store.history("chat/long", "k") == []
    finally:
        await store.close()


async def test_every_character_fts5_splits_words_at_breaks_them_for_the_length_factor(tmp_path: Path) -> None:
    """A red-team finding: New Tai Lue vowel signs and two Vedic signs (letters to Python, separators to FTS5's
    Unicode 6.1 tables) joined words FTS5 indexes one by one, and the length factor counted one word. Probed with
    the tokenizer of the store's own keyword index."""
    import re

    from amfs_server.core.retrieval import KEYWORD_LENGTH_PIVOT, distinct_words

    store = SQLiteStore(tmp_path / "amfs.db")
    await store.open()
    await store.close()
    with closing(sqlite3.connect(tmp_path / "amfs.db")) as conn:
        (schema,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'entries_fts'").fetchone()
        probe = sqlite3.connect(":memory:")
        probe.execute(schema.replace("entries_fts", "probe", 1))
    candidates = [cp for cp in range(0x80, 0x30000)
                  if not 0xD800 <= cp < 0xE000 and re.fullmatch(r"[^\W_]", chr(cp))]
    probe.executemany("INSERT INTO probe (rowid, search_text) VALUES (?, ?)",
                      ((cp, f"alpha{chr(cp)}beta") for cp in candidates))
    joiners = [chr(cp) for (cp,) in probe.execute("SELECT rowid FROM probe WHERE probe MATCH 'alpha'")]
    assert len(joiners) >= 21  # the probe really ran: FTS5 split at these when this was written
    words = [f"word{n}x" for n in range(2 * KEYWORD_LENGTH_PIVOT)]
    counted_as_one = [hex(ord(c)) for c in joiners if distinct_words(c.join(words)) != 2 * KEYWORD_LENGTH_PIVOT]
    assert counted_as_one == []



async def test_word_counts_are_filled_for_older_rows_and_counted_at_read_where_missing(tmp_path: Path) -> None:
    """Since schema 7 a row carries its search text's distinct-word count, so the keyword length factor reads no text.
    A file of schema 6 gets the counts of its rows when it is opened; a row without one (written by an older server
    still running) is counted from its text at read, so it ranks the same."""
    from amfs_server.core.retrieval import KEYWORD_LENGTH_PIVOT, distinct_words

    actor = Actor("agent/test", "session-1")
    now = utcnow()
    stuffed = "flamegraph " + " ".join(f"word{i}" for i in range(2 * KEYWORD_LENGTH_PIVOT - 1))

    def entry(key: str, text: str, age_s: float) -> NewEntry:
        return NewEntry(entity_path="svc", key=key, value="x", value_json='"x"', confidence=1.0, memory_type=MemoryType.FACT,
                        agent_id=actor.agent_id, session_id=actor.session_id, written_at=now - timedelta(seconds=age_s),
                        ttl_at=None, importance_score=None, importance_dimensions=None, tier=Tier.HOT,
                        priority_score=0.5, embedding=None, search_text=text)

    path = tmp_path / "amfs.db"
    store = SQLiteStore(path)
    await store.open()
    await store.insert_versions([entry("plain", "flamegraph of the deploy dashboard", 1), entry("stuffed", stuffed, 0)], actor)
    await store.close()
    with closing(sqlite3.connect(path)) as conn:  # the file as schema 6 left it
        conn.execute("DROP INDEX entries_uncounted")
        conn.execute("ALTER TABLE entries DROP COLUMN distinct_words")
        conn.execute(f"PRAGMA user_version = {sqlite_adapter.WORD_COUNT_MIGRATION - 1}")
        conn.commit()
    store = SQLiteStore(path)
    await store.open()
    try:
        with closing(sqlite3.connect(path)) as conn:
            counts = dict(conn.execute("SELECT key, distinct_words FROM entries"))
            assert conn.execute("PRAGMA user_version").fetchone()[0] == len(sqlite_adapter.MIGRATIONS)
        assert counts == {"plain": distinct_words("flamegraph of the deploy dashboard"), "stuffed": 2 * KEYWORD_LENGTH_PIVOT}
        hits = await store.keyword_candidates(["flamegraph"], EntryFilter(), now, 10)
        assert [e.key for e, _ in hits] == ["plain", "stuffed"] and hits[1][1] == pytest.approx(hits[0][1] * 0.25)
        with closing(sqlite3.connect(path)) as conn:
            conn.execute("UPDATE entries SET distinct_words = NULL")
            conn.commit()
        assert await store.keyword_candidates(["flamegraph"], EntryFilter(), now, 10) == hits
        await store.close()
        store = SQLiteStore(path)
        await store.open()  # and the next open counts them
        with closing(sqlite3.connect(path)) as conn:
            assert dict(conn.execute("SELECT key, distinct_words FROM entries")) == counts
        with closing(sqlite3.connect(path)) as conn:  # a stored count is what is used: the text is not counted again
            conn.execute("UPDATE entries SET distinct_words = ? WHERE key = 'plain'", (4 * KEYWORD_LENGTH_PIVOT,))
            conn.commit()
        scaled = await store.keyword_candidates(["flamegraph"], EntryFilter(), now, 10)
        assert [(e.key, score) for e, score in scaled] == [("stuffed", hits[1][1]), ("plain", pytest.approx(hits[0][1] / 16))]
    finally:
        await store.close()
