"""The PostgreSQL store (asyncpg + pgvector): the shared store for teams and for several server processes.

Selected by `AMFS_POSTGRES_DSN` (a postgresql:// URL); SQLite stays the default when it is unset.

Layout and semantics mirror `adapters/sqlite.py` (the reference): every version of every key is a row
of `entries` (copy-on-write, `is_current` marks the newest, a partial unique index guards it), plus
`outcomes` / `outcome_effects`, `trace_events` and `meta`. Differences that are PostgreSQL's own:

* Schema: every table lives in one PostgreSQL schema, `amfs` unless told otherwise. The schema is the
  constructor's `schema` argument, else the DSN's own search path, in libpq's standard spelling
  `postgresql://host/db?options=-csearch_path%3Dmy_schema` (or asyncpg's `?search_path=my_schema`):
  its first entry names the schema. Pool connections get `search_path = <schema>, <pgvector's schema>`.
* Start-up: `open()` creates the pgvector extension when missing (or says what to install), creates
  the schema and applies the versioned `MIGRATIONS`, all inside one transaction holding
  `pg_advisory_xact_lock`, so several processes starting at once are safe.
* Concurrency: every transaction that changes a key's rows first takes
  `pg_advisory_xact_lock(hashtext(schema), hashtext(entity_path || '/' || key))` for each key it
  touches (in hash order, so two transactions never wait on each other crosswise). Concurrent writers
  to one key therefore serialise: versions 1..n with no gap and no duplicate (the unique constraint on
  (entity_path, key, version) is the backstop). Outcomes take the same locks and `SELECT ... FOR UPDATE`
  the current row, so two outcomes on one entry both apply. An outcome_ref is claimed with
  `INSERT ... ON CONFLICT DO NOTHING` on the outcomes primary key: a concurrent second commit of the
  same ref waits for the first, finds the conflict and returns the stored record (`already_applied`).
  Deadlocks and serialisation failures (which the lock order should prevent) are retried.
* Search: `search_tsv` is a stored generated tsvector over `search_text` with a GIN index; keyword
  queries OR their terms (`to_tsquery('english', 'a | b')`), ranked by the summed IDF of the terms an entry
  matches (`ts_rank_cd` weighs every term alike, so common words outvoted rare ones). Embeddings are
  `vector(<dimension>)` with a partial HNSW cosine index on current rows; filtered searches raise
  `hnsw.ef_search` and use pgvector 0.8's `hnsw.iterative_scan = relaxed_order` (then re-sort exactly).
* Values keep their exact JSON text (`value_json`): jsonb would reorder object keys.
* Text columns that are sorted (`entity_path`, `key`, `meta.name`) use `COLLATE "C"` (byte order),
  the order SQLite's BINARY collation gives, whatever the database's locale.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from ..core.embedding import CHAT_MINILM, EMBEDDER_META, keep_or_reembed
from ..core.errors import ConflictError, StoreError, ValidationError
from ..core.models import (
    AMFS_VERSION,
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
from ..core.ports import (
    IMPORT_PENDING_META,
    OutcomeTarget,
    StoreSnapshot,
    TierUpdate,
    missing_causal_entry,
    nothing_read,
    vector_width,
)
from ..core.retrieval import distinct_words, query_word_part_pattern, query_word_pattern
from .postgres_base import (
    CONNECT_TIMEOUT_S,
    DEFAULT_SCHEMA as DEFAULT_SCHEMA,
    MIGRATION_LOCK_KEY,
    PostgresDatabase,
    logger,
    quote_ident,
    redact_dsn as redact_dsn,
    rowcount,
    schema_from_dsn as schema_from_dsn,
    vacuum,
)
from .sql_common import (
    EFFECT_COLUMNS,
    ENTRY_BASE_COLUMNS,
    ENTRY_COLUMNS,
    ENTRY_COLUMNS_WITHOUT_VALUES,
    ENTRY_INSERT_COLUMNS,
    OUTCOME_COLUMNS,
    STORE_CHANGED,
    POSTGRES,
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
    latest_versions,
    length_scaled,
    outcome_filter,
    outcome_params,
    outcome_records,
    read_columns,
    run_postgres,
    sort_sql,
    trace_from_row,
    trace_params,
    upsert_meta_sql,
    value_columns,
    value_from_row,
)

VECTOR_EXTENSION = "vector"
INSTALL_HINT = "run scripts/ensure_postgres.sh or install pgvector: https://github.com/pgvector/pgvector#installation"
HNSW_EF_SEARCH = 100
HNSW_MAX_DIMENSIONS = 2000  # pgvector cannot index `vector` columns wider than this
# The vector width of a new store opened without an embedder (`embedding_dimension=None`: inspection commands,
# `memory import`); while it holds no entry version, an import of vectors of another width gives it theirs.
NO_EMBEDDER_DIMENSION = 384
MAX_QUERY_WORDS = 64
# Planner statistics are refreshed once this many rows were added since the last refresh, and at least this
# share of the table (autovacuum's insert thresholds, acted on at once instead of within its next round).
ANALYZE_MIN_NEW_ROWS = 1000
ANALYZE_GROWTH = 0.2

_NUL_MESSAGE = (
    "PostgreSQL cannot store the NUL character (\\x00) in text; remove it from the agent id, session id, "
    "outcome_ref or meta name."
)

# Each entry is one migration step; the schema version is its 1-based position. `{dim}` is the
# embedding dimension, `{hnsw}` the HNSW index statement (empty when the dimension is too wide).
MIGRATIONS: list[str] = [
    """
    CREATE TABLE entries (
        row_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        entity_path text COLLATE "C" NOT NULL,
        key text COLLATE "C" NOT NULL,
        version integer NOT NULL CHECK (version >= 1),
        is_current boolean NOT NULL,
        value_json text NOT NULL,
        confidence double precision NOT NULL,
        agent_id text NOT NULL,
        session_id text NOT NULL,
        written_at timestamptz NOT NULL,
        outcome_count integer NOT NULL DEFAULT 0,
        recall_count integer NOT NULL DEFAULT 0,
        ttl_at timestamptz,
        memory_type text NOT NULL,
        tier smallint NOT NULL,
        priority_score double precision,
        importance_score double precision,
        importance_dimensions text,
        embedding vector({dim}),
        amfs_version text NOT NULL,
        search_text text NOT NULL DEFAULT '',
        search_tsv tsvector GENERATED ALWAYS AS (to_tsvector('english'::regconfig, search_text)) STORED,
        CONSTRAINT entries_key_version UNIQUE (entity_path, key, version)
    );
    CREATE UNIQUE INDEX entries_current_key ON entries (entity_path, key) WHERE is_current;
    CREATE INDEX entries_current_written ON entries (written_at) WHERE is_current;
    CREATE INDEX entries_current_confidence ON entries (confidence) WHERE is_current;
    CREATE INDEX entries_current_ttl ON entries (ttl_at) WHERE is_current AND ttl_at IS NOT NULL;
    CREATE INDEX entries_search_tsv ON entries USING gin (search_tsv) WHERE is_current;
    {hnsw}
    CREATE TABLE outcomes (
        outcome_ref text PRIMARY KEY,
        seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
        outcome_type text NOT NULL,
        multiplier double precision NOT NULL,
        committed_at timestamptz NOT NULL,
        agent_id text NOT NULL,
        session_id text NOT NULL
    );
    CREATE TABLE outcome_effects (
        outcome_ref text NOT NULL REFERENCES outcomes (outcome_ref) ON DELETE CASCADE,
        position integer NOT NULL,
        entity_path text COLLATE "C" NOT NULL,
        key text COLLATE "C" NOT NULL,
        version_read integer,
        version_updated integer NOT NULL,
        confidence_before double precision NOT NULL,
        confidence_after double precision NOT NULL,
        PRIMARY KEY (outcome_ref, entity_path, key)
    );
    CREATE INDEX outcome_effects_entry ON outcome_effects (entity_path, key);
    CREATE TABLE trace_events (
        event_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session_id text NOT NULL,
        agent_id text NOT NULL,
        kind text NOT NULL,
        entity_path text COLLATE "C" NOT NULL,
        key text COLLATE "C" NOT NULL,
        version integer NOT NULL,
        at timestamptz NOT NULL
    );
    CREATE INDEX trace_events_session ON trace_events (session_id, kind);
    CREATE TABLE meta (name text COLLATE "C" PRIMARY KEY, value_json text NOT NULL);
    """,
    # 2: what a read / retrieve trace keeps (query, strategy ranks), as exact JSON text.
    """
    ALTER TABLE trace_events ADD COLUMN detail text;
    """,
    # 3: every read bumps recall_count, tier and priority_score, none of them indexed: free space on each page
    # lets PostgreSQL update the row in place (a HOT update) instead of inserting it anew into every index,
    # the HNSW graph included. Pages written before this keep filling up; they gain room as rows move off them.
    """
    ALTER TABLE entries SET (fillfactor = 80);
    """,
    # 4: GIN's fast-update pending list is scanned linearly by every keyword query until a vacuum merges it:
    # after a bulk load that made keyword search take up to a second. Entries go straight into the index instead.
    """
    ALTER INDEX entries_search_tsv SET (fastupdate = off);
    SELECT gin_clean_pending_list('entries_search_tsv'::regclass);
    """,
    # 5: when the remembered event happened (MemoryEntry.event_at), NULL for entries written without one.
    """
    ALTER TABLE entries ADD COLUMN event_at timestamptz;
    """,
    # 6: an entry's passage (sentence) embeddings beside their mean (MemoryEntry.passage_embeddings), float32 rows.
    """
    ALTER TABLE entries ADD COLUMN passage_embeddings bytea;
    """,
    # 7: the key whose turn made an entry's context passage (MemoryEntry.context_key); forgetting it strips the row.
    """
    ALTER TABLE entries ADD COLUMN context_key text COLLATE "C";
    """,
    # 8: superseded versions whose own TTL passed, found by the expiry sweep without reading every row.
    """
    CREATE INDEX entries_superseded_ttl ON entries (ttl_at) WHERE NOT is_current AND ttl_at IS NOT NULL;
    """,
    # 9: the distinct words of an entry's search text, counted when it is written, for the keyword length factor;
    # rows written before (or by an older process since) are counted at open, found by the partial index.
    """
    ALTER TABLE entries ADD COLUMN distinct_words integer;
    CREATE INDEX entries_uncounted ON entries (row_id) WHERE distinct_words IS NULL;
    """,
]
WORD_COUNT_MIGRATION = 9
# Rows counted a transaction at a time at open, outside the migration's lock: counting every row in it held every
# other process on the store for the whole time (23 s at 12,000 rows; review finding, 0.7.13).
WORD_COUNT_BATCH = 1_000
SPLIT_WORDS_META = "search_text_words_apart_through"
"""Meta row: the last row id whose search text `_split_words_of_older_rows` has checked (this database's own state)."""


_HNSW_INDEX_NAME = "entries_embedding_hnsw"
_HNSW_INDEX = f"CREATE INDEX {_HNSW_INDEX_NAME} ON entries USING hnsw (embedding vector_cosine_ops) WHERE is_current;"


def _hnsw_index(dimension: int) -> str:
    """The schema's HNSW index statement for vectors of `dimension`, empty when pgvector cannot index them."""
    return _HNSW_INDEX if dimension <= HNSW_MAX_DIMENSIONS else ""


# The width of the `embedding` column (its typmod); $1 is the schema-qualified table.
_WIDTH_SQL = "SELECT a.atttypmod FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attname = 'embedding'"
# What pgvector says when a vector meets a column (or a stored vector) of another width.
_WIDTH_ERROR = re.compile(r"expected (\d+) dimensions, not \d+|different vector dimensions (\d+) and (\d+)")
# What `memory reembed` does to a PostgreSQL store, for the refusal of another width.
_REEMBED_IN_PLACE = (
    "every version and the vector column's width, in place and in one transaction, after writing a backup file; "
    "stop the other servers on this store first"
)

_BASE_COLUMNS = ENTRY_BASE_COLUMNS
_ENTRY_COLUMNS = ENTRY_COLUMNS
_SORT_SQL = sort_sql(POSTGRES)
_INSERT_ENTRY = POSTGRES.insert("entries", ENTRY_INSERT_COLUMNS) + " "
_INSERT_TRACE = POSTGRES.insert("trace_events", TRACE_INSERT_COLUMNS)
_INSERT_EFFECT = POSTGRES.insert("outcome_effects", EFFECT_COLUMNS)
# record_reads: each (entry, version) read gets its count, tier and priority, and each read its trace in order; both
# only where that version is still stored (and, where the read names it, written at the same moment).
_RECORD_READS_SQL = """
WITH settings AS (SELECT set_config('synchronous_commit', 'off', true)),
counted AS (
    UPDATE entries AS e SET recall_count = e.recall_count + r.times, tier = r.tier, priority_score = r.priority
    FROM unnest($1::text[], $2::text[], $3::int[], $4::int[], $5::smallint[], $6::float8[], $7::timestamptz[])
        AS r(entity_path, key, version, times, tier, priority, written_at)
    WHERE e.entity_path = r.entity_path AND e.key = r.key AND e.version = r.version
        AND (r.written_at IS NULL OR e.written_at = r.written_at)
    RETURNING e.entity_path, e.key, e.version
)
INSERT INTO trace_events (session_id, agent_id, kind, entity_path, key, version, at, detail)
SELECT $8, $9, $10, t.entity_path, t.key, t.version, $11, t.detail
FROM unnest($12::text[], $13::text[], $14::int[], $15::text[]) WITH ORDINALITY AS t(entity_path, key, version, detail, n)
JOIN counted ON counted.entity_path = t.entity_path AND counted.key = t.key AND counted.version = t.version
CROSS JOIN settings
ORDER BY t.n
"""
_UPSERT_META = upsert_meta_sql(POSTGRES)


def _row_to_entry(row: Any, with_embedding: bool = True) -> MemoryEntry:
    return entry_from_row(row, POSTGRES, with_embedding)


def _tsquery_pieces(terms: Iterable[str]) -> list[str]:
    """`["Retry policy", "ERR_LEDGER_409"]` -> `["retry", "policy", "err <-> ledger <-> 409"]`.

    Words are split as SQLite's FTS5 tokenizer splits them (underscores belong to the word); PostgreSQL's
    parser splits an identifier at its underscores, so it is searched as the phrase of its parts: ORing the
    parts would match every entry that mentions any one of them. Word characters only, so nothing a user
    types can change the query's structure."""
    pieces: list[str] = []
    for term in terms:
        for token in query_word_pattern().findall(term or ""):
            piece = " <-> ".join(word.lower() for word in query_word_part_pattern().findall(token))
            if piece and piece not in pieces:
                pieces.append(piece)
    return pieces[:MAX_QUERY_WORDS]


def _tsquery_text(terms: Iterable[str]) -> str:
    """The OR of `_tsquery_pieces(terms)`: `retry | policy | (err <-> ledger <-> 409)`."""
    return _or_query(_tsquery_pieces(terms))


def _or_query(pieces: list[str]) -> str:
    return " | ".join(f"({piece})" if " " in piece else piece for piece in pieces)


class _Params:
    """Positional-parameter builder for asyncpg ($1, $2, ...)."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def add(self, value: Any) -> str:
        self.values.append(value)
        return f"${len(self.values)}"


def _scope_range(path_param: str) -> str:
    """The path `path_param` names and everything below it, as a range the (entity_path, key) index answers: the
    columns collate "C", so a path starts with `p/` exactly when it sorts from `p/` up to, not including, `p0`."""
    return (f"(entity_path = {path_param} OR "
            f"(entity_path >= {path_param} || '/' AND entity_path < {path_param} || '0'))")


def _scope_size_sql(path_param: str) -> str:
    """The current entries at the path `path_param` names and below: the keyword IDF's N for a scoped retrieval."""
    return f"SELECT count(*) FROM entries WHERE is_current AND {_scope_range(path_param)}"


def _filter_sql(flt: EntryFilter, now: datetime, params: _Params) -> list[str]:
    clauses = ["is_current", f"(ttl_at IS NULL OR ttl_at > {params.add(now)})"]
    if flt.entity_path is not None:
        p = params.add(flt.entity_path)
        clauses.append(f"(entity_path = {p} OR starts_with(entity_path, {p} || '/'))")
    if flt.memory_type is not None:
        clauses.append(f"memory_type = {params.add(flt.memory_type.value)}")
    if flt.agent_id is not None:
        clauses.append(f"agent_id = {params.add(flt.agent_id)}")
    if flt.since is not None:
        clauses.append(f"written_at >= {params.add(flt.since)}")
    if flt.min_stored_confidence is not None:
        clauses.append(f"confidence >= {params.add(float(flt.min_stored_confidence))}")
    if flt.event_after is not None:
        clauses.append(f"coalesce(event_at, written_at) >= {params.add(flt.event_after)}")
    if flt.event_before is not None:
        clauses.append(f"coalesce(event_at, written_at) <= {params.add(flt.event_before)}")
    return clauses


# Keyword ranking (see `keyword_candidates`): `pieces` are the query's words and identifier phrases as tsqueries
# (stop words give empty ones, which match nothing); `matched` is every entry the OR query matches; each matched
# (entry, piece) pair scores that piece's IDF. N is the table's row estimate, at least the number matched.
_KEYWORD_SQL = """
WITH pieces AS (
    SELECT DISTINCT to_tsquery('english'::regconfig, p) AS piece FROM unnest({pieces}::text[]) AS p
), matched AS MATERIALIZED (
    SELECT row_id, written_at, search_tsv FROM entries, to_tsquery('english'::regconfig, {query}) AS query
    WHERE search_tsv @@ query AND {filters}
), hits AS MATERIALIZED (
    SELECT m.row_id, p.piece FROM matched m JOIN pieces p ON m.search_tsv @@ p.piece
), total AS (
    SELECT greatest({scope_size}, (SELECT count(*) FROM matched), 1) AS n
), idf AS (
    SELECT p.piece, ln(1 + ((SELECT n FROM total) - count(h.row_id) + 0.5) / (count(h.row_id) + 0.5)) AS weight
    FROM pieces p LEFT JOIN hits h USING (piece) WHERE numnode(p.piece) > 0 GROUP BY p.piece
), reference AS (
    SELECT greatest(sum(weight), 1e-6) AS weight FROM idf
), top AS (
    SELECT m.row_id, m.written_at, sum(idf.weight) AS score FROM hits h JOIN idf USING (piece)
    JOIN matched m USING (row_id) GROUP BY m.row_id, m.written_at
    ORDER BY score DESC, m.written_at DESC, m.row_id DESC LIMIT {limit}
)
SELECT {columns}, top.score / (SELECT weight FROM reference) AS score FROM top JOIN entries USING (row_id, written_at)
ORDER BY top.score DESC, top.written_at DESC, top.row_id DESC
"""

# TRUNCATE gives the tables new, empty files and drops the old ones: no dead tuples to vacuum.
_TRUNCATE_ALL = "TRUNCATE outcome_effects, outcomes, trace_events, entries, meta"
# The planner's row count for `entries` (-1 before its first ANALYZE).
_ROW_ESTIMATE_SQL = "SELECT reltuples FROM pg_class WHERE oid = 'entries'::regclass"
TERM_STATS_TTL_S = 10.0
# Element frequencies come from the last ANALYZE; the row count from the live statistics, so a table that grew
# since (a bulk load before autovacuum's next ANALYZE) is not under-counted.
_TERM_STATS_SQL = (
    "SELECT e.lexeme, e.freq * greatest(t.n_live_tup, c.reltuples) AS matches FROM pg_stats s "
    "JOIN pg_class c ON c.oid = to_regclass(quote_ident(s.schemaname) || '.entries') "
    "JOIN pg_stat_user_tables t ON t.relid = c.oid "
    "CROSS JOIN LATERAL unnest(s.most_common_elems::text::text[], s.most_common_elem_freqs) AS e(lexeme, freq) "
    "WHERE s.schemaname = $1 AND s.tablename = 'entries' AND s.attname = 'search_tsv'"
)
# A one-word tsquery renders as 'lexeme' (quoted): strip the quotes to compare with most_common_elems.
LEXEME_CACHE_SIZE = 50_000  # words; about 5 MB, emptied when full
_LEXEME_SQL = (
    "SELECT term, btrim(to_tsquery('english'::regconfig, term)::text, '''') AS lexeme FROM unnest($1::text[]) AS term"
)


class PostgresStore(PostgresDatabase):
    """MemoryStore on PostgreSQL with pgvector; see the module docstring for the design."""

    name = "postgres"
    DESCRIPTION = "PostgreSQL store"
    CONNECT_HINT = "Check AMFS_POSTGRES_DSN and that the server is running (scripts/ensure_postgres.sh starts a local one)."
    NUL_MESSAGE = (
        "PostgreSQL cannot store the NUL character (\\x00) in text; remove it from the agent id, session id, "
        "outcome_ref or meta name."
    )

    def __init__(self, dsn: str, embedding_dimension: int | None = 384, schema: str | None = None) -> None:
        """`embedding_dimension`: the embedder's; None (no embedder) takes the store's own width at open."""
        super().__init__(dsn, schema)
        if embedding_dimension is not None and int(embedding_dimension) < 1:
            raise StoreError(f"embedding_dimension must be >= 1, got {embedding_dimension}")
        self._term_stats: tuple[float, dict[str, float]] | None = None
        # a query word's stemmed form (its lexeme under 'english'): fixed for a word, so asked of the server once
        self._lexemes: dict[str, str] = {}
        self._width_from_store = embedding_dimension is None
        self.embedding_dimension = NO_EMBEDDER_DIMENSION if embedding_dimension is None else int(embedding_dimension)
        self._reembedding = False
        self._vector_schema = "public"
        self._iterative_scan = False
        self._lock_namespace: int | None = None  # hashtext(schema), fetched at open
        self._rows_at_analyze = 0.0  # the table's size when its statistics were last refreshed (estimate)
        self._rows_since_analyze = 0
        self._analyze_task: asyncio.Task[None] | None = None

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def _search_path(self) -> str:
        parts = [quote_ident(self.schema), quote_ident(self._vector_schema)]
        return ", ".join(dict.fromkeys(parts))

    async def _init_connection(self, conn: Any) -> None:
        from pgvector.asyncpg import register_vector

        await register_vector(conn, schema=self._vector_schema)

    async def open(self, *, reembedding: bool = False) -> None:
        """`reembedding`: a store of another vector width opens too, for `reembed`'s export (see `import_snapshot`)."""
        self._reembedding = reembedding
        await super().open()
        await self._count_words_of_older_rows()
        await self._split_words_of_older_rows()

    async def _count_words_of_older_rows(self) -> None:
        """Give the rows without a word count (written before schema 9, or by an older server since) theirs, a batch
        a transaction; rows another process is counting are skipped. Until then a keyword search counts theirs at
        read."""
        async def batch(conn: Any) -> int:
            rows = await conn.fetch(
                "SELECT row_id, search_text FROM entries WHERE distinct_words IS NULL ORDER BY row_id LIMIT $1 "
                "FOR UPDATE SKIP LOCKED", WORD_COUNT_BATCH)
            await conn.execute(
                "UPDATE entries SET distinct_words = u.n FROM unnest($1::bigint[], $2::integer[]) AS u(id, n) "
                "WHERE row_id = u.id", [row["row_id"] for row in rows], [distinct_words(row["search_text"]) for row in rows])
            return len(rows)

        async def uncounted(conn: Any) -> int:
            return int(await conn.fetchval("SELECT count(*) FROM entries WHERE distinct_words IS NULL"))

        if (waiting := await self._tx(uncounted, readonly=True)) == 0:
            return
        logger.warning("Counting the words of %d entries written before amfs-server 0.7.13 (once; other processes "
                       "are not held up)", waiting)
        while await self._tx(batch) == WORD_COUNT_BATCH:
            pass

    async def _split_words_of_older_rows(self) -> None:
        """Rows written before 0.7.15 (or by an older server since) hold PostgreSQL's joined tokens (`v2.3.1`,
        `src/app/main.py`) that no query matches: give each its words apart (`words_apart`), a batch a transaction,
        from the last row checked (`SPLIT_WORDS_META`) on. Only rows whose indexed words change are rewritten (an
        update inserts the row anew into every index, the HNSW graph's included); rows this version wrote are
        skipped unread."""
        async def batch(conn: Any) -> tuple[int, int]:
            after = json.loads(await conn.fetchval("SELECT value_json FROM meta WHERE name = $1", SPLIT_WORDS_META)
                               or "0")
            rows = await conn.fetch(
                "SELECT row_id, CASE WHEN amfs_version <> $3 THEN search_text END AS search_text FROM entries "
                "WHERE row_id > $1 ORDER BY row_id LIMIT $2", after, WORD_COUNT_BATCH, AMFS_VERSION)
            if not rows:
                return 0, 0
            joined = [(row["row_id"], apart) for row in rows if row["search_text"] is not None
                      and (apart := POSTGRES.search_text(row["search_text"])) != row["search_text"]]
            status = "UPDATE 0"
            if joined:
                status = await conn.execute(
                    "UPDATE entries SET search_text = u.text FROM unnest($1::bigint[], $2::text[]) AS u(id, text) "
                    "WHERE row_id = u.id AND search_tsv IS DISTINCT FROM to_tsvector('english'::regconfig, u.text)",
                    [row_id for row_id, _ in joined], [text for _, text in joined])
            await conn.execute(_UPSERT_META, SPLIT_WORDS_META, json.dumps(rows[-1]["row_id"]))
            return len(rows), int(status.split()[-1])

        rewritten = 0
        # One process at a time, the others open at once: every opener used to do the same work (three opening a
        # 20,000-row 0.7.14 store took 19-31 s each; red-team run, 0.7.15). Rows not yet split are still found by
        # meaning and by their other words meanwhile; one left unsplit by a process killed midway is split later.
        # The session lock is held by a connection of its own, closed after: the pool's connections keep no session
        # state (`_keep_session`), so a lock left on one by a failed unlock would never be released.
        import asyncpg

        holder = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT_S)
        try:
            if not await holder.fetchval("SELECT pg_try_advisory_lock(hashtext($1), hashtext('amfs-words-apart'))",
                                         self.schema):
                return
            while True:
                checked, changed = await self._tx(batch)
                rewritten += changed
                if checked < WORD_COUNT_BATCH:
                    break
        finally:
            await holder.close()  # releases the lock
        if rewritten:
            logger.warning("Split the joined words (v2.3.1, a/b.py, x@y.org) of %d entries' search text written "
                           "before amfs-server 0.7.15 (once)", rewritten)

    async def _bootstrap(self, conn: Any) -> None:
        """Extension, schema and migrations, under one advisory lock (safe when processes start at once)."""
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
            await self._ensure_vector_extension(conn)
            await self._create_schema(conn)
            hnsw = _hnsw_index(self.embedding_dimension)
            await self._migrate(
                conn, "schema_migrations", MIGRATIONS,
                lambda script: script.replace("{dim}", str(self.embedding_dimension)).replace("{hnsw}", hnsw),
            )
            self._lock_namespace = await conn.fetchval("SELECT hashtext($1)", self.schema)
            self._rows_at_analyze = max(0.0, float(await conn.fetchval(_ROW_ESTIMATE_SQL)))
            width = await self._column_width(conn)
            refused = width not in (None, self.embedding_dimension) and not (self._reembedding or self._width_from_store)
            # Only a refusal names the embedder the store records: a normal start reads nothing more.
            recorded = (await conn.fetchval("SELECT value_json FROM meta WHERE name = $1", EMBEDDER_META)
                        if refused else None)
        if width is None or not refused:
            if self._width_from_store and width is not None:  # no embedder, no width to match: the store's is kept
                self.embedding_dimension = width
            return
        recorded = None if recorded is None else json.loads(recorded)
        made = "" if recorded is None else f" (made by {recorded!r})"
        if recorded is None and width == 384:
            recorded = CHAT_MINILM  # unrecorded and 384 wide: most likely 0.4.0-0.6.0's default
        raise StoreError(
            f"The PostgreSQL store at {self.where} holds embeddings of dimension {width}{made}, but the configured "
            f"embedder gives {self.embedding_dimension}, so nothing was changed. "
            f"{keep_or_reembed(recorded, _REEMBED_IN_PLACE)}."
        )

    async def _column_width(self, conn: Any) -> int | None:
        """The `embedding` column's vector width (None if unknown)."""
        typmod = await conn.fetchval(_WIDTH_SQL, f"{quote_ident(self.schema)}.entries")
        return typmod if typmod is not None and typmod > 0 else None

    async def _take_width(self, conn: Any, width: int) -> None:
        """Give the emptied `embedding` column `width`, if it has another, with the HNSW index remade as the schema
        makes it for that width; inside the caller's transaction."""
        if await self._column_width(conn) in (None, width):
            return
        await conn.execute(f"DROP INDEX IF EXISTS {_HNSW_INDEX_NAME}")
        # USING NULL: no old vector is converted; the table holds no row now and the import brings the new ones.
        await conn.execute(f"ALTER TABLE entries ALTER COLUMN embedding TYPE vector({width}) USING NULL")
        hnsw = _hnsw_index(width)
        if hnsw:
            await conn.execute(hnsw)

    def _explain(self, error: Exception) -> Exception | None:
        import asyncpg

        found = _WIDTH_ERROR.search(str(error)) if isinstance(error, asyncpg.DataError) else None
        if found is None:
            return super()._explain(error)
        # Writes and queries are checked against this server's width first, so pgvector refusing one means the
        # column's width changed since this server opened the store (another process re-embedded it, or imported
        # vectors of another width into it while it was empty).
        widths = [int(w) for w in found.groups() if w is not None and int(w) != self.embedding_dimension]
        now = f"now holds embeddings of dimension {widths[0]}" if widths else "now holds embeddings of another dimension"
        return StoreError(
            f"The PostgreSQL store at {self.where} {now}, but this server's embedder gives {self.embedding_dimension}: "
            "it was re-embedded (`amfs-server memory reembed`) since this server started, or imported an export of "
            "that width while empty (`amfs-server memory import`), so nothing was changed. Restart this server with "
            "the embedder whose vectors the store now holds (AMFS_EMBEDDER)."
        )

    async def _ensure_vector_extension(self, conn: Any) -> None:
        import asyncpg

        row = await conn.fetchrow(
            "SELECT n.nspname, e.extversion FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
            "WHERE e.extname = $1",
            VECTOR_EXTENSION,
        )
        if row is None:
            available = await conn.fetchval("SELECT 1 FROM pg_available_extensions WHERE name = $1", VECTOR_EXTENSION)
            if not available:
                raise StoreError(
                    f"PostgreSQL at {redact_dsn(self.dsn)} has no pgvector extension ({VECTOR_EXTENSION!r} is not "
                    f"installed on the server): {INSTALL_HINT}"
                )
            try:
                async with conn.transaction():  # a savepoint: a failure leaves a clear message, not an aborted tx
                    await conn.execute(f"CREATE EXTENSION IF NOT EXISTS {quote_ident(VECTOR_EXTENSION)}")
            except asyncpg.PostgresError as error:
                raise StoreError(
                    f"Cannot create the pgvector extension in PostgreSQL at {redact_dsn(self.dsn)} ({error}); "
                    f"a superuser can run `CREATE EXTENSION vector;` in that database, or {INSTALL_HINT}"
                ) from error
            row = await conn.fetchrow(
                "SELECT n.nspname, e.extversion FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
                "WHERE e.extname = $1",
                VECTOR_EXTENSION,
            )
        self._vector_schema = row["nspname"]
        self._iterative_scan = _version_tuple(row["extversion"]) >= (0, 8)

    async def close(self) -> None:
        task, self._analyze_task = self._analyze_task, None
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        await super().close()

    def _rows_added(self, count: int) -> None:
        """After a bulk load the planner still sizes the table as it was: it then scans every row for the nearest
        vectors instead of using the HNSW index (60 ms instead of 10 at 10k entries). Refresh the statistics in
        the background once the table has grown enough, rather than wait up to a minute for autovacuum."""
        self._rows_since_analyze += count
        threshold = max(ANALYZE_MIN_NEW_ROWS, ANALYZE_GROWTH * self._rows_at_analyze)
        if self._rows_since_analyze < threshold or (self._analyze_task is not None and not self._analyze_task.done()):
            return
        self._rows_since_analyze = 0
        self._analyze_task = asyncio.get_running_loop().create_task(self._analyze())

    async def _analyze(self) -> None:
        try:
            async def analyze(conn: Any) -> float:
                await conn.execute("ANALYZE entries")
                return float(await conn.fetchval(_ROW_ESTIMATE_SQL))

            self._rows_at_analyze = max(0.0, await self._read(analyze))
            self._term_stats = None  # the keyword statistics come from the same ANALYZE
        except Exception as error:  # statistics are an optimisation: autovacuum refreshes them anyway
            logger.warning("ANALYZE of %s failed: %s", self.where, error)

    async def _lock_keys(self, conn: Any, pairs: Iterable[tuple[str, str]]) -> None:
        """Take the per-key transaction locks, in hash order (so lock order is the same everywhere)."""
        names = sorted({f"{entity_path}/{key}" for entity_path, key in pairs})
        if not names:
            return
        await conn.execute(
            "SELECT pg_advisory_xact_lock($1::int4, h) FROM "
            "(SELECT DISTINCT hashtext(n) AS h FROM unnest($2::text[]) AS n ORDER BY h) AS locks",
            self._lock_namespace,
            names,
        )

    def _check_embedding(self, embedding: list[float] | None, what: str) -> list[float] | None:
        if embedding is None:
            return None
        if len(embedding) != self.embedding_dimension:
            raise ValidationError(
                f"{what} has an embedding of dimension {len(embedding)}, but this store holds dimension "
                f"{self.embedding_dimension}. Use the embedder the store was created with."
            )
        return embedding

    # -- entries ----------------------------------------------------------------------------

    async def insert_versions(self, drafts: list[NewEntry], actor: Actor) -> list[MemoryEntry]:
        if not drafts:
            return []
        for draft in drafts:
            self._check_embedding(draft.embedding, f"'{draft.entity_path}/{draft.key}'")
        # Rows are locked in key order (a stable sort keeps repeated keys in draft order); results go back in draft order.
        order = sorted(range(len(drafts)), key=lambda i: (drafts[i].entity_path, drafts[i].key))

        erased = 0

        async def write(conn: Any) -> list[MemoryEntry]:
            nonlocal erased
            erased = 0  # a retried transaction starts over
            # The keys that lent context passages are locked too, so a forget of one waits for this write (and then
            # strips the passage it finds) or goes first (and this write finds the lender gone).
            await self._lock_keys(conn, [(d.entity_path, d.key) for d in drafts]
                                  + [(d.entity_path, d.context_key) for d in drafts if d.context_key is not None])
            stored: list[MemoryEntry | None] = [None] * len(drafts)
            for index in order:
                draft = drafts[index]
                if draft.context_key is not None and await conn.fetchval(
                    "SELECT 1 FROM entries WHERE entity_path = $1 AND key = $2 AND written_at <= $3 LIMIT 1",
                    draft.entity_path, draft.context_key, draft.written_at,
                ) is None:
                    draft = draft.without_context()  # its lender was erased (and maybe written anew) since
                previous = await conn.fetchrow(
                    "UPDATE entries SET is_current = false WHERE entity_path = $1 AND key = $2 AND is_current "
                    "RETURNING version, ttl_at",
                    draft.entity_path, draft.key,
                )
                if previous is not None and previous["ttl_at"] is not None and previous["ttl_at"] <= draft.written_at:
                    # Its current version expired: the key is gone (the sweep would erase every version), so this
                    # write starts it anew rather than bring the older versions back.
                    erased += await self._erase_keys(conn, "entity_path = $1 AND key = $2", draft.entity_path, draft.key)
                    previous = None
                version = 1 if previous is None else previous["version"] + 1
                row = await conn.fetchrow(
                    _INSERT_ENTRY + f"RETURNING {_ENTRY_COLUMNS}", *draft_params(draft, version, POSTGRES)
                )
                await conn.execute(
                    _INSERT_TRACE,
                    *trace_params(actor.session_id, actor.agent_id, "write", draft.entity_path, draft.key, version,
                                  draft.written_at, None, POSTGRES),
                )
                stored[index] = _row_to_entry(row)
            return stored  # type: ignore[return-value]

        stored = await self._tx(write)
        self._rows_added(len(stored))
        if erased:
            await self._vacuum_erased()
        return stored

    async def get_current(self, entity_path: str, key: str, now: datetime) -> MemoryEntry | None:
        row = await self._read(
            lambda conn: conn.fetchrow(
                f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE entity_path = $1 AND key = $2 AND is_current "
                "AND (ttl_at IS NULL OR ttl_at > $3)",
                entity_path, key, now,
            )
        )
        return None if row is None else _row_to_entry(row)

    async def get_version(self, entity_path: str, key: str, version: int) -> MemoryEntry | None:
        row = await self._read(
            lambda conn: conn.fetchrow(
                f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE entity_path = $1 AND key = $2 AND version = $3",
                entity_path, key, int(version),
            )
        )
        return None if row is None else _row_to_entry(row)

    async def history(self, entity_path: str, key: str, *, values: bool = True) -> list[MemoryEntry]:
        columns = _ENTRY_COLUMNS if values else ENTRY_COLUMNS_WITHOUT_VALUES
        rows = await self._read(
            lambda conn: conn.fetch(
                f"SELECT {columns} FROM entries WHERE entity_path = $1 AND key = $2 ORDER BY version",
                entity_path, key,
            )
        )
        return [_row_to_entry(row, with_embedding=values) for row in rows]

    async def find_current(
        self, flt: EntryFilter, now: datetime, sort_by: SortBy, limit: int | None, *, values: bool = True,
        value_head: int | None = None,
    ) -> list[MemoryEntry]:
        params = _Params()
        clauses = _filter_sql(flt, now, params)
        columns = read_columns(values, value_head)
        sql = f"SELECT {columns} FROM entries WHERE {' AND '.join(clauses)} ORDER BY {_SORT_SQL[sort_by]}"
        if limit is not None:
            sql += f" LIMIT {params.add(max(0, int(limit)))}"
        rows = await self._read(lambda conn: conn.fetch(sql, *params.values))
        return [_row_to_entry(row, with_embedding=False) for row in rows]

    async def entity_counts(self, entity_path: str | None, now: datetime) -> dict[str, int]:
        scope = "" if entity_path is None else "AND (entity_path = $2 OR (entity_path > $3 AND entity_path < $4))"
        args: list[Any] = [now] if entity_path is None else [now, entity_path, entity_path + "/", entity_path + "0"]
        sql = (
            "SELECT entity_path, count(*) AS n FROM entries WHERE is_current AND (ttl_at IS NULL OR ttl_at > $1) "
            f"{scope} GROUP BY entity_path"
        )
        rows = await self._read(lambda conn: conn.fetch(sql, *args))
        return {row["entity_path"]: int(row["n"]) for row in rows}

    async def latest_at(self, entity_path: str, now: datetime, limit: int) -> list[MemoryEntry]:
        sql = (
            f"SELECT {_BASE_COLUMNS} FROM entries WHERE is_current AND (ttl_at IS NULL OR ttl_at > $1) "
            "AND entity_path = $2 ORDER BY written_at DESC, row_id DESC LIMIT $3"
        )
        rows = await self._read(lambda conn: conn.fetch(sql, now, entity_path, max(0, int(limit))))
        return [_row_to_entry(row, with_embedding=False) for row in rows]

    async def entries_at(
        self, entity_path: str, now: datetime, offset: int, limit: int, *, value_head: int | None = None
    ) -> list[MemoryEntry]:
        sql = (
            f"SELECT {entry_columns(value_head)} FROM entries WHERE is_current AND (ttl_at IS NULL OR ttl_at > $1) "
            "AND entity_path = $2 ORDER BY key LIMIT $3 OFFSET $4"
        )
        rows = await self._read(
            lambda conn: conn.fetch(sql, now, entity_path, max(0, int(limit)), max(0, int(offset)))
        )
        return [_row_to_entry(row, with_embedding=False) for row in rows]

    async def keyword_candidates(
        self, terms: list[str], flt: EntryFilter, now: datetime, limit: int, *, values: bool = True,
        value_head: int | None = None,
    ) -> list[tuple[MemoryEntry, float]]:
        """Current live entries matching ANY term (an OR tsquery), best first by the summed IDF of the terms
        they match, `ln(1 + (N - df + 0.5) / (df + 0.5))` as in BM25: an entry matching a rare word outranks
        one matching several common ones. df counts the matching entries within the filter's scope. The score is
        that sum over the sum of every query word's IDF (unmatched words included): the share of the query's word
        weight the entry matches, 1 for an entry holding every word."""
        words = _tsquery_pieces(terms)
        if not words or limit <= 0:
            return []
        params = _Params()
        q = params.add(_or_query(words))
        pieces = params.add(words)
        clauses = _filter_sql(flt, now, params)
        # N: the scope's entries for a scoped retrieval (an entity-limited key's scores must not depend on the rest
        # of the store), else the planner's row count.
        scope_size = _ROW_ESTIMATE_SQL if flt.entity_path is None else _scope_size_sql(params.add(flt.entity_path))
        sql = _KEYWORD_SQL.format(
            query=q, pieces=pieces, filters=" AND ".join(clauses),
            columns=f"{read_columns(values, value_head)}, {WORD_COUNT_COLUMNS}", limit=params.add(int(limit)),
            scope_size=f"({scope_size})",
        )

        # A piece made only of stop words becomes an empty tsquery: it matches nothing (the pool's connections do
        # not print the NOTICE it raises).
        rows = await self._read(lambda conn: conn.fetch(sql, *params.values))
        return length_scaled([(_row_to_entry(row, with_embedding=False), float(row["score"]), row) for row in rows])

    async def common_terms(self, terms: list[str], max_matches: int, entity_path: str | None = None) -> set[str]:
        """From the planner's statistics (`pg_stats.most_common_elems` of `search_tsv`, kept by ANALYZE and
        autovacuum), cached for ten seconds: counting matches per term would walk each term's whole GIN posting list.
        With `entity_path`, a term common in the store is counted again within the scope (bounded by
        `max_matches`), so entries outside it can neither switch a scoped caller's word off nor tell it they exist."""
        if self._term_stats is None or time.monotonic() - self._term_stats[0] > TERM_STATS_TTL_S:
            rows = await self._read(lambda conn: conn.fetch(_TERM_STATS_SQL, self.schema))
            if not rows:  # never analysed yet (a new or freshly loaded table): gather the statistics once
                await self._read(lambda conn: conn.execute("ANALYZE entries"))
                rows = await self._read(lambda conn: conn.fetch(_TERM_STATS_SQL, self.schema))
            self._term_stats = (time.monotonic(), {row["lexeme"]: float(row["matches"]) for row in rows})
        counts = self._term_stats[1]
        searchable = [term for term in terms if _tsquery_text([term])]
        if not counts or not searchable:
            return set()
        if any(term not in self._lexemes for term in searchable):
            if len(self._lexemes) + len(searchable) > LEXEME_CACHE_SIZE:
                self._lexemes.clear()
            unknown = [term for term in searchable if term not in self._lexemes]
            rows = await self._read(lambda conn: conn.fetch(_LEXEME_SQL, unknown))
            self._lexemes.update((row["term"], row["lexeme"]) for row in rows)
        common = {term for term in searchable if counts.get(self._lexemes[term], 0.0) > max_matches}
        if entity_path is None or not common:
            return common
        in_scope = await self._read(lambda conn: conn.fetchval(_scope_size_sql("$1"), entity_path))
        if in_scope <= max_matches:
            return set()  # no word can match more entries than the scope holds
        scoped_sql = (
            "SELECT count(*) FROM (SELECT 1 FROM entries WHERE is_current AND search_tsv @@ to_tsquery('english', $1) "
            f"AND {_scope_range('$2')} LIMIT $3) AS hits"
        )

        async def count(conn: Any) -> set[str]:
            return {term for term in sorted(common)
                    if await conn.fetchval(scoped_sql, _tsquery_text([term]), entity_path, max_matches + 1) > max_matches}

        return await self._read(count)

    async def semantic_candidates(
        self, vector: list[float], flt: EntryFilter, now: datetime, limit: int, *, values: bool = True,
        value_head: int | None = None,
    ) -> list[tuple[MemoryEntry, float]]:
        """Current live entries nearest to `vector` (HNSW, cosine), best first; score = cosine similarity."""
        if limit <= 0:
            return []
        query_vector = [float(x) for x in vector]
        self._check_embedding(query_vector, "The query")
        if not all(math.isfinite(x) for x in query_vector) or not any(query_vector):
            return []  # no cosine similarity to a zero / non-finite vector
        params = _Params()
        q = params.add(query_vector)
        clauses = _filter_sql(flt, now, params)
        # Inner query: the index order (approximate, possibly relaxed); outer: exact order by distance.
        sql = (
            f"SELECT * FROM (SELECT {read_columns(values, value_head)}, "
            f"embedding <=> {q} AS distance FROM entries "
            f"WHERE embedding IS NOT NULL AND {' AND '.join(clauses)} "
            f"ORDER BY embedding <=> {q} LIMIT {params.add(int(limit))}) AS nearest "
            "ORDER BY distance, written_at DESC, row_id DESC"
        )
        ef_search = max(HNSW_EF_SEARCH, min(int(limit), 1000))

        settings = [f"hnsw.ef_search = {ef_search}"]
        if flt.entity_path is None:
            # A vector wider than about 500 dimensions (2 KB) is stored out of line (TOAST), which the planner does
            # not cost: unscoped, it then prefers reading and sorting every row to the HNSW index (768 dimensions at
            # 10k entries: 36 ms instead of 3). Scoped, reading the scope's rows can be the right plan, so it keeps
            # its choice there.
            settings += ["enable_seqscan = off", "enable_sort = off"]
        if self._iterative_scan:
            settings.append("hnsw.iterative_scan = relaxed_order")
        rows: list[Any] = await self._read_with_settings(settings, lambda conn: conn.fetch(sql, *params.values))
        results = []
        for row in rows:
            score = 1.0 - float(row["distance"])
            if math.isfinite(score):
                results.append((_row_to_entry(row, with_embedding=False), score))
        return results

    async def entry_values(
        self, entries: Sequence[MemoryEntry], *, value_head: int | None = None
    ) -> dict[tuple[str, str, int], Any]:
        rows = await self._versions_of(entries, f"e.version, {value_columns(value_head, 'e.')}")
        return {(row["entity_path"], row["key"], row["version"]): value_from_row(row) for row in rows}

    async def passage_vectors(self, entries: Sequence[MemoryEntry]) -> dict[str, Any]:
        rows = await self._versions_of(entries, "e.passage_embeddings", "WHERE e.passage_embeddings IS NOT NULL")
        return {entry_key(row["entity_path"], row["key"]): POSTGRES.passages_array(row["passage_embeddings"],
                                                                                   self.embedding_dimension)
                for row in rows}

    async def _versions_of(self, entries: Sequence[MemoryEntry], columns: str, where: str = "") -> list[Any]:
        """entity_path, key and `columns` of these exact versions (those still stored)."""
        if not entries:
            return []
        rows: list[Any] = await self._read(lambda conn: conn.fetch(
            f"SELECT e.entity_path, e.key, {columns} FROM entries e "
            "JOIN unnest($1::text[], $2::text[], $3::int[]) AS wanted (entity_path, key, version) "
            f"USING (entity_path, key, version) {where}",
            [e.entity_path for e in entries], [e.key for e in entries], [e.version for e in entries],
        ))
        return rows

    # -- reads and traces ---------------------------------------------------------------------

    async def record_reads(self, actor: Actor, kind: TraceKind, reads: list[TierUpdate], now: datetime) -> None:
        if not reads:
            return

        counts: dict[tuple[str, str, int], int] = {}
        latest: dict[tuple[str, str, int], TierUpdate] = {}
        for read in reads:
            where = (read.entity_path, read.key, read.version)
            counts[where] = counts.get(where, 0) + 1
            latest[where] = read
        rows = sorted(counts)

        # One statement, one round trip (it was five: BEGIN, SET, UPDATE, INSERT, COMMIT).
        # synchronous_commit off: read bookkeeping, not data, need not wait for the WAL flush. A PostgreSQL crash may
        # lose the last fraction of a second of it; it never leaves the store inconsistent. A setting made with
        # set_config(..., true) holds for the statement's own transaction, whose commit reads it.
        # Only a version still held (the same write) gets its count and its trace: a read that lost a race with a
        # forget in another process left a trace naming the erased key (red-team repro). The row lock the UPDATE
        # takes makes a forget that comes later wait, and then delete these traces with the key's others.
        await self._tx(lambda conn: conn.execute(
            _RECORD_READS_SQL,
            [w[0] for w in rows], [w[1] for w in rows], [w[2] for w in rows], [counts[w] for w in rows],
            [int(latest[w].tier) for w in rows], [latest[w].priority_score for w in rows],
            [latest[w].written_at for w in rows],
            actor.session_id, actor.agent_id, kind, now,
            [r.entity_path for r in reads], [r.key for r in reads], [r.version for r in reads],
            [None if r.detail is None else json.dumps(r.detail) for r in reads],
        ), transaction=False)

    async def session_reads(self, session_id: str) -> list[OutcomeTarget]:
        return await self._read(lambda conn: self._session_reads(conn, session_id))

    @staticmethod
    async def _session_reads(conn: Any, session_id: str) -> list[OutcomeTarget]:
        rows = await conn.fetch(
            "SELECT entity_path, key, max(version) AS version, min(event_id) AS first FROM trace_events "
            "WHERE session_id = $1 AND kind IN ('read', 'retrieve') GROUP BY entity_path, key ORDER BY first",
            session_id,
        )
        return [OutcomeTarget(row["entity_path"], row["key"], row["version"]) for row in rows]

    async def trace_events(self, session_id: str | None = None) -> list[TraceEvent]:
        sql = f"SELECT {TRACE_COLUMNS} FROM trace_events"
        args: tuple[Any, ...] = ()
        if session_id is not None:
            sql += " WHERE session_id = $1"
            args = (session_id,)
        rows = await self._read(lambda conn: conn.fetch(sql + " ORDER BY event_id", *args))
        return [trace_from_row(row, POSTGRES) for row in rows]

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
        from ..core.confidence import apply_outcome

        async def write(conn: Any) -> tuple[OutcomeRecord, list[MemoryEntry]]:
            # A ref already committed answers first: a retry (a lost reply, a new session that has read nothing, a
            # target forgotten since) gets the stored record, never a refusal. A concurrent first commit is caught
            # by the claim below.
            existing = await run_postgres(conn, outcome_records(POSTGRES, "WHERE o.outcome_ref = $1", (outcome_ref,)))
            if existing:
                return already_applied(existing[0]), []
            reads = await self._session_reads(conn, actor.session_id)
            if targets is None:
                candidates = reads
            else:
                read_versions = {(t.entity_path, t.key): t.version_read for t in reads}
                candidates = [
                    t if t.version_read is not None
                    else OutcomeTarget(t.entity_path, t.key, read_versions.get((t.entity_path, t.key)))
                    for t in targets
                ]
            await self._lock_keys(conn, ((t.entity_path, t.key) for t in candidates))
            # Existence is settled for every target before the first write, so a refusal changes nothing.
            rows: dict[int, Any] = {}
            for position in sorted(range(len(candidates)), key=lambda i: (candidates[i].entity_path, candidates[i].key)):
                target = candidates[position]
                row = await conn.fetchrow(  # without the value: an outcome changes confidence and tier only
                    f"SELECT {ENTRY_COLUMNS_WITHOUT_VALUES} FROM entries WHERE entity_path = $1 AND key = $2 "
                    "AND is_current AND (ttl_at IS NULL OR ttl_at > $3) FOR UPDATE",
                    target.entity_path, target.key, now,
                )
                if row is not None:
                    rows[position] = row
                elif targets is not None:
                    raise missing_causal_entry(target.entity_path, target.key)
            if not rows:
                raise nothing_read(actor.session_id)
            # Claim the ref: a concurrent commit of the same ref waits here for ours, then sees the conflict.
            claimed = await conn.fetchval(
                POSTGRES.insert("outcomes", OUTCOME_COLUMNS, " ON CONFLICT (outcome_ref) DO NOTHING RETURNING outcome_ref"),
                *outcome_params(outcome_ref, outcome_type, multiplier, now, actor.agent_id, actor.session_id, POSTGRES),
            )
            if claimed is None:
                existing = await run_postgres(conn, outcome_records(POSTGRES, "WHERE o.outcome_ref = $1", (outcome_ref,)))
                if existing:
                    return already_applied(existing[0]), []
                raise ConflictError(f"Outcome {outcome_ref!r} is being committed concurrently; retry the call.")
            effects: list[OutcomeEffect] = []
            updated: list[MemoryEntry] = []
            for position in sorted(rows):  # rows keep the targets' order; skipped session reads leave no gap
                target, row = candidates[position], rows[position]
                before = row["confidence"]
                after = apply_outcome(before, multiplier)
                entry = retier(
                    _row_to_entry(row, with_embedding=False).with_changes(
                        confidence=after, outcome_count=row["outcome_count"] + 1
                    )
                )
                await conn.execute(
                    "UPDATE entries SET confidence = $1, outcome_count = $2, tier = $3, priority_score = $4 "
                    "WHERE row_id = $5",
                    after, entry.outcome_count, int(entry.tier), entry.priority_score, row["row_id"],
                )
                effects.append(OutcomeEffect(target.entity_path, target.key, target.version_read, row["version"], before, after))
                updated.append(entry)
            await conn.executemany(_INSERT_EFFECT, effect_params(outcome_ref, effects))
            record = OutcomeRecord(outcome_ref, outcome_type, multiplier, now, actor.agent_id, actor.session_id, tuple(effects))
            return record, updated

        return await self._tx(write)

    async def outcome_records(
        self, entity_path: str | None = None, *, key: str | None = None, newest_first: bool = False, offset: int = 0,
        limit: int | None = None,
    ) -> list[OutcomeRecord]:
        where, params = outcome_filter(POSTGRES, entity_path, key)
        return await self._read(lambda conn: run_postgres(conn, outcome_records(
            POSTGRES, where, params, newest_first=newest_first, offset=offset, limit=limit)))

    async def count_outcomes(self, entity_path: str | None = None, *, key: str | None = None) -> int:
        where, params = outcome_filter(POSTGRES, entity_path, key)
        return await self._read(lambda conn: run_postgres(conn, count_outcomes(where, params)))

    # -- maintenance --------------------------------------------------------------------------

    async def forget(self, entity_path: str, key: str) -> int:
        async def delete(conn: Any) -> int:
            await self._lock_keys(conn, [(entity_path, key)])
            return await self._erase_keys(conn, "entity_path = $1 AND key = $2", entity_path, key)

        removed = await self._tx(delete)
        if removed:
            await self._vacuum_erased()
        return removed

    async def purge_expired(self, now: datetime) -> int:
        await self._vacuum_erased()  # one a killed process left undone (the sweep runs at open and every minute)

        async def delete(conn: Any) -> int:
            expired = await conn.fetch(
                "SELECT DISTINCT entity_path, key FROM entries WHERE ttl_at IS NOT NULL AND ttl_at <= $1", now
            )
            if not expired:
                return 0
            await self._lock_keys(conn, ((r["entity_path"], r["key"]) for r in expired))
            # Re-check under the locks: a key rewritten meanwhile has a new, live current version.
            removed = await self._erase_keys(
                conn,
                "(entity_path, key) IN (SELECT entity_path, key FROM entries "
                "WHERE is_current AND ttl_at IS NOT NULL AND ttl_at <= $1)",
                now,
            )
            # A superseded version whose own TTL passed goes alone; the key's other versions stay. The passages
            # the key lent may hold its text, so they go as on a forget.
            gone = await conn.fetch(
                "DELETE FROM entries WHERE NOT is_current AND ttl_at IS NOT NULL AND ttl_at <= $1 "
                "RETURNING entity_path, key", now,
            )
            if gone:
                pairs = sorted({(r["entity_path"], r["key"]) for r in gone})
                await self._strip_lent_passages(conn, [p for p, _ in pairs], [k for _, k in pairs])
                await _mark_vacuum_pending(conn)
            return removed + len(gone)

        removed = await self._tx(delete)
        if removed:
            await self._vacuum_erased()
        return removed

    @staticmethod
    async def _erase_keys(conn: Any, where: str, *params: Any) -> int:
        """Delete every version of the keys `where` selects (on entries), with their traces and outcome
        effects (an outcome left without effects goes too); the tsvector and vector index entries go with
        the rows. Returns the versions removed."""
        pairs = await conn.fetch(f"SELECT DISTINCT entity_path, key FROM entries WHERE {where}", *params)
        if not pairs:
            return 0
        paths, keys = [r["entity_path"] for r in pairs], [r["key"] for r in pairs]
        removed = rowcount(await conn.execute(
            "DELETE FROM entries WHERE (entity_path, key) IN (SELECT * FROM unnest($1::text[], $2::text[]))", paths, keys
        ))
        for table in ("trace_events", "outcome_effects"):
            await conn.execute(
                f"DELETE FROM {table} WHERE (entity_path, key) IN (SELECT * FROM unnest($1::text[], $2::text[]))",
                paths, keys,
            )
        await PostgresStore._strip_lent_passages(conn, paths, keys)
        await conn.execute(
            "DELETE FROM outcomes o WHERE NOT EXISTS (SELECT 1 FROM outcome_effects e WHERE e.outcome_ref = o.outcome_ref)"
        )
        await _mark_vacuum_pending(conn)
        return removed

    @staticmethod
    async def _strip_lent_passages(conn: Any, paths: list[str], keys: list[str]) -> None:
        """Passages made with these keys' text (the next turns' context passages, the last row) go; their own
        stay, none when one row would be left (a one-passage entry keeps none)."""
        await conn.execute(
            "UPDATE entries e SET context_key = NULL, passage_embeddings = CASE "
            "WHEN length(e.passage_embeddings) <= 8 * vector_dims(e.embedding) THEN NULL "
            "ELSE substring(e.passage_embeddings FROM 1 FOR length(e.passage_embeddings) - 4 * vector_dims(e.embedding)) END "
            "FROM unnest($1::text[], $2::text[]) AS gone (entity_path, key) "
            "WHERE e.entity_path = gone.entity_path AND e.context_key = gone.key",
            paths, keys,
        )

    async def _vacuum_erased(self) -> None:
        """VACUUM the tables an erase deleted from, when an erase marked them (`_mark_vacuum_pending`), and clear
        the mark it saw. A process killed between an erase's commit and its VACUUM left the erased values in dead
        tuples, readable in the table files, that nothing removed: autovacuum waits for 50 rows and 20% of the
        table (red-team finding, 0.7.11). The mark commits with the erase, so the next sweep (at open and every
        minute, in any process) finds it; a mark set again meanwhile has another token and stays."""
        token = await self._read(lambda conn: conn.fetchval("SELECT value_json FROM meta WHERE name = $1", VACUUM_PENDING))
        if token is None:
            return
        if await vacuum(self._require_pool(), self.where, *_ERASED_TABLES):
            await self._read(lambda conn: conn.execute(
                "DELETE FROM meta WHERE name = $1 AND value_json = $2", VACUUM_PENDING, token))

    async def clear(self) -> None:
        await self._tx(lambda conn: conn.execute(_TRUNCATE_ALL))

    async def export_snapshot(self) -> StoreSnapshot:
        return await self._tx(lambda conn: run_postgres(conn, export_store(POSTGRES, hidden_meta=_UNEXPORTED_META)), readonly=True, isolation="repeatable_read")

    async def import_snapshot(self, snapshot: StoreSnapshot, *, replacing: StoreSnapshot | None = None) -> None:
        width = vector_width(snapshot)  # refuses vectors of several widths before anything
        # Opened without an embedder, the store has no width to keep: an empty one takes the snapshot's (`memory
        # import` of a 768-wide export into a new store, which was made 384 wide). With one, the embedder's stays.
        taking = width if (width not in (None, self.embedding_dimension) and self._width_from_store
                           and replacing is None) else None
        if taking is None:
            for entry in snapshot.entries:
                self._check_embedding(entry.embedding, f"Imported entry '{entry.entry_key}' v{entry.version}")
        latest = latest_versions(snapshot)

        async def write(conn: Any) -> None:
            if replacing is not None:
                # Writers wait from here to the commit (readers do not); then the store must still be `replacing`.
                await conn.execute("LOCK TABLE entries, outcomes, outcome_effects, trace_events, meta IN EXCLUSIVE MODE")
                if await run_postgres(conn, export_store(POSTGRES, hidden_meta=_UNEXPORTED_META)) != replacing:
                    raise ConflictError(STORE_CHANGED)
                await conn.execute(_TRUNCATE_ALL)  # transactional in PostgreSQL: undone if the import fails
                await self._take_width(conn, self.embedding_dimension)  # DDL is transactional too: undone with it
            elif taking is not None:
                # Readers and writers wait from here to the commit, so no vector of the old width comes in meanwhile.
                await conn.execute("LOCK TABLE entries IN ACCESS EXCLUSIVE MODE")
                if await conn.fetchval("SELECT EXISTS (SELECT 1 FROM entries)"):
                    raise ValidationError(
                        f"The snapshot's vectors have dimension {taking}, but the PostgreSQL store at {self.where} "
                        f"holds dimension {await self._column_width(conn)} and is not empty, so nothing was imported. "
                        "Import it into an empty store (another database or schema); to merge the two, re-embed one "
                        "with the other's embedder first (`amfs-server memory reembed`)."
                    )
                await self._take_width(conn, taking)  # undone with the import if it fails
            await self._lock_keys(conn, latest)
            await run_postgres(conn, import_store(snapshot, POSTGRES))

        await self._tx(write)
        if taking is not None:
            self.embedding_dimension = taking
        self._rows_added(len(snapshot.entries))

    async def get_meta(self, name: str) -> Any | None:
        text = await self._read(lambda conn: conn.fetchval("SELECT value_json FROM meta WHERE name = $1", name))
        return None if text is None else json.loads(text)

    async def set_meta(self, name: str, value: Any | None) -> None:
        async def write(conn: Any) -> None:
            if value is None:
                await conn.execute("DELETE FROM meta WHERE name = $1", name)
            else:
                await conn.execute(_UPSERT_META, name, json.dumps(value))

        await self._tx(write)

    async def update_meta(
        self, names: Sequence[str], change: Callable[[dict[str, Any | None]], Mapping[str, Any | None]]
    ) -> None:
        async def update(conn: Any) -> None:
            # A row that does not exist yet cannot be locked FOR UPDATE: lock the names ('#' is in no entity path).
            await self._lock_keys(conn, [("#meta", name) for name in names])
            rows = await conn.fetch("SELECT name, value_json FROM meta WHERE name = ANY($1::text[])", list(names))
            held: dict[str, Any | None] = {name: None for name in names}
            held.update({row["name"]: json.loads(row["value_json"]) for row in rows})
            for name, value in change(held).items():
                if value is None:
                    await conn.execute("DELETE FROM meta WHERE name = $1", name)
                else:
                    await conn.execute(_UPSERT_META, name, json.dumps(value))

        # Read committed whatever the server's default: the read after the lock must see the last holder's write.
        await self._tx(update, isolation="read_committed")


_ERASED_TABLES = ("entries", "trace_events", "outcome_effects", "outcomes")
"""The tables a forget or TTL purge deletes from, vacuumed afterwards."""
VACUUM_PENDING = "vacuum_pending"
"""Meta row an erase sets in its transaction and `_vacuum_erased` clears once VACUUM has run."""
_UNEXPORTED_META = (VACUUM_PENDING, IMPORT_PENDING_META, SPLIT_WORDS_META)  # this database's own state


async def _mark_vacuum_pending(conn: Any) -> None:
    await conn.execute(_UPSERT_META, VACUUM_PENDING, json.dumps(uuid.uuid4().hex))


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = re.match(r"\d+", piece)
        parts.append(int(digits.group()) if digits else 0)
    return tuple(parts)
