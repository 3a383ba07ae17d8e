"""The embedded SQLite store: the zero-set-up default.

WAL mode, `BEGIN IMMEDIATE` around every change (so concurrent writers from several processes
serialise instead of racing to the same version), a schema version with migrations, and an FTS5
index over the current version of each key. One connection per store, used from worker threads
behind a lock so the event loop never blocks on disk.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import math
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from ..core.errors import ConflictError, StoreError
from ..core.interprocess import LOCK_WAIT_S, acquire_exclusive
from ..core.models import (
    Actor,
    EntryFilter,
    MemoryEntry,
    NewEntry,
    OutcomeEffect,
    OutcomeRecord,
    OutcomeType,
    SortBy,
    TraceEvent,
    TraceKind,
    entry_key,
)
from ..core.ports import IMPORT_PENDING_META, OutcomeTarget, StoreSnapshot, TierUpdate, missing_causal_entry, nothing_read
from ..core.retrieval import distinct_words, query_word_pattern
from .sql_common import (
    ENTRY_BASE_COLUMNS,
    ENTRY_COLUMNS,
    ENTRY_COLUMNS_WITHOUT_VALUES,
    ENTRY_INSERT_COLUMNS,
    EFFECT_COLUMNS,
    OUTCOME_COLUMNS,
    STORE_CHANGED,
    SQLITE,
    TRACE_COLUMNS,
    TRACE_INSERT_COLUMNS,
    WORD_COUNT_COLUMNS,
    already_applied,
    count_outcomes,
    draft_params,
    effect_params,
    entry_columns,
    entry_from_row,
    export_store,
    import_store,
    length_scaled,
    outcome_filter,
    outcome_params,
    outcome_records,
    read_columns,
    run_sqlite,
    sort_sql,
    trace_from_row,
    trace_params,
    upsert_meta_sql,
    value_columns,
    value_from_row,
)
from .sqlite_base import SQLiteDatabase, _ts
from .vector_index import VectorIndex

log = logging.getLogger(__name__)


# Each entry is one migration step; the schema version is its 1-based position.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE entries (
        row_id INTEGER PRIMARY KEY AUTOINCREMENT,
        entity_path TEXT NOT NULL,
        key TEXT NOT NULL,
        version INTEGER NOT NULL,
        is_current INTEGER NOT NULL,
        value_json TEXT NOT NULL,
        confidence REAL NOT NULL,
        agent_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        written_at REAL NOT NULL,
        outcome_count INTEGER NOT NULL DEFAULT 0,
        recall_count INTEGER NOT NULL DEFAULT 0,
        ttl_at REAL,
        memory_type TEXT NOT NULL,
        tier INTEGER NOT NULL,
        priority_score REAL,
        importance_score REAL,
        importance_dimensions TEXT,
        embedding BLOB,
        amfs_version TEXT NOT NULL,
        search_text TEXT NOT NULL DEFAULT '',
        UNIQUE (entity_path, key, version)
    );
    CREATE UNIQUE INDEX entries_current_key ON entries (entity_path, key) WHERE is_current = 1;
    CREATE INDEX entries_current_written ON entries (written_at) WHERE is_current = 1;
    CREATE INDEX entries_current_confidence ON entries (confidence) WHERE is_current = 1;
    CREATE VIRTUAL TABLE entries_fts USING fts5 (search_text, tokenize = "porter unicode61 tokenchars '_'");
    CREATE TABLE outcomes (
        outcome_ref TEXT PRIMARY KEY,
        outcome_type TEXT NOT NULL,
        multiplier REAL NOT NULL,
        committed_at REAL NOT NULL,
        agent_id TEXT NOT NULL,
        session_id TEXT NOT NULL
    );
    CREATE TABLE outcome_effects (
        outcome_ref TEXT NOT NULL REFERENCES outcomes (outcome_ref) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        entity_path TEXT NOT NULL,
        key TEXT NOT NULL,
        version_read INTEGER,
        version_updated INTEGER NOT NULL,
        confidence_before REAL NOT NULL,
        confidence_after REAL NOT NULL,
        PRIMARY KEY (outcome_ref, entity_path, key)
    );
    CREATE INDEX outcome_effects_entry ON outcome_effects (entity_path, key);
    CREATE TABLE trace_events (
        event_id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        entity_path TEXT NOT NULL,
        key TEXT NOT NULL,
        version INTEGER NOT NULL,
        at REAL NOT NULL,
        detail TEXT
    );
    CREATE INDEX trace_events_session ON trace_events (session_id, kind);
    CREATE TABLE meta (name TEXT PRIMARY KEY, value_json TEXT NOT NULL);
    """,
    # 2: expiring entries found without reading every row (the memory browser's per-entity counts).
    "CREATE INDEX entries_current_ttl ON entries (ttl_at) WHERE is_current = 1 AND ttl_at IS NOT NULL;",
    # 3: when the remembered event happened (MemoryEntry.event_at), NULL for entries written without one.
    "ALTER TABLE entries ADD COLUMN event_at REAL;",
    # 4: an entry's passage (sentence) embeddings beside their mean (MemoryEntry.passage_embeddings).
    "ALTER TABLE entries ADD COLUMN passage_embeddings BLOB;",
    # 5: the key whose turn made an entry's context passage (MemoryEntry.context_key); forgetting it strips the row.
    "ALTER TABLE entries ADD COLUMN context_key TEXT;",
    # 6: superseded versions whose own TTL passed, found by the expiry sweep without reading every row.
    "CREATE INDEX entries_superseded_ttl ON entries (ttl_at) WHERE is_current = 0 AND ttl_at IS NOT NULL;",
    # 7: the distinct words of an entry's search text, counted when it is written, for the keyword length factor;
    # rows written before (or by an older process since) are counted at open, found by the partial index.
    """
    ALTER TABLE entries ADD COLUMN distinct_words INTEGER;
    CREATE INDEX entries_uncounted ON entries (row_id) WHERE distinct_words IS NULL;
    """,
]
WORD_COUNT_MIGRATION = 7
# Rows counted a transaction at a time at open: each holds the write lock for a moment, not the whole store's time.
WORD_COUNT_BATCH = 2_000

_BASE_COLUMNS = ENTRY_BASE_COLUMNS
_ENTRY_COLUMNS = ENTRY_COLUMNS
_SORT_SQL = sort_sql(SQLITE)
_INSERT_ENTRY = SQLITE.insert("entries", ENTRY_INSERT_COLUMNS)
_INSERT_TRACE = SQLITE.insert("trace_events", TRACE_INSERT_COLUMNS)
_UPSERT_META = upsert_meta_sql(SQLITE)
MAX_KEYWORD_PHRASES = 64  # as PostgreSQL's MAX_QUERY_WORDS: one index lookup per word
# A word's matches between two row ids, as bare rowids (the FTS index holds current entries only). FTS5 seeks
# the range within the word's doclist: a conversation's turns, written one after another, lie in a narrow one.
_FTS_ROWIDS = "SELECT rowid FROM entries_fts WHERE entries_fts MATCH ? AND rowid BETWEEN ? AND ?"


# Row ids per `IN (...)` list: SQLite builds before 3.32 take at most 999 parameters in one statement.
IDS_PER_STATEMENT = 500


def _id_lists(sql: str, ids: Sequence[int]) -> Iterator[tuple[str, list[int]]]:
    """`sql` with its `IN (?ids)` written out for each part of `ids`, and the part."""
    for start in range(0, len(ids), IDS_PER_STATEMENT):
        part = list(ids[start:start + IDS_PER_STATEMENT])
        yield sql.replace("IN (?ids)", f"IN ({','.join('?' * len(part))})"), part


def select_by_ids(conn: sqlite3.Connection, sql: str, ids: Sequence[int], params: Sequence[Any] = ()) -> list[Any]:
    """The rows of `sql`, whose `IN (?ids)` stands for a list of `ids` (then `params`), over parts of `ids` small
    enough for any SQLite build."""
    return [row for text, part in _id_lists(sql, ids) for row in conn.execute(text, [*part, *params]).fetchall()]


def delete_by_ids(conn: sqlite3.Connection, sql: str, ids: Sequence[int]) -> int:
    """Run the DELETE `sql` (its `IN (?ids)` as in `select_by_ids`) over parts of `ids`; the rows deleted."""
    return sum(conn.execute(text, part).rowcount for text, part in _id_lists(sql, ids))


def match_words(terms: list[str]) -> list[str]:
    """The FTS5 phrases of the terms' words, each quoted: `["retry policy", "ERR_42"]` -> `['"retry"', '"policy"',
    '"ERR_42"']`. Words are `query_word_pattern` runs, as PostgreSQL's adapter splits them; FTS5 splits a quoted
    word as it split the stored text (at an Indic vowel sign, say) and matches it as a phrase. Quoting each one keeps
    FTS5 operators in user text inert."""
    return [f'"{word}"' for word in dict.fromkeys(
        word for term in terms for word in query_word_pattern().findall(term or ""))]


def match_any(terms: list[str]) -> str:
    """An FTS5 query matching any word of any term: `"retry" OR "policy" OR "ERR_42"`; empty when there is no word."""
    return " OR ".join(match_words(terms))


def fts_row_count(conn: sqlite3.Connection) -> int:
    """The index's row count without counting: the first varint of FTS5's averages record (`entries_fts_data`, id 1;
    SQLite's documented FTS5 file format), the N its own bm25() uses. Falls back to counting when it is missing."""
    row = conn.execute("SELECT block FROM entries_fts_data WHERE id = 1").fetchone()
    block: bytes = row[0] if row else b""
    if block:
        value = 0
        for byte in block[:9]:
            value = (value << 7) | (byte & 0x7F)
            if not byte & 0x80:
                return value
    counted: int = conn.execute("SELECT count(*) FROM entries_fts").fetchone()[0]
    return counted


def prefix_clause(column: str, entity_path: str) -> tuple[str, list[Any]]:
    """`entity_path` and everything below it, as a key range (`SQLiteDialect.under`)."""
    clause, params = SQLITE.under(column, entity_path)
    return clause, list(params)


# A search scoped to an entity path (one conversation among many) works from the scope's own entries when it holds
# at most SCOPED_SCAN_MAX of them and at most 1/SCOPED_SCAN_SHARE of the store: it scans the scope's vectors and
# takes its keyword matches from its ids. The vector index's search, which knows nothing of the filter, widened its
# pool fourfold until enough hits passed it (four rounds for a scope of 1/60, 17 ms at 10k entries), and joining a
# word's every match in the store to its row to test its path cost 5 us a match (54 ms for a word in every one of
# 100k entries). PostgreSQL keeps pgvector's filtered HNSW search: an exact scan of a 5,000-entry scope at 100k
# entries was no faster there (28 ms p50 against 27).
SCOPED_SCAN_MAX = 10_000
SCOPED_SCAN_SHARE = 4


def scoped_scan_cap(store_size: int) -> int:
    """The most entries a scope may hold, in a store of `store_size`, for a search to work from the scope's own."""
    return min(SCOPED_SCAN_MAX, store_size // SCOPED_SCAN_SHARE)


def entries_in_scope(conn: sqlite3.Connection, entity_path: str, at_most: int | None = None) -> int:
    """Current entries at `entity_path` and below: the N of the keyword IDF for a retrieval scoped there, so a
    scoped caller's scores say nothing about the rest of the store. Counted on the current-key index alone, the
    path and the range below it as two index searches (0.7 ms for 10,000 entries at 100k; reading their rows took
    16); with `at_most`, the count of the range below stops past it."""
    exact, below, above = prefix_clause("entity_path", entity_path)[1]
    return int(conn.execute(
        "SELECT (SELECT count(*) FROM entries WHERE is_current = 1 AND entity_path = ?) + (SELECT count(*) FROM "
        "(SELECT 1 FROM entries WHERE is_current = 1 AND entity_path >= ? AND entity_path < ? LIMIT ?))",
        (exact, below, above, -1 if at_most is None else at_most + 1),  # SQLite reads a negative LIMIT as none
    ).fetchone()[0])


def scope_row_ids(conn: sqlite3.Connection, entity_path: str) -> list[int]:
    """Row ids of the current entries at `entity_path` and below, from the current-key index alone: the path and
    the range below it as two index searches (1 ms for 5,000 ids at 100k entries; the two as one OR made SQLite
    read every row, 5 ms). Nothing else of the filter is applied: callers apply it to the rows they read."""
    exact, below, above = prefix_clause("entity_path", entity_path)[1]
    cursor = conn.cursor()
    cursor.row_factory = None  # plain tuples: a sqlite3.Row each cost 0.3 ms per 1,000 ids
    return [row_id for row_id, in cursor.execute(
        "SELECT row_id FROM entries WHERE is_current = 1 AND entity_path = ? UNION ALL "
        "SELECT row_id FROM entries WHERE is_current = 1 AND entity_path >= ? AND entity_path < ?",
        (exact, below, above),
    )]


def small_scope_ids(conn: sqlite3.Connection, entity_path: str, store_size: int) -> list[int] | None:
    """`scope_row_ids` when the scope is small (`scoped_scan_cap`; decided on the key index before any id is read),
    else None: a search then pays by the scope, not the store."""
    cap = scoped_scan_cap(store_size)
    if entries_in_scope(conn, entity_path, at_most=cap) > cap:
        return None
    return scope_row_ids(conn, entity_path)


def expired_in_scope(conn: sqlite3.Connection, entity_path: str, now: datetime) -> set[int]:
    """Current entries at `entity_path` and below whose TTL has passed but which no purge has removed yet, found on
    the TTL index (few, if any)."""
    rows = conn.execute(
        "SELECT row_id, entity_path FROM entries WHERE is_current = 1 AND ttl_at IS NOT NULL AND ttl_at <= ?",
        (_ts(now),),
    )
    return {row_id for row_id, path in rows if path == entity_path or path.startswith(entity_path + "/")}


def _mark_scrub_pending(conn: sqlite3.Connection) -> None:
    conn.execute(_UPSERT_META, (VECTOR_SCRUB_META, "true"))


def _clear_scrub_pending(conn: sqlite3.Connection) -> None:
    conn.execute("DELETE FROM meta WHERE name = ?", (VECTOR_SCRUB_META,))


def _row_to_entry(row: sqlite3.Row, with_embedding: bool = True) -> MemoryEntry:
    return entry_from_row(row, SQLITE, with_embedding)


class SQLiteStore(SQLiteDatabase):
    """MemoryStore on one SQLite file (`<data_dir>/amfs.db`)."""

    name = "sqlite"
    MIGRATIONS = MIGRATIONS
    DESCRIPTION = "SQLite store"
    LOCATION_HINT = "set AMFS_DATA_DIR"

    def __init__(self, path: Path | str) -> None:
        super().__init__(path)
        self._vectors = VectorSync(self.path.with_suffix(".vectors.usearch"))

    def _before_close(self) -> None:
        self._vectors.save(self._connection())

    # -- entries ----------------------------------------------------------------------------

    async def insert_versions(self, drafts: list[NewEntry], actor: Actor) -> list[MemoryEntry]:
        return await self._run(lambda: self._insert_versions_sync(drafts, actor))

    def _insert_versions_sync(self, drafts: list[NewEntry], actor: Actor) -> list[MemoryEntry]:
        # Rows go in in key order (a stable sort keeps repeated keys in draft order), as PostgreSQL stores them:
        # a batch shares one written_at, so row order is what breaks its ties. Results go back in draft order.
        order = sorted(range(len(drafts)), key=lambda i: (drafts[i].entity_path, drafts[i].key))
        stored: list[MemoryEntry | None] = [None] * len(drafts)
        removed = 0
        erased: list[tuple[int, bytes | None]] = []
        with self._transaction() as conn:
            for index in order:
                draft = drafts[index]
                previous = conn.execute(
                    "SELECT row_id, version, ttl_at FROM entries WHERE entity_path = ? AND key = ? AND is_current = 1",
                    (draft.entity_path, draft.key),
                ).fetchone()
                if previous is not None and previous["ttl_at"] is not None and previous["ttl_at"] <= _ts(draft.written_at):
                    # Its current version expired: the key is gone (the sweep would erase every version), so this
                    # write starts it anew rather than bring the older versions back.
                    gone, vectors = self._erase_keys_sync(conn, [(draft.entity_path, draft.key)])
                    removed, erased, previous = removed + gone, erased + vectors, None
                if draft.context_key is not None and conn.execute(
                    "SELECT 1 FROM entries WHERE entity_path = ? AND key = ? AND written_at <= ? LIMIT 1",
                    (draft.entity_path, draft.context_key, _ts(draft.written_at)),
                ).fetchone() is None:
                    # The turn that lent the context passage was erased after the passage was made (a forget racing
                    # this write; written again since, it is another text): its text must not stay behind in this one.
                    draft = draft.without_context()
                version = 1
                if previous is not None:
                    version = previous["version"] + 1
                    conn.execute("UPDATE entries SET is_current = 0 WHERE row_id = ?", (previous["row_id"],))
                    conn.execute("DELETE FROM entries_fts WHERE rowid = ?", (previous["row_id"],))
                row_id = conn.execute(_INSERT_ENTRY, draft_params(draft, version, SQLITE)).lastrowid
                conn.execute("INSERT INTO entries_fts (rowid, search_text) VALUES (?, ?)", (row_id, SQLITE.search_text(draft.search_text)))
                conn.execute(
                    _INSERT_TRACE,
                    trace_params(actor.session_id, actor.agent_id, "write", draft.entity_path, draft.key, version,
                                 draft.written_at, None, SQLITE),
                )
                row = conn.execute(f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE row_id = ?", (row_id,)).fetchone()
                stored[index] = _row_to_entry(row)
        self._vectors.dirty = True
        self._after_erase(removed, erased)
        return stored  # type: ignore[return-value]

    async def get_current(self, entity_path: str, key: str, now: datetime) -> MemoryEntry | None:
        def fetch() -> MemoryEntry | None:
            row = self._connection().execute(
                f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE entity_path = ? AND key = ? AND is_current = 1 "
                "AND (ttl_at IS NULL OR ttl_at > ?)",
                (entity_path, key, _ts(now)),
            ).fetchone()
            return None if row is None else _row_to_entry(row)

        return await self._run(fetch)

    async def get_version(self, entity_path: str, key: str, version: int) -> MemoryEntry | None:
        def fetch() -> MemoryEntry | None:
            row = self._connection().execute(
                f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE entity_path = ? AND key = ? AND version = ?",
                (entity_path, key, version),
            ).fetchone()
            return None if row is None else _row_to_entry(row)

        return await self._run(fetch)

    async def history(self, entity_path: str, key: str, *, values: bool = True) -> list[MemoryEntry]:
        columns = _ENTRY_COLUMNS if values else ENTRY_COLUMNS_WITHOUT_VALUES

        def fetch() -> list[MemoryEntry]:
            rows = self._connection().execute(
                f"SELECT {columns} FROM entries WHERE entity_path = ? AND key = ? ORDER BY version",
                (entity_path, key),
            ).fetchall()
            return [_row_to_entry(row, with_embedding=values) for row in rows]

        return await self._run(fetch)

    async def find_current(
        self, flt: EntryFilter, now: datetime, sort_by: SortBy, limit: int | None, *, values: bool = True,
        value_head: int | None = None,
    ) -> list[MemoryEntry]:
        clauses, params = self._filter_sql(flt, now)
        columns = read_columns(values, value_head)
        sql = f"SELECT {columns} FROM entries WHERE {' AND '.join(clauses)} ORDER BY {_SORT_SQL[sort_by]}"
        if limit is not None:
            sql += f" LIMIT {max(0, int(limit))}"  # SQLite reads a negative LIMIT as none

        def fetch() -> list[MemoryEntry]:
            return [_row_to_entry(row, with_embedding=False) for row in self._connection().execute(sql, params)]

        return await self._run(fetch)

    async def entity_counts(self, entity_path: str | None, now: datetime) -> dict[str, int]:
        # Counted from the (entity_path, key) index alone, then the expired, found through the TTL index, are
        # taken off: reading ttl_at from every row instead costs seconds at 100k entries. The scope is one
        # index range, [path, path + '0'), that also holds siblings such as 'path-2'; they are dropped below.
        scope, params = ("", []) if entity_path is None else (
            "AND entity_path >= ? AND entity_path < ?", [entity_path, entity_path + "0"]
        )
        live = f"SELECT entity_path, count(*) FROM entries WHERE is_current = 1 {scope} GROUP BY entity_path"
        expired = (
            "SELECT entity_path, count(*) FROM entries WHERE is_current = 1 AND ttl_at IS NOT NULL AND ttl_at <= ? "
            "GROUP BY entity_path"
        )

        def in_scope(path: str) -> bool:
            return entity_path is None or path == entity_path or path.startswith(entity_path + "/")

        def fetch() -> dict[str, int]:
            conn = self._connection()
            counts = {path: n for path, n in conn.execute(live, params).fetchall() if in_scope(path)}
            for path, n in conn.execute(expired, [_ts(now)]).fetchall():
                if path in counts:
                    counts[path] -= n
            return {path: n for path, n in counts.items() if n > 0}

        return await self._run(fetch)

    async def latest_at(self, entity_path: str, now: datetime, limit: int) -> list[MemoryEntry]:
        # `entity_path = ?` (not the prefix filter) lets the (entity_path, key) index pick the path's rows.
        sql = (
            f"SELECT {_BASE_COLUMNS} FROM entries WHERE is_current = 1 AND (ttl_at IS NULL OR ttl_at > ?) "
            "AND entity_path = ? ORDER BY written_at DESC, row_id DESC LIMIT ?"
        )
        params = (_ts(now), entity_path, max(0, int(limit)))

        def fetch() -> list[MemoryEntry]:
            return [_row_to_entry(row, with_embedding=False) for row in self._connection().execute(sql, params)]

        return await self._run(fetch)

    async def entries_at(
        self, entity_path: str, now: datetime, offset: int, limit: int, *, value_head: int | None = None
    ) -> list[MemoryEntry]:
        sql = (
            f"SELECT {entry_columns(value_head)} FROM entries WHERE is_current = 1 AND (ttl_at IS NULL OR ttl_at > ?) "
            "AND entity_path = ? ORDER BY key LIMIT ? OFFSET ?"
        )
        params = (_ts(now), entity_path, max(0, int(limit)), max(0, int(offset)))

        def fetch() -> list[MemoryEntry]:
            return [_row_to_entry(row, with_embedding=False) for row in self._connection().execute(sql, params)]

        return await self._run(fetch)

    @staticmethod
    def _filter_sql(flt: EntryFilter, now: datetime, column_prefix: str = "") -> tuple[list[str], list[Any]]:
        c = column_prefix
        clauses = [f"{c}is_current = 1", f"({c}ttl_at IS NULL OR {c}ttl_at > ?)"]
        params: list[Any] = [_ts(now)]
        if flt.entity_path is not None:
            clause, extra = prefix_clause(f"{c}entity_path", flt.entity_path)
            clauses.append(clause)
            params.extend(extra)
        if flt.memory_type is not None:
            clauses.append(f"{c}memory_type = ?")
            params.append(flt.memory_type.value)
        if flt.agent_id is not None:
            clauses.append(f"{c}agent_id = ?")
            params.append(flt.agent_id)
        if flt.since is not None:
            clauses.append(f"{c}written_at >= ?")
            params.append(_ts(flt.since))
        if flt.min_stored_confidence is not None:
            clauses.append(f"{c}confidence >= ?")
            params.append(flt.min_stored_confidence)
        if flt.event_after is not None:
            clauses.append(f"coalesce({c}event_at, {c}written_at) >= ?")
            params.append(_ts(flt.event_after))
        if flt.event_before is not None:
            clauses.append(f"coalesce({c}event_at, {c}written_at) <= ?")
            params.append(_ts(flt.event_before))
        return clauses, params

    # -- reads and traces ---------------------------------------------------------------------

    async def record_reads(self, actor: Actor, kind: TraceKind, reads: list[TierUpdate], now: datetime) -> None:
        if not reads:
            return

        def write() -> None:
            with self._transaction() as conn:
                # Only a version still held (the same write: times kept as epoch floats, so within a millisecond)
                # gets its count and its trace; one forgotten since the read was made gets neither.
                held = [
                    read for read in reads
                    if conn.execute(
                        "UPDATE entries SET recall_count = recall_count + 1, tier = ?, priority_score = ? "
                        "WHERE entity_path = ? AND key = ? AND version = ? AND (? IS NULL OR abs(written_at - ?) < 0.001)",
                        (int(read.tier), read.priority_score, read.entity_path, read.key, read.version,
                         _ts(read.written_at), _ts(read.written_at)),
                    ).rowcount
                ]
                conn.executemany(
                    _INSERT_TRACE,
                    [
                        trace_params(actor.session_id, actor.agent_id, kind, r.entity_path, r.key, r.version, now,
                                     r.detail, SQLITE)
                        for r in held
                    ],
                )

        await self._run(write)

    async def session_reads(self, session_id: str) -> list[OutcomeTarget]:
        return await self._run(lambda: self._session_reads_sync(self._connection(), session_id))

    @staticmethod
    def _session_reads_sync(conn: sqlite3.Connection, session_id: str) -> list[OutcomeTarget]:
        rows = conn.execute(
            "SELECT entity_path, key, MAX(version) AS version, MIN(event_id) AS first FROM trace_events "
            "WHERE session_id = ? AND kind IN ('read', 'retrieve') GROUP BY entity_path, key ORDER BY first",
            (session_id,),
        ).fetchall()
        return [OutcomeTarget(row["entity_path"], row["key"], row["version"]) for row in rows]

    async def trace_events(self, session_id: str | None = None) -> list[TraceEvent]:
        def fetch() -> list[TraceEvent]:
            sql = f"SELECT {TRACE_COLUMNS} FROM trace_events"
            params: tuple[Any, ...] = ()
            if session_id is not None:
                sql += " WHERE session_id = ?"
                params = (session_id,)
            rows = self._connection().execute(sql + " ORDER BY event_id", params).fetchall()
            return [trace_from_row(r, SQLITE) for r in rows]

        return await self._run(fetch)

    # -- outcomes -----------------------------------------------------------------------------

    async def apply_outcome(
        self,
        outcome_ref: str,
        outcome_type: OutcomeType,
        multiplier: float,
        actor: Actor,
        now: datetime,
        targets: list[OutcomeTarget] | None,
        retier: Callable[[MemoryEntry], MemoryEntry],
    ) -> tuple[OutcomeRecord, list[MemoryEntry]]:
        return await self._run(
            lambda: self._apply_outcome_sync(outcome_ref, outcome_type, multiplier, actor, now, targets, retier)
        )

    def _apply_outcome_sync(
        self,
        outcome_ref: str,
        outcome_type: OutcomeType,
        multiplier: float,
        actor: Actor,
        now: datetime,
        targets: list[OutcomeTarget] | None,
        retier: Callable[[MemoryEntry], MemoryEntry],
    ) -> tuple[OutcomeRecord, list[MemoryEntry]]:
        from ..core.confidence import apply_outcome

        with self._transaction() as conn:
            # A ref already committed answers first: a retry (a lost reply, a new session that has read nothing, a
            # target forgotten since) gets the stored record, never a refusal.
            existing = run_sqlite(conn, outcome_records(SQLITE, "WHERE o.outcome_ref = ?", (outcome_ref,)))
            if existing:
                return already_applied(existing[0]), []
            reads = self._session_reads_sync(conn, actor.session_id)
            # Existence is settled for every target before the first write, so a refusal changes nothing.
            rows: list[tuple[OutcomeTarget, sqlite3.Row]] = []
            if targets is None:
                for target in reads:
                    row = self._live_current_row(conn, target.entity_path, target.key, now)
                    if row is not None:
                        rows.append((target, row))
            else:
                read_versions = {(t.entity_path, t.key): t.version_read for t in reads}
                for target in targets:
                    row = self._live_current_row(conn, target.entity_path, target.key, now)
                    if row is None:
                        raise missing_causal_entry(target.entity_path, target.key)
                    if target.version_read is None:
                        target = OutcomeTarget(
                            target.entity_path, target.key, read_versions.get((target.entity_path, target.key))
                        )
                    rows.append((target, row))
            if not rows:
                raise nothing_read(actor.session_id)
            conn.execute(
                SQLITE.insert("outcomes", OUTCOME_COLUMNS),
                outcome_params(outcome_ref, outcome_type, multiplier, now, actor.agent_id, actor.session_id, SQLITE),
            )
            effects: list[OutcomeEffect] = []
            updated: list[MemoryEntry] = []
            for target, row in rows:
                before = row["confidence"]
                after = apply_outcome(before, multiplier)
                entry = retier(_row_to_entry(row, with_embedding=False).with_changes(confidence=after, outcome_count=row["outcome_count"] + 1))
                conn.execute(
                    "UPDATE entries SET confidence = ?, outcome_count = ?, tier = ?, priority_score = ? WHERE row_id = ?",
                    (after, entry.outcome_count, int(entry.tier), entry.priority_score, row["row_id"]),
                )
                effects.append(
                    OutcomeEffect(target.entity_path, target.key, target.version_read, row["version"], before, after)
                )
                updated.append(entry)
            conn.executemany(SQLITE.insert("outcome_effects", EFFECT_COLUMNS), effect_params(outcome_ref, effects))
        record = OutcomeRecord(outcome_ref, outcome_type, multiplier, now, actor.agent_id, actor.session_id, tuple(effects))
        return record, updated

    @staticmethod
    def _live_current_row(conn: sqlite3.Connection, entity_path: str, key: str, now: datetime) -> sqlite3.Row | None:
        # Without the value: an outcome changes confidence and tier only, and parsing a 1 MiB value per charged
        # entry inside the transaction held the store 3.3 s for 100 of them (red-team finding, 0.7.10).
        row: sqlite3.Row | None = conn.execute(
            f"SELECT {ENTRY_COLUMNS_WITHOUT_VALUES} FROM entries WHERE entity_path = ? AND key = ? AND is_current = 1 "
            "AND (ttl_at IS NULL OR ttl_at > ?)",
            (entity_path, key, _ts(now)),
        ).fetchone()
        return row

    async def outcome_records(
        self, entity_path: str | None = None, *, key: str | None = None, newest_first: bool = False, offset: int = 0,
        limit: int | None = None,
    ) -> list[OutcomeRecord]:
        where, params = outcome_filter(SQLITE, entity_path, key)
        return await self._run(lambda: run_sqlite(self._connection(), outcome_records(
            SQLITE, where, params, newest_first=newest_first, offset=offset, limit=limit)))

    async def count_outcomes(self, entity_path: str | None = None, *, key: str | None = None) -> int:
        where, params = outcome_filter(SQLITE, entity_path, key)
        return await self._run(lambda: run_sqlite(self._connection(), count_outcomes(where, params)))

    # -- retrieval candidates -----------------------------------------------------------------

    async def keyword_candidates(
        self, terms: list[str], flt: EntryFilter, now: datetime, limit: int, *, values: bool = True,
        value_head: int | None = None,
    ) -> list[tuple[MemoryEntry, float]]:
        """Entries matching ANY word (OR), ranked as PostgreSQL's adapter ranks them: the summed IDF of the words an
        entry holds, `ln(1 + (N - df + 0.5) / (df + 0.5))`, df counted within the filter's scope, N the index's
        row count (or the matches, if more). The score is that sum over the sum of every word's IDF: the share of
        the query's word weight the entry matches. Not FTS5's bm25(): on both retrieval sets its term-frequency
        and length terms ranked worse (docs/retrieval-record.md), and both stores now rank alike."""
        phrases = match_words(terms)[:MAX_KEYWORD_PHRASES]
        if not phrases or limit <= 0:
            return []
        clauses, params = self._filter_sql(flt, now, column_prefix="e.")
        hits_sql = (
            "SELECT e.row_id, e.written_at FROM entries_fts JOIN entries e ON e.row_id = entries_fts.rowid "
            f"WHERE entries_fts MATCH ? AND {' AND '.join(clauses)}"
        )

        def fetch() -> list[tuple[MemoryEntry, float]]:
            conn = self._connection()
            # One read snapshot for the matches and the rows: a row another process deletes in between would be
            # matched but not found (red-team repro: KeyError, "Internal error in amfs_retrieve").
            conn.execute("BEGIN")
            try:
                return search(conn)
            finally:
                conn.execute("COMMIT")

        def search(conn: sqlite3.Connection) -> list[tuple[MemoryEntry, float]]:
            scope = None
            if flt.entity_path is not None and flt == EntryFilter(entity_path=flt.entity_path):
                scope = small_scope_ids(conn, flt.entity_path, fts_row_count(conn))
            written: dict[int, float] = {}
            if scope is None:
                hits = [conn.execute(hits_sql, [phrase, *params]).fetchall() for phrase in phrases]
                matches = [[row_id for row_id, _ in rows] for rows in hits]
                written = {row_id: at for rows in hits for row_id, at in rows}
            else:
                # A small scope: each word's matches as bare FTS rowids within the scope's span, kept when in the
                # scope and live. Joining every match in the store to its row to test its path cost 5 us a match
                # (54 ms for a word in all of 100k entries); the rowids alone 0.2 us.
                assert flt.entity_path is not None
                live = set(scope) - expired_in_scope(conn, flt.entity_path, now)
                span = (min(scope), max(scope)) if scope else (0, -1)
                matches = [[row_id for (row_id,) in conn.execute(_FTS_ROWIDS, (phrase, *span)) if row_id in live]
                           for phrase in phrases]
            matched = {row_id for ids in matches for row_id in ids}
            if not matched:
                return []
            # N: the scope's entries for a scoped retrieval (an entity-limited key's scores must not depend on the
            # rest of the store), the whole index otherwise.
            if scope is not None:
                in_scope = len(scope)
            else:
                in_scope = fts_row_count(conn) if flt.entity_path is None else entries_in_scope(conn, flt.entity_path)
            total = max(in_scope, len(matched))
            weights = [math.log(1 + (total - len(ids) + 0.5) / (len(ids) + 0.5)) for ids in matches]
            scores: dict[int, float] = {}
            for ids, weight in zip(matches, weights):
                for row_id in ids:
                    scores[row_id] = scores.get(row_id, 0.0) + weight
            # Best by score, ties by write time then row id: only the entries scoring at least the limit-th one
            # can place, so only their write times are needed.
            cut = sorted(scores.values(), reverse=True)[min(limit, len(scores)) - 1]
            contenders = [row_id for row_id, score in scores.items() if score >= cut]
            if scope is not None:
                written = dict(select_by_ids(
                    conn, "SELECT row_id, written_at FROM entries WHERE row_id IN (?ids)", contenders))
            best = sorted(contenders, key=lambda row_id: (scores[row_id], written[row_id], row_id), reverse=True)[:limit]
            reference = sum(weights)
            columns = read_columns(values, value_head)
            found = {row["row_id"]: row for row in select_by_ids(
                conn, f"SELECT {columns}, {WORD_COUNT_COLUMNS} FROM entries WHERE row_id IN (?ids)", best)}
            return length_scaled([(_row_to_entry(found[row_id], with_embedding=False), scores[row_id] / reference,
                                   found[row_id]) for row_id in best])

        return await self._run(fetch)

    async def common_terms(self, terms: list[str], max_matches: int, entity_path: str | None = None) -> set[str]:
        scope_sql, scope_params = prefix_clause("e.entity_path", entity_path or "")

        def count() -> set[str]:
            conn = self._connection()
            size = fts_row_count(conn)
            in_scope = size if entity_path is None else entries_in_scope(conn, entity_path)
            if in_scope <= max_matches:
                return set()  # no word can match more entries than the scope (or the store) holds
            small_scope: list[tuple[set[int], int, int]] = []  # its ids and span, read for the first common word

            def matches_in_scope(phrase: str) -> int:
                """A word common in the store counted again within the scope (up to max_matches + 1), so entries
                outside it can neither switch a scoped caller's word off nor tell it they exist."""
                assert entity_path is not None
                if in_scope > scoped_scan_cap(size):  # walks the word's doclist, joined to the rows
                    return int(conn.execute(
                        "SELECT count(*) FROM (SELECT 1 FROM entries_fts JOIN entries e ON e.row_id = entries_fts.rowid "
                        f"WHERE entries_fts MATCH ? AND e.is_current = 1 AND {scope_sql} LIMIT ?)",
                        (phrase, *scope_params, max_matches + 1),
                    ).fetchone()[0])
                if not small_scope:
                    ids = scope_row_ids(conn, entity_path)  # empty only if a writer emptied the scope since
                    small_scope.append((set(ids), min(ids, default=0), max(ids, default=-1)))
                scope, lowest, highest = small_scope[0]
                found = 0  # on the bare FTS rowids within the scope's span (see keyword_candidates)
                for (row_id,) in conn.execute(_FTS_ROWIDS, (phrase, lowest, highest)):
                    found += row_id in scope
                    if found > max_matches:
                        break
                return found

            common = set()
            for term in terms:
                phrase = '"' + term.replace('"', "") + '"'
                # LIMIT lets FTS5 stop walking the term's doclist early: cost is bounded by max_matches.
                matches = conn.execute(
                    "SELECT count(*) FROM (SELECT 1 FROM entries_fts WHERE entries_fts MATCH ? LIMIT ?)",
                    (phrase, max_matches + 1),
                ).fetchone()[0]
                if matches > max_matches and entity_path is not None:
                    matches = matches_in_scope(phrase)
                if matches > max_matches:
                    common.add(term)
            return common

        return await self._run(count)

    async def semantic_candidates(
        self, vector: list[float], flt: EntryFilter, now: datetime, limit: int, *, values: bool = True,
        value_head: int | None = None,
    ) -> list[tuple[MemoryEntry, float]]:
        import numpy as np

        query = np.asarray(vector, dtype=np.float32)
        if limit <= 0 or not np.all(np.isfinite(query)) or not np.any(query):
            return []  # no cosine similarity to a zero / non-finite vector
        clauses, params = self._filter_sql(flt, now)
        columns = read_columns(values, value_head)
        rows_sql = f"SELECT {columns} FROM entries WHERE row_id IN (?ids) AND {' AND '.join(clauses)}"

        def fetch() -> list[tuple[MemoryEntry, float]]:
            conn = self._connection()
            index = self._vectors.sync(conn, dimension=query.shape[0])
            size = len(index)
            if size == 0:
                return []
            if flt.entity_path is not None:
                conn.execute("BEGIN")  # one read snapshot for the scope's ids and its rows
                try:
                    scanned = scan_scope(conn, index, size)
                finally:
                    conn.execute("COMMIT")
                if scanned is not None:
                    return scanned
            # Stale ids (superseded, forgotten, filtered out) are dropped by SQL; widen the ANN pool until
            # enough survive or the pool covers the whole index.
            pool = min(size, max(limit + limit // 2, 64))
            while True:
                hits = index.search(query, pool)
                similarity = dict(hits)
                rows = select_by_ids(conn, rows_sql, [*similarity], params)
                if len(rows) >= limit or pool >= size:
                    break
                pool = min(size, pool * 4)
            return ranked(rows, similarity)

        def scan_scope(conn: sqlite3.Connection, index: VectorIndex, size: int) -> list[tuple[MemoryEntry, float]] | None:
            """The scope's entries scanned exactly, or None when it holds too many of the index's for that to pay
            (decided on the key index before any row is read)."""
            assert flt.entity_path is not None
            ids = small_scope_ids(conn, flt.entity_path, size)
            if ids is None:
                return None
            # The whole scope ranked (ids without a vector are not in the index and drop out), then its rows read
            # best first with the filter's every clause (TTL, type, event time) until `limit` pass: those are the
            # answer, as every entry further down ranks below them. Each read takes the ids tied with its last.
            order = index.search_among(query, ids, len(ids))
            similarity = dict(order)
            rows: list[sqlite3.Row] = []
            read, want = 0, limit
            while read < len(order) and len(rows) < limit:
                end = min(len(order), read + want)
                while end < len(order) and order[end][1] == order[end - 1][1]:
                    end += 1
                batch = [row_id for row_id, _ in order[read:end]]
                rows += select_by_ids(conn, rows_sql, batch, params)
                read, want = end, want * 4
            return ranked(rows, similarity)

        def ranked(rows: list[sqlite3.Row], similarity: dict[int, float]) -> list[tuple[MemoryEntry, float]]:
            best = sorted(
                rows, key=lambda row: (similarity[row["row_id"]], row["written_at"], row["row_id"]), reverse=True
            )[:limit]
            return [(_row_to_entry(row, with_embedding=False), similarity[row["row_id"]]) for row in best]

        return await self._run(fetch)

    async def entry_values(
        self, entries: Sequence[MemoryEntry], *, value_head: int | None = None
    ) -> dict[tuple[str, str, int], Any]:
        versions = [(e.entity_path, e.key, e.version) for e in entries]
        if not versions:
            return {}

        def fetch() -> dict[tuple[str, str, int], Any]:
            rows = self._connection().execute(  # one lookup per version, as in passage_vectors
                f"WITH wanted (entity_path, key, version) AS (VALUES {', '.join(['(?, ?, ?)'] * len(versions))}) "
                f"SELECT e.entity_path, e.key, e.version, {value_columns(value_head, 'e.')} FROM wanted "
                "CROSS JOIN entries e "
                "ON e.entity_path = wanted.entity_path AND e.key = wanted.key AND e.version = wanted.version",
                [part for version in versions for part in version],
            ).fetchall()
            return {(row["entity_path"], row["key"], row["version"]): value_from_row(row) for row in rows}

        return await self._run(fetch)

    async def passage_vectors(self, entries: Sequence[MemoryEntry]) -> dict[str, Any]:
        versions = [(e.entity_path, e.key, e.version) for e in entries]
        if not versions:
            return {}

        def fetch() -> dict[str, Any]:
            # A join from the wanted versions (CROSS JOIN keeps that order), so each is one lookup in the
            # (entity_path, key, version) index; `(...) IN (VALUES ...)` would scan the table.
            rows = self._connection().execute(
                f"WITH wanted (entity_path, key, version) AS (VALUES {', '.join(['(?, ?, ?)'] * len(versions))}) "
                "SELECT e.entity_path, e.key, e.passage_embeddings, length(e.embedding) / 4 FROM wanted "
                "CROSS JOIN entries e ON e.entity_path = wanted.entity_path AND e.key = wanted.key "
                "AND e.version = wanted.version WHERE e.passage_embeddings IS NOT NULL",
                [part for version in versions for part in version],
            ).fetchall()
            return {entry_key(row[0], row[1]): SQLITE.passages_array(row[2], row[3]) for row in rows}

        return await self._run(fetch)

    # -- maintenance --------------------------------------------------------------------------

    async def forget(self, entity_path: str, key: str) -> int:
        def delete() -> int:
            # The index lock from before the delete until its vectors are scrubbed and the marker cleared, so a
            # process opening meanwhile never takes this forget for one a stopped process left unfinished.
            with self._vectors.locked():
                with self._transaction() as conn:
                    removed, erased = self._erase_keys_sync(conn, [(entity_path, key)])
                self._after_erase(removed, erased)
            return removed

        return await self._run(delete)

    async def purge_expired(self, now: datetime) -> int:
        def delete() -> int:
            with self._vectors.locked():  # as in forget
                with self._transaction() as conn:
                    expired = conn.execute(
                        "SELECT entity_path, key FROM entries WHERE is_current = 1 AND ttl_at IS NOT NULL AND ttl_at <= ?",
                        (_ts(now),),
                    ).fetchall()
                    removed, erased = self._erase_keys_sync(conn, [(row[0], row[1]) for row in expired])
                    superseded = conn.execute(
                        "SELECT row_id, embedding, entity_path, key FROM entries "
                        "WHERE is_current = 0 AND ttl_at IS NOT NULL AND ttl_at <= ?",
                        (_ts(now),),
                    ).fetchall()
                    removed += self._erase_versions_sync(conn, superseded)
                    erased += [(row[0], row[1]) for row in superseded]
                self._after_erase(removed, erased)
            return removed

        return await self._run(delete)

    @staticmethod
    def _erase_keys_sync(
        conn: sqlite3.Connection, pairs: list[tuple[str, str]]
    ) -> tuple[int, list[tuple[int, bytes | None]]]:
        """Delete every version of each (entity_path, key), with its keyword-index row, its traces and its
        outcome effects (an outcome left without effects goes too). Returns the versions removed and
        their (row id, embedding) pairs, for the vector index. secure_delete zeroes the rows; 'optimize' rewrites the
        FTS5 segments, which would otherwise keep the deleted terms until a merge."""
        removed = 0
        erased: list[tuple[int, bytes | None]] = []
        for entity_path, key in pairs:
            where, pair = "entity_path = ? AND key = ?", (entity_path, key)
            rows = conn.execute(f"SELECT row_id, embedding FROM entries WHERE {where}", pair).fetchall()
            if not rows:
                continue
            delete_by_ids(conn, "DELETE FROM entries_fts WHERE rowid IN (?ids)", [row[0] for row in rows])
            removed += conn.execute(f"DELETE FROM entries WHERE {where}", pair).rowcount
            conn.execute(f"DELETE FROM trace_events WHERE {where}", pair)
            conn.execute(f"DELETE FROM outcome_effects WHERE {where}", pair)
            erased += [(row[0], row[1]) for row in rows]
            SQLiteStore._strip_lent_passages_sync(conn, entity_path, key)
        if removed:
            conn.execute("DELETE FROM outcomes WHERE outcome_ref NOT IN (SELECT outcome_ref FROM outcome_effects)")
            conn.execute("INSERT INTO entries_fts (entries_fts) VALUES ('optimize')")
            _mark_scrub_pending(conn)
        return removed, erased

    @staticmethod
    def _erase_versions_sync(conn: sqlite3.Connection, rows: list[sqlite3.Row]) -> int:
        """Delete single superseded versions (row_id, embedding, entity_path, key) whose own TTL passed; the key's
        other versions, traces and outcome effects stay. The context passages the key lent may hold the erased
        version's text, so they go as on a forget."""
        if not rows:
            return 0
        ids = [row[0] for row in rows]
        delete_by_ids(conn, "DELETE FROM entries_fts WHERE rowid IN (?ids)", ids)
        removed = delete_by_ids(conn, "DELETE FROM entries WHERE row_id IN (?ids)", ids)
        for entity_path, key in {(row[2], row[3]) for row in rows}:
            SQLiteStore._strip_lent_passages_sync(conn, entity_path, key)
        conn.execute("INSERT INTO entries_fts (entries_fts) VALUES ('optimize')")
        _mark_scrub_pending(conn)
        return removed

    @staticmethod
    def _strip_lent_passages_sync(conn: sqlite3.Connection, entity_path: str, key: str) -> None:
        """Passages made with this key's text (the next turns' context passages, the last row) go; their own stay,
        none when one row would be left (a one-passage entry keeps none). As PostgreSQL's."""
        conn.execute(
            "UPDATE entries SET context_key = NULL, passage_embeddings = CASE "
            "WHEN length(passage_embeddings) <= 2 * length(embedding) THEN NULL "
            "ELSE substr(passage_embeddings, 1, length(passage_embeddings) - length(embedding)) END "
            "WHERE entity_path = ? AND context_key = ?", (entity_path, key),
        )

    def _after_erase(self, removed: int, erased: list[tuple[int, bytes | None]]) -> None:
        if not removed:
            return
        self._checkpoint()
        conn = self._connection()
        with self._vectors.locked():  # the marker goes with the scrub: an opener waiting on the lock sees neither
            self._vectors.forget(conn, [row_id for row_id, _ in erased],
                                 [SQLITE.embedding_value(blob) for _, blob in erased])
            _clear_scrub_pending(conn)

    async def open(self, *, reembedding: bool = False) -> None:  # vectors of any width: nothing to allow
        await super().open()
        await self._run(self._finish_interrupted_scrub)
        await self._run(self._vectors.remove_stale_temporaries)
        await self._run(self._count_words_of_older_rows)

    def _count_words_of_older_rows(self) -> None:
        """Give the rows without a word count (written before schema 7, or by an older process since) theirs, a
        batch a transaction; until then a keyword search counts theirs at read."""
        conn = self._connection()
        waiting = conn.execute("SELECT count(*) FROM entries WHERE distinct_words IS NULL").fetchone()[0]
        if waiting == 0:
            return
        log.warning("Counting the words of %d entries written before amfs-server 0.7.13 (once)", waiting)
        while True:
            with self._transaction() as conn:
                rows = conn.execute("SELECT row_id, search_text FROM entries WHERE distinct_words IS NULL "
                                    "ORDER BY row_id LIMIT ?", (WORD_COUNT_BATCH,)).fetchall()
                conn.executemany("UPDATE entries SET distinct_words = ? WHERE row_id = ?",
                                 [(distinct_words(text), row_id) for row_id, text in rows])
            if len(rows) < WORD_COUNT_BATCH:
                return

    def _finish_interrupted_scrub(self) -> None:
        """A process stopped between deleting rows and scrubbing their vectors from the index file: scrub now."""
        conn = self._connection()
        if conn.execute("SELECT 1 FROM meta WHERE name = ?", (VECTOR_SCRUB_META,)).fetchone() is None:
            return
        # A process forgetting right now holds the lock until its scrub is done and its marker cleared: the
        # marker still there once the lock is ours is one a stopped process left (red-team: the warning showed
        # in ordinary concurrent use).
        with self._vectors.locked():
            if conn.execute("SELECT 1 FROM meta WHERE name = ?", (VECTOR_SCRUB_META,)).fetchone() is None:
                return
            log.warning("Scrubbing vectors of deleted memories from %s (a process stopped before it did)",
                        self._vectors.path)
            self._vectors.scrub_dead(conn)
            self._checkpoint()
            _clear_scrub_pending(conn)

    async def clear(self) -> None:
        def delete() -> None:
            with self._transaction() as conn:
                self._delete_all_sync(conn)
                _mark_scrub_pending(conn)
            self._checkpoint(vacuum=True)
            with self._vectors.locked():
                self._vectors.wipe()
                _clear_scrub_pending(self._connection())

        await self._run(delete)

    @staticmethod
    def _delete_all_sync(conn: sqlite3.Connection) -> None:
        for table in ("entries_fts", "outcome_effects", "outcomes", "trace_events", "entries", "meta"):
            conn.execute(f"DELETE FROM {table}")
        conn.execute("INSERT INTO entries_fts (entries_fts) VALUES ('optimize')")

    async def export_snapshot(self) -> StoreSnapshot:
        def fetch() -> StoreSnapshot:
            conn = self._connection()
            conn.execute("BEGIN")  # one consistent read snapshot across tables
            try:
                return run_sqlite(conn, export_store(SQLITE, hidden_meta=_UNEXPORTED_META))
            finally:
                conn.execute("COMMIT")

        return await self._run(fetch)

    async def import_snapshot(self, snapshot: StoreSnapshot, *, replacing: StoreSnapshot | None = None) -> None:
        def write() -> None:
            with self._transaction() as conn:  # BEGIN IMMEDIATE: no other writer until it commits
                if replacing is not None:
                    if run_sqlite(conn, export_store(SQLITE, hidden_meta=_UNEXPORTED_META)) != replacing:
                        raise ConflictError(STORE_CHANGED)
                    self._delete_all_sync(conn)
                top = conn.execute("SELECT COALESCE(MAX(row_id), 0) FROM entries").fetchone()[0]
                run_sqlite(conn, import_store(snapshot, SQLITE))
                # Row ids only grow (AUTOINCREMENT): the imported current versions are the current rows above `top`.
                conn.execute(
                    "INSERT INTO entries_fts (rowid, search_text) SELECT row_id, search_text FROM entries "
                    "WHERE row_id > ? AND is_current = 1",
                    (top,),
                )
            if replacing is not None:
                self._checkpoint(vacuum=True)
                self._vectors.wipe()  # its rows are gone; rebuilt from the table below
            self._vectors.dirty = True

        await self._run(write)

    async def get_meta(self, name: str) -> Any | None:
        def fetch() -> Any | None:
            row = self._connection().execute("SELECT value_json FROM meta WHERE name = ?", (name,)).fetchone()
            return None if row is None else json.loads(row[0])

        return await self._run(fetch)

    async def set_meta(self, name: str, value: Any | None) -> None:
        def write() -> None:
            with self._transaction() as conn:
                if value is None:
                    conn.execute("DELETE FROM meta WHERE name = ?", (name,))
                else:
                    conn.execute(_UPSERT_META, (name, json.dumps(value)))

        await self._run(write)

    async def update_meta(
        self, names: Sequence[str], change: Callable[[dict[str, Any | None]], Mapping[str, Any | None]]
    ) -> None:
        def update() -> None:
            with self._transaction() as conn:  # BEGIN IMMEDIATE: the write lock is held from the first read
                held = {}
                for name in names:
                    row = conn.execute("SELECT value_json FROM meta WHERE name = ?", (name,)).fetchone()
                    held[name] = None if row is None else json.loads(row[0])
                for name, value in change(held).items():
                    if value is None:
                        conn.execute("DELETE FROM meta WHERE name = ?", (name,))
                    else:
                        conn.execute(_UPSERT_META, (name, json.dumps(value)))

        await self._run(update)


VECTOR_INDEX_META = "vector_index"
"""Meta row naming the generation of the index files last saved with this database (not exported)."""
VECTOR_SCRUB_META = "vector_scrub_pending"
"""Meta row set in the transaction that deletes rows with vectors, removed once the index file is scrubbed of them:
a crash in between leaves it, and the next open scrubs the file (its checksum still matches, so nothing else would
notice the forgotten vectors in it). Not exported."""
_UNEXPORTED_META = (VECTOR_INDEX_META, VECTOR_SCRUB_META, IMPORT_PENDING_META)  # this database's own state


def _file_sha256(path: Path) -> str | None:
    try:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except FileNotFoundError:
        return None


class VectorSync:
    """Keeps the in-process ANN index in step with the entries table, across processes.

    The index holds current versions' embeddings keyed by row id. Row ids only grow (AUTOINCREMENT),
    so a watermark (the highest row id indexed) says what is new; `PRAGMA data_version` tells when
    another connection has committed. Ids that stopped being current are filtered out by the query
    that fetches candidates, and pruned here when their successor is indexed.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.meta_path = path.with_suffix(".json")
        self.lock_path = path.with_suffix(".lock")
        self.index: VectorIndex | None = None
        self.watermark = 0
        self.data_version: int | None = None
        self.dirty = True
        self._thread_lock = threading.RLock()
        self._lock_depth = 0
        self._lock_file: Any = None

    @contextmanager
    def locked(self, timeout_s: float = LOCK_WAIT_S) -> Iterator[None]:
        """One process at a time saves, scrubs, loads or deletes the index files (an exclusive `flock` on
        `amfs.vectors.lock`; re-entrant within the process). Without it two processes saving at once could pair
        one's index file with the other's sidecar, or reload the other's file under their own watermark and save
        it back trusted but missing rows (red-team repro: memories never found semantically again). A holder
        that never lets go is a StoreError after a bounded wait, naming the file."""
        with self._thread_lock:
            if self._lock_depth == 0:
                self._lock_file = acquire_exclusive(self.lock_path, "the vector index files", timeout_s)
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
                if self._lock_depth == 0 and self._lock_file is not None:
                    self._lock_file.close()  # closing releases the flock
                    self._lock_file = None

    def sync(self, conn: sqlite3.Connection, dimension: int) -> VectorIndex:
        data_version = conn.execute("PRAGMA data_version").fetchone()[0]
        if self.index is None or self.index.dimension != dimension:
            self._load(conn, dimension)
        elif not self.dirty and data_version == self.data_version:
            return self.index
        assert self.index is not None
        conn.execute("BEGIN")
        try:
            top = conn.execute("SELECT COALESCE(MAX(row_id), 0) FROM entries").fetchone()[0]
            new_rows = conn.execute(
                "SELECT row_id, embedding FROM entries WHERE row_id > ? AND row_id <= ? AND is_current = 1 "
                "AND embedding IS NOT NULL",
                (self.watermark, top),
            ).fetchall()
            superseded = conn.execute(
                "SELECT old.row_id FROM entries new JOIN entries old ON old.entity_path = new.entity_path "
                "AND old.key = new.key AND old.version < new.version WHERE new.row_id > ? AND new.row_id <= ?",
                (self.watermark, top),
            ).fetchall()
        finally:
            conn.execute("COMMIT")
        if superseded:
            self.index.remove([row[0] for row in superseded])
        if new_rows:
            import numpy as np

            vectors = np.stack([np.frombuffer(row[1], dtype=np.float32) for row in new_rows])
            self.index.add([row[0] for row in new_rows], vectors)
        self.watermark = top
        self.data_version = data_version
        self.dirty = False
        return self.index

    def _load(self, conn: sqlite3.Connection, dimension: int) -> None:
        with self.locked():  # the file and its sidecar as one process saved them together
            self.watermark = 0
            # Checked before the file is loaded: a native loader given a damaged file may abort the process
            # rather than raise (usearch 2.23 did on files it had written itself; red-team finding, 0.7.11).
            saved, reason = self._verified_state(conn, dimension) if self.path.exists() else (None, "")
            if saved is None:
                if reason:
                    log.warning("Rebuilding the vector index %s from the database: %s", self.path, reason)
                self.index = VectorIndex(dimension, self.path)
                self.index.dirty = True  # saved even if the database has no vectors: the file it replaces goes
                return
            self.index = VectorIndex.open(dimension, self.path)
            if self.index.load_error is None and len(self.index):
                self.watermark = saved
            else:
                self.index.clear()

    def _verified_state(self, conn: sqlite3.Connection, dimension: int) -> tuple[int | None, str]:
        """The saved watermark when the index file is the one last saved beside this database, else why not.

        The sidecar holds the file's checksum and a generation id that is also written into the
        database's meta table: a damaged file, or a database restored from an older copy next to newer
        index files, fails one of the checks (and would otherwise serve stale or missing hits).
        """
        try:
            saved = json.loads(self.meta_path.read_text())
            watermark, generation, digest = int(saved["watermark"]), saved["generation"], saved["sha256"]
        except FileNotFoundError:
            return None, f"{self.meta_path.name} is missing"
        except (ValueError, KeyError, TypeError, OSError) as error:
            return None, f"{self.meta_path.name} is unreadable or from an older version ({error!r})"
        if saved.get("dimension") != dimension:
            return None, f"it was built for dimension {saved.get('dimension')}, the embedder gives {dimension}"
        if _file_sha256(self.path) != digest:
            return None, "the file's checksum does not match the one saved with it (the file was damaged or replaced)"
        row = conn.execute("SELECT value_json FROM meta WHERE name = ?", (VECTOR_INDEX_META,)).fetchone()
        in_database = json.loads(row[0]) if row is not None else {}
        if in_database.get("generation") != generation:
            return None, "the database and the index were not saved together (a database restored from another copy?)"
        # The highest row id ever given (AUTOINCREMENT's counter): forgetting the newest rows lowers MAX(row_id)
        # but not this, so only a database older than the index (restored from a copy) fails the check.
        top = conn.execute(
            "SELECT max(COALESCE((SELECT MAX(row_id) FROM entries), 0), "
            "COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'entries'), 0))"
        ).fetchone()[0]
        if watermark > top:
            return None, f"the index covers rows up to {watermark}, the database ends at {top}"
        return watermark, ""

    def save(self, conn: sqlite3.Connection) -> None:
        """Persist the index when it changed. Ids whose rows are no longer current (another process
        forgot or superseded them since this one synced) are dropped first and their vectors scrubbed
        from the file, so a save never writes a forgotten vector back."""
        if self.index is None or not self.index.dirty:
            return
        with self.locked():
            self.index.save_scrubbed(self._drop_dead(conn))
            self._save_meta(conn)

    def _drop_dead(self, conn: sqlite3.Connection) -> list[Any]:
        """Remove the ids whose rows are no longer current (another process forgot, expired, cleared or
        superseded them since this one synced); returns their vectors, for the file to be scrubbed of them."""
        assert self.index is not None
        live = {row[0] for row in conn.execute("SELECT row_id FROM entries WHERE is_current = 1")}
        gone = [i for i in self.index.ids().tolist() if i not in live]
        vectors = [self.index.get(i) for i in gone]
        self.index.remove(gone)
        return [v for v in vectors if v is not None]

    def _save_meta(self, conn: sqlite3.Connection) -> None:
        """The sidecar (watermark, checksum, generation) and the same generation in the database's meta."""
        assert self.index is not None
        generation = uuid.uuid4().hex
        temporary = self.meta_path.with_name(f".{self.meta_path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        temporary.write_text(json.dumps({
            "watermark": self.watermark, "dimension": self.index.dimension, "generation": generation,
            "sha256": _file_sha256(self.path),
        }))
        os.replace(temporary, self.meta_path)
        try:
            conn.execute(
                _UPSERT_META,
                (VECTOR_INDEX_META, json.dumps({"generation": generation, "watermark": self.watermark})),
            )
        except sqlite3.Error as error:  # the next start rebuilds the index; closing must not fail for it
            log.warning("Could not record the vector index generation in %s: %s", self.path, error)

    def reset(self) -> None:
        if self.index is not None:
            self.index.clear()
        self.watermark = 0
        self.dirty = True

    def forget(self, conn: sqlite3.Connection, row_ids: list[int], vectors: list[list[float] | None]) -> None:
        """Take these vectors (of deleted rows) out of the index and out of its file. The index is loaded
        from the file first when this process has not used it yet; a file that cannot be read (or
        whose dimension is unknown) is deleted, to be rebuilt from the store on the next search."""
        import numpy as np

        wanted = [np.asarray(v, dtype=np.float32) for v in vectors if v is not None]
        if wanted:
            self._scrub(conn, len(wanted[0]), row_ids, wanted)

    def scrub_dead(self, conn: sqlite3.Connection) -> None:
        """Rewrite the index file without the vectors of rows that are no longer current (or delete it when it
        cannot be read), as a forget does."""
        dimension = self._saved_dimension()
        if dimension is None:
            self.wipe()
        else:
            self._scrub(conn, dimension, [], [])

    def _scrub(self, conn: sqlite3.Connection, dimension: int, row_ids: list[int], wanted: list[Any]) -> None:
        with self.locked():
            self._scrub_locked(conn, dimension, row_ids, wanted)

    def _scrub_locked(self, conn: sqlite3.Connection, dimension: int, row_ids: list[int], wanted: list[Any]) -> None:
        if self.index is None or self.index.dimension != dimension:
            if self._saved_dimension() != dimension:
                self.wipe()
                return
            self._load(conn, dimension)
        assert self.index is not None
        self.index.remove(row_ids)
        if self.index.load_error is not None:
            self.wipe()
            return
        # What other processes deleted since this one synced goes too: the file is rewritten from this index.
        self.index.save_scrubbed(wanted + self._drop_dead(conn))
        self._save_meta(conn)

    def wipe(self) -> None:
        """Forget the index and delete its files (after `clear`): the next search rebuilds it from the store."""
        with self.locked():
            self.index = None
            self.watermark = 0
            self.data_version = None
            self.dirty = True
            for path in (self.path, self.meta_path):
                path.unlink(missing_ok=True)

    def remove_stale_temporaries(self) -> None:
        """Delete the temporary files a process killed while saving left beside the index files: a copy of the
        whole index, vectors of memories forgotten since included, that nothing else would remove (red-team
        finding, 0.7.13). Every save holds the lock, so once it is ours such a file is no one's."""
        if not self._temporaries():
            return
        try:
            with self.locked(timeout_s=0):
                for path in self._temporaries():
                    log.warning("Removing %s, left by a process stopped while saving the vector index", path)
                    path.unlink(missing_ok=True)
        except StoreError:
            return  # another process is saving (its temporary is its own): the next open looks again

    def _temporaries(self) -> list[Path]:
        # The names VectorIndex.save and _save_meta give their temporary files: ".<name>.<pid>.<thread>.tmp".
        return [path for name in (self.path.name, self.meta_path.name)
                for path in self.path.parent.glob(f".{glob.escape(name)}.*.tmp")]

    def _saved_dimension(self) -> int | None:
        try:
            return int(json.loads(self.meta_path.read_text())["dimension"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
