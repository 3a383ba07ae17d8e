"""PostgreSQL-only behaviour of `PostgresStore`: start-up (extension, migrations, schema selection),
indexes, the `english` text search configuration, NUL handling, HNSW filtering and in-process concurrency.

The shared behaviour (everything SQLite does too) is in the contract suite (tests/adapters/test_store_contract.py,
run for [sqlite] and [postgres]). Tests that need a server skip, not fail, when none is available.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest

from amfs_server.adapters import postgres as pg
from amfs_server.adapters.postgres import PostgresStore, schema_from_dsn
from amfs_server.core.ports import MemoryStore, OutcomeTarget
from amfs_server.core.errors import StoreError, ValidationError
from amfs_server.core.retrieval import keyword_terms
from amfs_server.core.models import (
    Actor,
    EntryFilter,
    MemoryType,
    NewEntry,
    OutcomeType,
    Tier,
    utcnow,
)

POSTGRES_DSN = os.environ.get("AMFS_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
DIM = 384
ACTOR = Actor("agent/test", "session-pg")
_probe: list[str] = []


def _postgres_unavailable_reason() -> str | None:
    """Same probe as tests/conftest.py (conftest is not importable under --import-mode=importlib)."""
    if not _probe:
        try:
            import asyncpg

            async def probe() -> None:
                conn = await asyncpg.connect(POSTGRES_DSN, timeout=5)
                try:
                    await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                finally:
                    await conn.close()

            asyncio.run(probe())
            _probe.append("")
        except Exception as error:  # any failure means: skip
            _probe.append(f"{type(error).__name__}: {error}")
    return _probe[0] or None


@pytest.fixture
def pg_dsn() -> str:
    reason = _postgres_unavailable_reason()
    if reason:
        pytest.skip(f"PostgreSQL with pgvector unavailable: {reason}")
    return POSTGRES_DSN


def fresh_schema() -> str:
    return f"amfs_test_{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def pg_store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(pg_dsn, embedding_dimension=DIM, schema=fresh_schema())
    await store.open()
    try:
        yield store
    finally:
        await store.drop_schema()
        await store.close()


async def _fetch(dsn: str, sql: str, *args: Any) -> list[Any]:
    import asyncpg

    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


def draft(
    entity_path: str,
    key: str,
    value: Any = None,
    *,
    search_text: str = "",
    embedding: list[float] | None = None,
    confidence: float = 1.0,
    memory_type: MemoryType = MemoryType.FACT,
    ttl_at: Any = None,
) -> NewEntry:
    import json

    value = {"note": key} if value is None else value
    return NewEntry(
        entity_path=entity_path, key=key, value=value, value_json=json.dumps(value, ensure_ascii=False),
        confidence=confidence, memory_type=memory_type, agent_id=ACTOR.agent_id, session_id=ACTOR.session_id,
        written_at=utcnow(), ttl_at=ttl_at, importance_score=None, importance_dimensions=None, tier=Tier.HOT,
        priority_score=0.5, embedding=embedding, search_text=search_text,
    )


def unit(vector: list[float]) -> list[float]:
    norm = sum(x * x for x in vector) ** 0.5
    return [x / norm for x in vector]


def random_vector(rng: random.Random) -> list[float]:
    return unit([rng.gauss(0.0, 1.0) for _ in range(DIM)])


# -- no server needed ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dsn", "schema"),
    [
        ("postgresql://u@h/db", None),
        ("postgresql://u@h/db?options=-csearch_path%3Dteam_a", "team_a"),
        ("postgresql://u@h/db?options=-c%20search_path%3Dteam_b%2Cpublic", "team_b"),
        ("postgresql://u@h/db?options=--search_path%3Dteam_c", "team_c"),
        ("postgresql://u@h/db?sslmode=disable&options=-c%20statement_timeout%3D5s%20-csearch_path%3Dx1", "x1"),
        ("postgresql://u@h/db?search_path=plain", "plain"),
        ("postgresql://u@h/db?options=-csearch_path%3D%24user%2Cpublic", None),
        ("postgresql://u@h/db?options=-c%20statement_timeout%3D5s", None),
    ],
)
def test_schema_comes_from_the_dsn_search_path(dsn: str, schema: str | None) -> None:
    assert schema_from_dsn(dsn) == schema
    assert PostgresStore(dsn).schema == (schema or "amfs")


def test_explicit_schema_wins_and_bad_names_are_refused() -> None:
    assert PostgresStore("postgresql://u@h/db?options=-csearch_path%3Dfrom_dsn", schema="explicit").schema == "explicit"
    with pytest.raises(StoreError, match="schema name"):
        PostgresStore("postgresql://u@h/db", schema='bad"; DROP TABLE x; --')
    with pytest.raises(StoreError, match="postgresql://"):
        PostgresStore("mysql://u@h/db")


def test_store_satisfies_the_protocol() -> None:
    assert isinstance(PostgresStore("postgresql://u@h/db"), MemoryStore)


def test_passwords_stay_out_of_messages() -> None:
    assert pg.redact_dsn("postgresql://amfs:s3cret@db.example:5433/amfs?sslmode=require") == (
        "postgresql://amfs@db.example:5433/amfs"
    )


def test_tsquery_is_an_or_of_sanitised_words_and_identifier_phrases() -> None:
    assert pg._tsquery_text(["Retry policy", "auth-service", "retry", "x'); DROP--", "  ", "a:b*c&d|e!f"]) == (
        "retry | policy | auth | service | x | drop | a | b | c | d | e | f"
    )
    assert pg._tsquery_text(["ERR_LEDGER_409", "_max_", "ledger"]) == "(err <-> ledger <-> 409) | max | ledger"
    assert pg._tsquery_text(["!!!", "", "__"]) == ""


class _FakeTransaction:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> bool:
        return False


class _FakeConnection:
    """Just enough of asyncpg.Connection for `_ensure_vector_extension`."""

    def __init__(self, available: bool, create_error: Exception | None) -> None:
        self.available = available
        self.create_error = create_error

    async def fetchrow(self, sql: str, *args: Any) -> None:
        return None  # the extension is not created in this database

    async def fetchval(self, sql: str, *args: Any) -> Any:
        assert "pg_available_extensions" in sql
        return 1 if self.available else None

    async def execute(self, sql: str, *args: Any) -> None:
        assert sql.startswith("CREATE EXTENSION")
        if self.create_error:
            raise self.create_error

    def transaction(self) -> _FakeTransaction:
        return _FakeTransaction()


async def test_missing_pgvector_says_what_to_install() -> None:
    store = PostgresStore("postgresql://amfs:secret@db.example:5432/amfs")
    with pytest.raises(StoreError) as caught:
        await store._ensure_vector_extension(_FakeConnection(available=False, create_error=None))
    message = str(caught.value)
    assert pg.INSTALL_HINT in message
    assert "run scripts/ensure_postgres.sh or install pgvector: https://github.com/pgvector/pgvector#installation" in message
    assert "secret" not in message


async def test_uncreatable_pgvector_says_what_to_do() -> None:
    import asyncpg

    store = PostgresStore("postgresql://amfs@db.example:5432/amfs")
    denied = asyncpg.InsufficientPrivilegeError("permission denied to create extension \"vector\"")
    with pytest.raises(StoreError) as caught:
        await store._ensure_vector_extension(_FakeConnection(available=True, create_error=denied))
    assert "CREATE EXTENSION vector" in str(caught.value)
    assert pg.INSTALL_HINT in str(caught.value)


async def test_unreachable_server_is_a_store_error() -> None:
    store = PostgresStore("postgresql://amfs:secret@127.0.0.1:1/amfs")
    with pytest.raises(StoreError, match="Cannot connect to PostgreSQL") as caught:
        await store.open()
    assert "secret" not in str(caught.value)


async def test_unopened_store_says_to_open_it() -> None:
    with pytest.raises(StoreError, match="not open"):
        await PostgresStore("postgresql://u@h/db").get_meta("x")


# -- with a server ------------------------------------------------------------------------------

pytestmark_pg = pytest.mark.postgres


@pytestmark_pg
async def test_missing_extension_against_a_real_server(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg, "VECTOR_EXTENSION", "vector_not_installed_anywhere")
    store = PostgresStore(pg_dsn, schema=fresh_schema())
    with pytest.raises(StoreError) as caught:
        await store.open()
    assert pg.INSTALL_HINT in str(caught.value)
    assert store._pool is None
    assert not await _fetch(pg_dsn, "SELECT 1 FROM pg_namespace WHERE nspname = $1", store.schema)


@pytestmark_pg
async def test_schema_tables_indexes_and_generated_tsvector(pg_store: PostgresStore) -> None:
    dsn, schema = pg_store.dsn, pg_store.schema
    tables = {r["tablename"] for r in await _fetch(dsn, "SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)}
    assert tables == {"entries", "outcomes", "outcome_effects", "trace_events", "meta", "schema_migrations"}
    indexes = {
        r["indexname"]: r["indexdef"]
        for r in await _fetch(dsn, "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1", schema)
    }
    hnsw = indexes["entries_embedding_hnsw"]
    assert "USING hnsw" in hnsw and "vector_cosine_ops" in hnsw and "WHERE is_current" in hnsw
    assert "USING gin (search_tsv)" in indexes["entries_search_tsv"]
    assert "UNIQUE" in indexes["entries_current_key"] and "WHERE is_current" in indexes["entries_current_key"]
    assert "UNIQUE" in indexes["entries_key_version"]
    columns = {
        r["attname"]: r
        for r in await _fetch(
            dsn,
            "SELECT attname, attgenerated::text AS attgenerated, format_type(atttypid, atttypmod) AS type FROM pg_attribute "
            "WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped",
            f'"{schema}".entries',
        )
    }
    assert columns["search_tsv"]["attgenerated"] == "s"  # GENERATED ALWAYS AS (...) STORED, declared in CREATE TABLE
    assert columns["embedding"]["type"] == f"vector({DIM})"
    assert columns["written_at"]["type"] == "timestamp with time zone"
    versions = await _fetch(dsn, f'SELECT version FROM "{schema}".schema_migrations ORDER BY version')
    assert [r["version"] for r in versions] == list(range(1, len(pg.MIGRATIONS) + 1))


@pytestmark_pg
async def test_concurrent_open_of_a_fresh_schema(pg_dsn: str) -> None:
    schema = fresh_schema()
    stores = [PostgresStore(pg_dsn, embedding_dimension=DIM, schema=schema) for _ in range(4)]
    try:
        await asyncio.gather(*(store.open() for store in stores))
        rows = await _fetch(pg_dsn, f'SELECT version FROM "{schema}".schema_migrations ORDER BY version')
        assert [r["version"] for r in rows] == list(range(1, len(pg.MIGRATIONS) + 1))
        await stores[0].insert_versions([draft("svc/a", "k")], ACTOR)
        assert (await stores[3].get_current("svc/a", "k", utcnow())).version == 1  # type: ignore[union-attr]
    finally:
        await stores[0].drop_schema()
        for store in stores:
            await store.close()


@pytestmark_pg
async def test_embedding_dimension_mismatch(pg_store: PostgresStore) -> None:
    other = PostgresStore(pg_store.dsn, embedding_dimension=8, schema=pg_store.schema)
    with pytest.raises(StoreError, match="dimension 384.*nothing was changed.*`amfs-server memory reembed`.*"
                                         "AMFS_EMBEDDER=chat-MiniLM-L6-onnx-int8"):
        await other.open()
    with pytest.raises(ValidationError, match="dimension 3"):
        await pg_store.insert_versions([draft("svc/a", "k", embedding=[1.0, 0.0, 0.0])], ACTOR)
    with pytest.raises(ValidationError):
        await pg_store.semantic_candidates([1.0, 0.0], EntryFilter(), utcnow(), 5)


async def _vector_column(store: PostgresStore) -> tuple[int, list[str]]:
    """The `embedding` column's width and the names of the indexes on it."""
    rows = await _fetch(
        store.dsn,
        "SELECT format_type(a.atttypid, a.atttypmod) AS type, (SELECT coalesce(array_agg(c.relname::text), '{}') "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = a.attrelid "
        "AND a.attnum = ANY(i.indkey)) AS indexes FROM pg_attribute a "
        "WHERE a.attrelid = to_regclass($1) AND a.attname = 'embedding'",
        f'"{store.schema}".entries',
    )
    return int(rows[0]["type"].removeprefix("vector(").removesuffix(")")), list(rows[0]["indexes"])


@pytestmark_pg
async def test_a_replacing_import_changes_the_vector_width_and_remakes_the_hnsw_index_as_the_schema_would(
    pg_store: PostgresStore,
) -> None:
    """What `memory reembed` does to a store of another width: opened for re-embedding (export at the old width), the
    replacing import gives the column the new width, with an HNSW index only where pgvector can build one."""
    from dataclasses import replace

    rng = random.Random(5)
    await pg_store.insert_versions([draft("svc/a", f"k{i}", embedding=random_vector(rng)) for i in range(3)], ACTOR)
    assert await _vector_column(pg_store) == (DIM, ["entries_embedding_hnsw"])
    for width, indexes in ((pg.HNSW_MAX_DIMENSIONS + 1, []), (DIM, ["entries_embedding_hnsw"])):
        store = PostgresStore(pg_store.dsn, embedding_dimension=width, schema=pg_store.schema)
        await store.open(reembedding=True)
        old = await store.export_snapshot()
        vectors = [unit([rng.gauss(0.0, 1.0) for _ in range(width)]) for _ in old.entries]
        await store.import_snapshot(replace(old, entries=[e.with_changes(embedding=v, passage_embeddings=None)
                                                          for e, v in zip(old.entries, vectors)]), replacing=old)
        assert await _vector_column(store) == (width, indexes)
        nearest = await store.semantic_candidates(vectors[1], EntryFilter(), utcnow(), 1)
        assert nearest[0][0].key == "k1" and nearest[0][1] == pytest.approx(1.0, abs=1e-5)
        await store.close()


@pytestmark_pg
async def test_an_import_gives_its_width_only_to_a_store_without_an_embedder_that_holds_no_version(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`memory import` (no embedder) of a snapshot of another width into an empty store: the column takes it in the
    import's transaction, with the HNSW index as the schema makes it. A store holding any version, or one whose width
    is its embedder's, refuses it and keeps its width; a snapshot without vectors leaves the width as it is."""
    from dataclasses import replace

    rng = random.Random(7)
    await pg_store.insert_versions([draft("svc/a", f"k{i}", embedding=random_vector(rng)) for i in range(3)], ACTOR)
    exported = await pg_store.export_snapshot()
    await pg_store.clear()

    def at_width(width: int) -> tuple[Any, list[list[float]]]:
        vectors = [unit([rng.gauss(0.0, 1.0) for _ in range(width)]) for _ in exported.entries]
        return replace(exported, entries=[e.with_changes(embedding=v) for e, v in zip(exported.entries, vectors)]), vectors

    wide, vectors = at_width(768)
    await pg_store.insert_versions([draft("svc/held", "x", embedding=random_vector(rng))], ACTOR)
    with pytest.raises(ValidationError, match="dimension 768, but this store holds dimension 384"):
        await pg_store.import_snapshot(wide)  # its embedder's width stays
    importing = PostgresStore(pg_store.dsn, embedding_dimension=None, schema=pg_store.schema)  # as the command opens it
    await importing.open()
    with pytest.raises(ValidationError, match="dimension 768, but the PostgreSQL store .* holds dimension 384 and is "
                                              "not empty, so nothing was imported"):
        await importing.import_snapshot(wide)
    assert await _vector_column(pg_store) == (DIM, ["entries_embedding_hnsw"])
    await importing.forget("svc/held", "x")  # now it holds no version

    async def fail_after_the_alter(self: PostgresStore, conn: Any, pairs: object) -> None:
        raise RuntimeError(f"injected failure at width {await self._column_width(conn)}")

    with monkeypatch.context() as patch:
        patch.setattr(PostgresStore, "_lock_keys", fail_after_the_alter)
        with pytest.raises(RuntimeError, match="at width 768"):
            await importing.import_snapshot(wide)
    assert await _vector_column(pg_store) == (DIM, ["entries_embedding_hnsw"]) and importing.embedding_dimension == DIM

    probe = [0.0] * DIM
    probe[0] = 1.0
    assert await asyncio.gather(*[importing.semantic_candidates(probe, EntryFilter(), utcnow(), 1)
                                  for _ in range(4)]) == [[]] * 4  # statements prepared at the old width
    await importing.import_snapshot(wide)
    assert await _vector_column(pg_store) == (768, ["entries_embedding_hnsw"]) and importing.embedding_dimension == 768
    assert await importing.export_snapshot() == replace(wide, entries=[
        e.with_changes(embedding=np.asarray(e.embedding, dtype=np.float32).astype(float).tolist()) for e in wide.entries])
    for nearest in await asyncio.gather(*[importing.semantic_candidates(vectors[1], EntryFilter(), utcnow(), 1)
                                          for _ in range(4)]):  # on every pooled connection
        assert nearest[0][0].key == "k1" and nearest[0][1] == pytest.approx(1.0, abs=1e-5)

    for width, indexes in ((pg.HNSW_MAX_DIMENSIONS + 1, []), (DIM, ["entries_embedding_hnsw"])):  # and back again
        await importing.clear()
        snapshot, vectors = at_width(width)
        await importing.import_snapshot(snapshot)
        assert await _vector_column(pg_store) == (width, indexes)
        nearest = await importing.semantic_candidates(vectors[2], EntryFilter(), utcnow(), 1)
        assert nearest[0][0].key == "k2" and nearest[0][1] == pytest.approx(1.0, abs=1e-5)
    await importing.clear()
    await importing.import_snapshot(at_width(768)[0])
    await importing.clear()
    await importing.import_snapshot(replace(exported, entries=[e.with_changes(embedding=None) for e in exported.entries]))
    assert await _vector_column(pg_store) == (768, ["entries_embedding_hnsw"])  # no vectors: the width stays
    await importing.close()


@pytestmark_pg
async def test_a_store_of_another_width_opens_only_to_be_reembedded_or_without_an_embedder(pg_store: PostgresStore) -> None:
    other = PostgresStore(pg_store.dsn, embedding_dimension=768, schema=pg_store.schema)
    await other.open(reembedding=True)  # for the export a re-embedding starts with
    assert other.embedding_dimension == 768 and await _vector_column(pg_store) == (DIM, ["entries_embedding_hnsw"])
    await other.close()
    inspecting = PostgresStore(pg_store.dsn, embedding_dimension=None, schema=pg_store.schema)  # no embedder
    await inspecting.open()
    assert inspecting.embedding_dimension == DIM
    await inspecting.close()
    with pytest.raises(StoreError, match="amfs-server memory reembed"):
        await PostgresStore(pg_store.dsn, embedding_dimension=768, schema=pg_store.schema).open()


@pytestmark_pg
async def test_schema_named_in_the_dsn(pg_dsn: str) -> None:
    schema = fresh_schema()
    separator = "&" if "?" in pg_dsn else "?"
    store = PostgresStore(f"{pg_dsn}{separator}options={quote(f'-csearch_path={schema}', safe='')}")
    assert store.schema == schema
    await store.open()
    try:
        await store.insert_versions([draft("svc/a", "k")], ACTOR)
        rows = await _fetch(pg_dsn, f'SELECT entity_path FROM "{schema}".entries')
        assert [r["entity_path"] for r in rows] == ["svc/a"]
    finally:
        await store.drop_schema()
        await store.close()


@pytestmark_pg
async def test_keyword_search_drops_english_stop_words_and_phrases_identifiers(pg_store: PostgresStore) -> None:
    """PostgreSQL's `english` configuration, which SQLite's FTS5 does not share: stop words match nothing, and an
    identifier is searched as the phrase of its underscore-separated parts (any-word matching is in the contract)."""
    await pg_store.insert_versions(
        [
            draft("svc/payments", "retry", search_text="svc payments retry: the retry of the ERR_LEDGER_409 charge"),
            draft("svc/ledger", "notes", search_text="svc ledger notes: err on the side of 409 retries"),
        ],
        ACTOR,
    )
    now = utcnow()
    assert await pg_store.keyword_candidates(["the", "a"], EntryFilter(), now, 10) == []
    assert [e.key for e, _ in await pg_store.keyword_candidates(["ERR_LEDGER_409"], EntryFilter(), now, 10)] == ["retry"]


@pytestmark_pg
async def test_filtered_hnsw_search_does_not_starve(pg_store: PostgresStore) -> None:
    """With the HNSW index serving the query, a selective filter still gets `limit` hits, nearest first.

    Without `hnsw.iterative_scan` the index yields its `ef_search` nearest rows, all filtered away here.
    """
    rng = random.Random(11)
    query = random_vector(rng)
    noise = [unit([q + rng.gauss(0.0, 0.02) for q in query]) for _ in range(400)]  # all very near the query
    wanted = [random_vector(rng) for _ in range(12)]  # far from it
    await pg_store.insert_versions([draft("noise", f"n{i}", embedding=v) for i, v in enumerate(noise)], ACTOR)
    await pg_store.insert_versions(
        [draft("wanted", f"w{i}", embedding=v, memory_type=MemoryType.BELIEF) for i, v in enumerate(wanted)], ACTOR
    )

    # A second store on the same schema whose connections cannot seq-scan or bitmap-scan: HNSW must serve the query.
    separator = "&" if "?" in pg_store.dsn else "?"
    options = quote("-c enable_seqscan=off -c enable_bitmapscan=off", safe="")
    forced = PostgresStore(f"{pg_store.dsn}{separator}options={options}", schema=pg_store.schema)
    await forced.open()
    try:
        async with forced._pool.acquire() as conn:  # type: ignore[union-attr]
            assert await conn.fetchval("SHOW enable_seqscan") == "off"
            plan = "\n".join(
                r[0]
                for r in await conn.fetch(
                    "EXPLAIN SELECT row_id FROM entries WHERE is_current AND embedding IS NOT NULL "
                    "AND memory_type = 'belief' ORDER BY embedding <=> $1 LIMIT 5",
                    query,
                )
            )
            assert "entries_embedding_hnsw" in plan, plan
        hits = await forced.semantic_candidates(query, EntryFilter(memory_type=MemoryType.BELIEF), utcnow(), 5)
        assert len(hits) == 5
        assert all(e.entity_path == "wanted" for e, _ in hits)
        scores = [score for _, score in hits]
        assert scores == sorted(scores, reverse=True)
        exact = sorted((sum(a * b for a, b in zip(query, v)), f"w{i}") for i, v in enumerate(wanted))[::-1][:5]
        assert [e.key for e, _ in hits] == [key for _, key in exact]
    finally:
        await forced.close()


class ExplainingConnection:
    """Stands in for the connection a store's transaction hands its callback: every `fetch` is first run as
    `EXPLAIN` on the same connection, inside the same transaction (so under the store's own `SET LOCAL`s)."""

    def __init__(self, conn: Any, plans: list[str]) -> None:
        self._conn, self._plans = conn, plans

    async def execute(self, sql: str, *args: Any) -> Any:
        return await self._conn.execute(sql, *args)

    async def fetch(self, sql: str, *args: Any) -> Any:
        self._plans.append("\n".join(r[0] for r in await self._conn.fetch("EXPLAIN " + sql, *args)))
        return await self._conn.fetch(sql, *args)


@pytestmark_pg
async def test_an_unscoped_search_over_out_of_line_vectors_uses_the_hnsw_index(pg_dsn: str) -> None:
    """768-dimension vectors (3 KB) are stored out of line (TOAST), which the planner does not cost: left to
    itself it reads and sorts every row for an unscoped nearest-neighbour search (36 ms instead of 3 at 10k
    entries with EmbeddingGemma). The store turns that plan off for the unscoped query; a scoped one keeps the
    planner's choice."""
    dim = 768
    store = PostgresStore(pg_dsn, embedding_dimension=dim, schema=fresh_schema())
    await store.open()
    original = store._read
    try:
        rng = random.Random(3)
        vectors = [unit([rng.gauss(0.0, 1.0) for _ in range(dim)]) for _ in range(1500)]
        for start in range(0, len(vectors), 500):
            await store.insert_versions([draft(f"team/{i % 3}", f"k{i}", embedding=v)
                                         for i, v in enumerate(vectors[start:start + 500], start=start)], ACTOR)
        await store._read(lambda conn: conn.execute("ANALYZE entries"))
        plans: list[str] = []

        async def explained(fn: Any) -> Any:
            return await original(lambda conn: fn(ExplainingConnection(conn, plans)))

        store._read = explained  # type: ignore[method-assign]
        hits = await store.semantic_candidates(vectors[42], EntryFilter(), utcnow(), 50)
        assert hits[0][0].key == "k42" and len(hits) == 50
        assert "entries_embedding_hnsw" in plans[-1] and "Seq Scan" not in plans[-1], plans[-1]
    finally:
        store._read = original  # type: ignore[method-assign]
        await store.drop_schema()
        await store.close()


@pytestmark_pg
async def test_concurrent_writers_in_one_process(pg_store: PostgresStore) -> None:
    results = await asyncio.gather(
        *(pg_store.insert_versions([draft("race/a", "k", {"n": n})], Actor(f"agent/{n}", f"s{n}")) for n in range(20))
    )
    assert sorted(r[0].version for r in results) == list(range(1, 21))
    history = await pg_store.history("race/a", "k")
    assert [e.version for e in history] == list(range(1, 21))
    assert sum(e.version == 20 for e in history) == 1
    current = await pg_store.get_current("race/a", "k", utcnow())
    assert current is not None and current.version == 20


@pytestmark_pg
async def test_multi_key_writes_in_opposite_orders_do_not_deadlock(pg_store: PostgresStore) -> None:
    keys = [f"k{i}" for i in range(6)]

    async def write(n: int) -> None:
        order = keys if n % 2 else list(reversed(keys))
        await pg_store.insert_versions([draft("race/multi", k, {"n": n}) for k in order], ACTOR)

    await asyncio.gather(*(write(n) for n in range(10)))
    for key in keys:
        assert [e.version for e in await pg_store.history("race/multi", key)] == list(range(1, 11))


@pytestmark_pg
async def test_concurrent_outcomes_in_one_process(pg_store: PostgresStore) -> None:
    await pg_store.insert_versions([draft("race/o", "entry")], ACTOR)
    target = [OutcomeTarget("race/o", "entry", None)]
    now = utcnow()
    same = await asyncio.gather(
        *(pg_store.apply_outcome("same-ref", OutcomeType.FAILURE, 1.1, ACTOR, now, target, lambda e: e) for _ in range(5))
    )
    assert sorted(r.already_applied for r, _ in same) == [False, True, True, True, True]
    assert len({r.effects for r, _ in same}) == 1
    different = await asyncio.gather(
        *(pg_store.apply_outcome(f"ref-{n}", OutcomeType.SUCCESS, 0.9, ACTOR, now, target, lambda e: e) for n in range(5))
    )
    assert not any(r.already_applied for r, _ in different)
    entry = await pg_store.get_current("race/o", "entry", utcnow())
    assert entry is not None
    assert entry.confidence == pytest.approx(1.1 * 0.9**5)
    assert entry.outcome_count == 6
    befores = sorted((r.effects[0].confidence_before for r, _ in different), reverse=True)
    assert befores == pytest.approx([1.1 * 0.9**n for n in range(5)])


@pytestmark_pg
async def test_nul_in_a_name_is_a_clear_validation_error(pg_store: PostgresStore) -> None:
    """PostgreSQL text cannot hold U+0000 (values holding it round-trip: see the contract suite); names holding it
    are refused with a message saying so."""
    await pg_store.insert_versions([draft("svc/a", "k")], ACTOR)
    with pytest.raises(ValidationError, match="NUL"):
        await pg_store.apply_outcome("bad\x00ref", OutcomeType.FAILURE, 1.1, ACTOR, utcnow(), [OutcomeTarget("svc/a", "k", None)], lambda e: e)
    with pytest.raises(ValidationError, match="NUL"):
        await pg_store.set_meta("bad\x00name", 1)


@pytestmark_pg
async def test_migrations_upgrade_an_older_schema(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    schema = fresh_schema()
    with monkeypatch.context() as patch:
        patch.setattr(pg, "MIGRATIONS", pg.MIGRATIONS[:1])

        async def version_1_counts_nothing(self: PostgresStore) -> None:
            return None

        patch.setattr(PostgresStore, "_count_words_of_older_rows", version_1_counts_nothing)
        old = PostgresStore(pg_dsn, embedding_dimension=DIM, schema=schema)
        await old.open()
        async with old._pool.acquire() as conn:  # type: ignore[union-attr]  # data as version-1 code wrote it
            await conn.execute("INSERT INTO meta (name, value_json) VALUES ('kept', '[1, 2]')")
            await conn.execute(
                "INSERT INTO trace_events (session_id, agent_id, kind, entity_path, key, version, at) "
                "VALUES ('s', 'a', 'read', 'svc/a', 'k', 1, now())"
            )
        await old.close()
    store = PostgresStore(pg_dsn, embedding_dimension=DIM, schema=schema)
    try:
        await store.open()
        rows = await _fetch(pg_dsn, f'SELECT version FROM "{schema}".schema_migrations ORDER BY version')
        assert [r["version"] for r in rows] == list(range(1, len(pg.MIGRATIONS) + 1))
        assert await store.get_meta("kept") == [1, 2]
        assert [(t.kind, t.detail) for t in await store.trace_events()] == [("read", None)]
        options = await _fetch(pg_dsn, f"SELECT reloptions FROM pg_class WHERE oid = '\"{schema}\".entries'::regclass")
        assert options[0]["reloptions"] == ["fillfactor=80"]  # room on each page for in-place read bookkeeping
        gin = await _fetch(pg_dsn, f"SELECT reloptions FROM pg_class WHERE oid = '\"{schema}\".entries_search_tsv'::regclass")
        assert gin[0]["reloptions"] == ["fastupdate=off"]  # no pending list for keyword queries to scan
        await store.insert_versions([draft("svc/a", "k")], ACTOR)
        with monkeypatch.context() as patch:  # a store newer than this code refuses to open
            patch.setattr(pg, "MIGRATIONS", pg.MIGRATIONS[:1])
            with pytest.raises(StoreError, match="Upgrade amfs-server"):
                await PostgresStore(pg_dsn, embedding_dimension=DIM, schema=schema).open()
    finally:
        await store.drop_schema()
        await store.close()


@pytestmark_pg
async def test_a_bulk_load_refreshes_the_planner_statistics(pg_store: PostgresStore, pg_dsn: str) -> None:
    async def estimated_rows() -> float:
        rows = await _fetch(pg_dsn, f"SELECT reltuples FROM pg_class WHERE oid = '\"{pg_store.schema}\".entries'::regclass")
        return rows[0]["reltuples"]

    assert await estimated_rows() <= 0  # never analysed
    await pg_store.insert_versions([draft("svc/bulk", f"k{i}", search_text=f"note {i}") for i in range(10)], ACTOR)
    assert pg_store._analyze_task is None  # a few rows: left to autovacuum
    await pg_store.insert_versions([draft("svc/bulk", f"n{i}", search_text=f"note {i}") for i in range(1200)], ACTOR)
    assert pg_store._analyze_task is not None
    await pg_store._analyze_task
    assert await estimated_rows() == 1210


@pytest.mark.parametrize(
    ("make", "lost"),
    [
        # What calls met while PostgreSQL restarted (a red-team run): each was an "Internal error" before.
        (lambda a: a.AdminShutdownError("terminating connection due to administrator command"), True),
        (lambda a: a.CannotConnectNowError("the database system is shutting down"), True),
        (lambda a: a.InterfaceError("underlying connection is closed"), True),
        (lambda a: a.InternalClientError("cannot switch to state 12"), True),
        (lambda a: a.ConnectionDoesNotExistError("connection was closed in the middle of operation"), True),
        (lambda a: ConnectionResetError(), True),
        # A bug stays a bug: reported as an internal error, not as a lost connection.
        (lambda a: a.InterfaceError("the server expects 2 arguments for this query, 1 was passed"), False),
        (lambda a: a.UndefinedColumnError('column "nope" does not exist'), False),
    ],
)
def test_a_lost_connection_is_told_apart_from_a_bug(make: Any, lost: bool) -> None:
    import asyncpg

    from amfs_server.adapters.postgres_base import _connection_lost

    assert _connection_lost(make(asyncpg)) is lost


@pytestmark_pg
async def test_scoped_keyword_scores_ignore_the_planners_row_count_of_the_whole_store(
    pg_store: PostgresStore, pg_dsn: str
) -> None:
    """Red-team repro (after ANALYZE): N was `reltuples`, the whole table's, so team-a's score for its own entry
    moved when team-b wrote, and N could be solved from it. Scoped, N counts the scope's current entries."""
    now = utcnow()
    await pg_store.insert_versions([draft("team-a", "own", search_text="quasar nebulon"),
                                    draft("team-a", "one", search_text="pulsar x"),
                                    draft("team-a", "two", search_text="pulsar y")], ACTOR)
    scoped = EntryFilter(entity_path="team-a")
    words = ["quasar", "nebulon", "pulsar"]  # words of unequal df: the share of each depends on N
    before = await pg_store.keyword_candidates(words, scoped, now, 10)
    await pg_store.insert_versions([draft("team-b", f"k{i}", search_text=f"filler {i}") for i in range(60)], ACTOR)
    await _fetch(pg_dsn, f'ANALYZE "{pg_store.schema}".entries')
    after = await pg_store.keyword_candidates(words, scoped, now, 10)
    assert [(e.key, score) for e, score in after] == [(e.key, score) for e, score in before]
    unscoped = await pg_store.keyword_candidates(words, EntryFilter(), now, 10)
    assert unscoped[0][1] != after[0][1]  # unscoped, the whole store's row count is N (and this test can fail)


@pytestmark_pg
async def test_every_character_the_english_parser_splits_words_at_breaks_them_for_the_length_factor(
    pg_dsn: str,
) -> None:
    """A red-team finding: '\u00b2' (and 894 more of category No) joined words that PostgreSQL's parser indexes one by
    one, and the length factor counted one word. Probed here against the server's own `english` configuration,
    as the store's generated search column uses it."""
    from amfs_server.core.retrieval import KEYWORD_LENGTH_PIVOT, distinct_words

    split = await _fetch(pg_dsn, """
        SELECT cp FROM generate_series(128, 196607) AS cp
        WHERE cp NOT BETWEEN 55296 AND 57343
          AND to_tsvector('english'::regconfig, 'alpha' || chr(cp) || 'beta') @@ to_tsquery('english'::regconfig, 'alpha')
    """)
    joiners = [chr(row["cp"]) for row in split if re.fullmatch(r"[^\W_]", chr(row["cp"]))]
    assert len(joiners) > 800  # the other numbers (category No) at least: the probe really ran
    words = [f"word{n}x" for n in range(2 * KEYWORD_LENGTH_PIVOT)]
    counted_as_one = [hex(ord(c)) for c in joiners if distinct_words(c.join(words)) != 2 * KEYWORD_LENGTH_PIVOT]
    assert counted_as_one == []



async def test_a_vacuum_a_killed_process_left_undone_runs_at_the_next_sweep(pg_store: PostgresStore, monkeypatch) -> None:
    """Killed between a forget's commit and its VACUUM, a process left the forgotten value in dead tuples that
    nothing removed (autovacuum waits for 50 rows and 20% of the table; red-team finding, 0.7.11). The erase now
    marks the store in its transaction, and the next sweep, in any process, vacuums and clears the mark."""
    real_vacuum = pg.vacuum
    ran: list[tuple[str, ...]] = []

    async def killed_before_vacuum(pool: Any, where: str, *tables: str) -> bool:
        return False  # as if the process died here: the delete has committed, the VACUUM never ran

    async def counting_vacuum(pool: Any, where: str, *tables: str) -> bool:
        ran.append(tables)
        return await real_vacuum(pool, where, *tables)

    await pg_store.insert_versions([draft("svc", "secret", "the launch code is 0000")], ACTOR)
    marked = "SELECT value_json FROM meta WHERE name = 'vacuum_pending'"
    monkeypatch.setattr(pg, "vacuum", killed_before_vacuum)
    assert await pg_store.forget("svc", "secret") == 1
    token = await pg_store._read(lambda conn: conn.fetchval(marked))
    assert token is not None

    monkeypatch.setattr(pg, "vacuum", counting_vacuum)
    other = PostgresStore(pg_store.dsn, embedding_dimension=DIM, schema=pg_store.schema)  # another process, say
    await other.open()
    try:
        assert await other.purge_expired(utcnow()) == 0  # nothing expired; the mark alone makes it vacuum
        assert ran == [pg._ERASED_TABLES]
        assert await other._read(lambda conn: conn.fetchval(marked)) is None
        await other.purge_expired(utcnow())
        assert len(ran) == 1  # no mark, no VACUUM: a sweep costs one meta read
    finally:
        await other.close()


@pytestmark_pg
async def test_word_counts_are_filled_for_older_rows_and_counted_at_read_where_missing(pg_dsn: str) -> None:
    """Since schema 9 a row carries its search text's distinct-word count, so the keyword length factor reads no text.
    A schema-8 store gets the counts of its rows when it is opened; a row without one (written by an older server
    still running) is counted from its text at read, so it ranks the same."""
    from amfs_server.core.retrieval import KEYWORD_LENGTH_PIVOT, distinct_words

    schema = fresh_schema()
    stuffed = "flamegraph " + " ".join(f"word{i}" for i in range(2 * KEYWORD_LENGTH_PIVOT - 1))
    store = PostgresStore(pg_dsn, embedding_dimension=DIM, schema=schema)
    await store.open()
    try:
        await store.insert_versions([draft("svc", "plain", search_text="flamegraph of the deploy dashboard")], ACTOR)
        await store.insert_versions([draft("svc", "stuffed", search_text=stuffed)], ACTOR)
        await store.close()
        await _fetch(pg_dsn, f'ALTER TABLE "{schema}".entries DROP COLUMN distinct_words')  # as schema 8 left it
        await _fetch(pg_dsn, f'DELETE FROM "{schema}".schema_migrations WHERE version >= $1', pg.WORD_COUNT_MIGRATION)
        store = PostgresStore(pg_dsn, embedding_dimension=DIM, schema=schema)
        await store.open()
        counts = {r["key"]: r["distinct_words"] for r in await _fetch(pg_dsn, f'SELECT key, distinct_words FROM "{schema}".entries')}
        assert counts == {"plain": distinct_words("flamegraph of the deploy dashboard"), "stuffed": 2 * KEYWORD_LENGTH_PIVOT}
        hits = await store.keyword_candidates(["flamegraph"], EntryFilter(), utcnow(), 10)
        assert [e.key for e, _ in hits] == ["plain", "stuffed"] and hits[1][1] == pytest.approx(hits[0][1] * 0.25)
        await _fetch(pg_dsn, f'UPDATE "{schema}".entries SET distinct_words = NULL')
        assert await store.keyword_candidates(["flamegraph"], EntryFilter(), utcnow(), 10) == hits
        await store.close()
        store = PostgresStore(pg_dsn, embedding_dimension=DIM, schema=schema)
        await store.open()  # and the next open counts them
        assert {r["key"]: r["distinct_words"] for r in await _fetch(
            pg_dsn, f'SELECT key, distinct_words FROM "{schema}".entries')} == counts
        # a stored count is what is used: the text is not counted again
        await _fetch(pg_dsn, f'UPDATE "{schema}".entries SET distinct_words = $1 WHERE key = \'plain\'', 4 * KEYWORD_LENGTH_PIVOT)
        scaled = await store.keyword_candidates(["flamegraph"], EntryFilter(), utcnow(), 10)
        assert [(e.key, score) for e, score in scaled] == [("stuffed", hits[1][1]), ("plain", pytest.approx(hits[0][1] / 16))]
    finally:
        await store.drop_schema()
        await store.close()


async def test_older_rows_get_their_joined_words_split_once_and_only_rows_whose_words_change_are_rewritten(
        pg_dsn: str) -> None:
    """Before 0.7.15 a row's search text kept `v2.3.1` or `a/b.py` whole, which PostgreSQL indexes as one token that no
    query matches. Opening the store splits them (from the last row checked on), rewriting only rows whose indexed
    words change: an update re-inserts the row into every index, the HNSW graph's included."""
    schema = fresh_schema()
    store = PostgresStore(pg_dsn, embedding_dimension=DIM, schema=schema)
    await store.open()
    try:
        texts = {"version": "we deployed build v2.3.1 to staging", "plain": "we talked about dinner, didn't we?"}
        await store.insert_versions([draft("svc", key, search_text=text) for key, text in texts.items()], ACTOR)
        await store.close()
        # as 0.7.14 left them: the text as written, by an older server, and no row checked
        for key, text in texts.items():
            await _fetch(pg_dsn, f'UPDATE "{schema}".entries SET search_text = $1, amfs_version = \'0.7.14\' '
                                 'WHERE key = $2', text, key)
        await _fetch(pg_dsn, f'DELETE FROM "{schema}".meta WHERE name = $1', pg.SPLIT_WORDS_META)
        before = {r["key"]: r["ctid"] for r in await _fetch(pg_dsn, f'SELECT key, ctid FROM "{schema}".entries')}
        unfound = f"SELECT count(*) AS n FROM \"{schema}\".entries WHERE search_tsv @@ to_tsquery('english', 'v2')"
        assert (await _fetch(pg_dsn, unfound))[0]["n"] == 0
        # While another process splits them, an opener does not wait or do the same work: it opens at once.
        import asyncpg

        other = await asyncpg.connect(pg_dsn, timeout=10)
        try:
            assert await other.fetchval("SELECT pg_try_advisory_lock(hashtext($1), hashtext('amfs-words-apart'))", schema)
            store = PostgresStore(pg_dsn, embedding_dimension=DIM, schema=schema)
            await store.open()
            assert (await _fetch(pg_dsn, unfound))[0]["n"] == 0 and await store.get_meta(pg.SPLIT_WORDS_META) is None
            await store.close()
        finally:
            await other.close()
        store = PostgresStore(pg_dsn, embedding_dimension=DIM, schema=schema)
        await store.open()
        rows = {r["key"]: r for r in await _fetch(pg_dsn, f'SELECT key, ctid, search_text FROM "{schema}".entries')}
        assert rows["version"]["search_text"] == "we deployed build v2 3 1 to staging"
        assert rows["plain"]["ctid"] == before["plain"] and rows["plain"]["search_text"] == texts["plain"]
        hits = await store.keyword_candidates(keyword_terms("v2.3.1"), EntryFilter(), utcnow(), 10)
        assert [(e.key, score) for e, score in hits] == [("version", pytest.approx(1.0))]
        last = max(r["row_id"] for r in await _fetch(pg_dsn, f'SELECT row_id FROM "{schema}".entries'))
        assert await store.get_meta(pg.SPLIT_WORDS_META) == last
        # The open store holds no session lock: the split's lock went with its own connection (the pool's
        # connections are not reset between borrowers).
        assert (await _fetch(pg_dsn, "SELECT pg_try_advisory_lock(hashtext($1), hashtext('amfs-words-apart')) AS got",
                             schema))[0]["got"]
    finally:
        await store.drop_schema()
        await store.close()



class _TopicWords:
    """A test double: one axis per topic word, so a question about a topic finds its turns."""

    TOPICS = ("kitten", "coffee", "garden", "skydive")
    name, dimension = "topic-words", DIM

    def embed(self, texts: list[str]) -> Any:
        rows = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for i, text in enumerate(texts):
            for axis, topic in enumerate(self.TOPICS):
                rows[i, axis] = text.lower().count(topic)
            rows[i, len(self.TOPICS)] = 0.01
            rows[i] /= np.linalg.norm(rows[i])
        return rows


@pytestmark_pg
async def test_a_retrieve_makes_few_round_trips_and_leaves_no_session_state(
        pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round trip to the server costs a retrieve 0.2-0.6 ms of a 50 ms budget on two cores: this unscoped
    retrieve made 23 before 0.7.21 (SET LOCALs one by one, a transaction around each search and around the read
    bookkeeping, asyncpg's reset query each time a connection went back to the pool, a stemming query for its words
    every time). It makes 7 now: 6, and one to stem the words the process has not seen before."""
    import asyncpg

    from amfs_server.core.service import MemoryService, ServiceConfig, WriteRequest

    service = MemoryService(pg_store, ServiceConfig(), embedder=_TopicWords())
    await service.open()
    turns = ["my kitten chased the coffee cup", "we planted the garden on sunday", "a skydive over the coast",
             "coffee beans from the market", "the kitten sleeps in the garden"]
    await service.write_many(ACTOR, [WriteRequest("chat", f"t{n}", text) for n, text in enumerate(turns)])
    await service.retrieve(ACTOR, "what did the kitten do")  # term statistics, statement cache: once a process

    sent: list[str] = []
    for method in ("execute", "fetch", "fetchval", "fetchrow", "executemany"):
        original = getattr(asyncpg.connection.Connection, method)

        def counting(self: Any, query: str, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            sent.append(query)
            return _original(self, query, *args, **kwargs)

        monkeypatch.setattr(asyncpg.connection.Connection, method, counting)
    hits = await service.retrieve(ACTOR, "where did the kitten sleep")
    assert hits and hits[0].entry.key == "t4"
    assert 0 < len(sent) <= 7, sent
    assert not any("RESET" in query or "pg_advisory_unlock_all" in query for query in sent)
    # the traces were written, in rank order, by the one bookkeeping statement
    traces = [t for t in await pg_store.trace_events(ACTOR.session_id) if t.kind == "retrieve"]
    assert [t.key for t in traces[-len(hits):]] == [h.entry.key for h in hits]
    # no setting leaks from one borrower to the next: a search's SET LOCALs end with its transaction
    settings = await pg_store._read(lambda conn: conn.fetchrow(
        "SELECT current_setting('enable_seqscan') AS seqscan, current_setting('synchronous_commit') AS sync"))
    assert (settings["seqscan"], settings["sync"]) == ("on", "on")


@pytestmark_pg
async def test_a_words_stemmed_form_is_asked_of_the_server_once(pg_store: PostgresStore,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    await pg_store.insert_versions([draft("notes", f"n{n}", search_text="the running dogs barked") for n in range(30)],
                                   ACTOR)
    first = await pg_store.common_terms(["running", "dogs", "cats"], max_matches=5)
    assert first == {"running", "dogs"} and pg_store._lexemes["running"] == "run"
    asked: list[list[str]] = []
    original = pg_store._read

    async def counting(fn: Any) -> Any:
        asked.append(["read"])
        return await original(fn)

    monkeypatch.setattr(pg_store, "_read", counting)
    assert await pg_store.common_terms(["running", "dogs", "cats"], max_matches=5) == first
    assert asked == []  # statistics cached for ten seconds, stemmed forms for good
    monkeypatch.setattr(pg, "LEXEME_CACHE_SIZE", 3)
    assert await pg_store.common_terms(["barked", "cats"], max_matches=5) == {"barked"}
    assert len(asked) == 1 and set(pg_store._lexemes) == {"barked", "cats"}  # full: emptied, then filled again


@pytestmark_pg
async def test_a_failed_read_with_settings_rolls_back_and_leaves_the_connection_clean(pg_store: PostgresStore) -> None:
    async def failing(conn: Any) -> None:
        assert await conn.fetchval("SELECT current_setting('enable_seqscan')") == "off"
        await conn.fetch("SELECT no_such_column FROM entries")

    with pytest.raises(Exception, match="no_such_column"):
        await pg_store._read_with_settings(["enable_seqscan = off"], failing)
    async def state(conn: Any) -> tuple[bool, str]:
        return conn.is_in_transaction(), await conn.fetchval("SELECT current_setting('enable_seqscan')")

    for _ in range(3):  # whichever pooled connection comes next: no transaction left open, no setting kept
        assert await pg_store._read(state) == (False, "on")
