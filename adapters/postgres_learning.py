"""The PostgreSQL `LearningStore` (asyncpg): learning tables next to the entry tables, on the same DSN.

Tables `learning_interactions`, `learning_preferences`, `learning_patterns` live in the same schema
as the entry store (the constructor's `schema`, else the DSN's search path, else `amfs`: the rule of
`adapters/postgres.py`, whose helpers this module reuses) with their own migration ledger
`learning_schema_migrations`, so the entry store's migrations are untouched. Its own small pool.

Start-up takes the same database-wide advisory lock as the entry store while it creates the schema and
applies migrations, so processes starting together are safe. A preference's read-modify-write takes
`pg_advisory_xact_lock(hashtext(schema || ':learning'), hashtext(user/category/key))` first, so two
processes observing the same preference serialise instead of losing an observation.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from ..core.errors import ConflictError, StoreError
from ..core.learning_records import Interaction, LearningSnapshot, Pattern, Preference, PreferenceChange
from .postgres import DEFAULT_SCHEMA, MIGRATION_LOCK_KEY, quote_ident, redact_dsn, schema_from_dsn, vacuum
from .sqlite_learning import (
    LEGACY_CONTENT_SCRUB,
    _INTERACTION_COLUMNS,
    _PATTERN_COLUMNS,
    _PREFERENCE_COLUMNS,
    import_conflict,
    interaction_row,
    pattern_row,
    preference_row,
    row_to_interaction,
    row_to_pattern,
    row_to_preference,
)

T = TypeVar("T")

POOL_MAX_SIZE = 4
CONNECT_TIMEOUT_S = 10.0
MAX_TX_ATTEMPTS = 8

MIGRATIONS: list[str] = [
    """
    CREATE TABLE learning_interactions (
        seq bigint GENERATED ALWAYS AS IDENTITY,
        interaction_id text COLLATE "C" PRIMARY KEY,
        user_id text COLLATE "C" NOT NULL,
        session_id text NOT NULL,
        tool_name text COLLATE "C" NOT NULL,
        source text NOT NULL,
        parameters_json text NOT NULL,
        outcome_json text,
        result_json text NOT NULL,
        execution_ms double precision,
        at timestamptz NOT NULL
    );
    CREATE INDEX learning_interactions_user_at ON learning_interactions (user_id, at);
    CREATE INDEX learning_interactions_at ON learning_interactions (at);
    CREATE TABLE learning_preferences (
        user_id text COLLATE "C" NOT NULL,
        category text COLLATE "C" NOT NULL,
        key text COLLATE "C" NOT NULL,
        value_json text NOT NULL,
        confidence double precision NOT NULL,
        sample_size integer NOT NULL,
        support integer NOT NULL,
        source text NOT NULL,
        updated_at timestamptz NOT NULL,
        PRIMARY KEY (user_id, category, key)
    );
    CREATE TABLE learning_patterns (
        pattern_id text COLLATE "C" PRIMARY KEY,
        user_id text COLLATE "C" NOT NULL,
        pattern_type text NOT NULL,
        tool_name text COLLATE "C" NOT NULL,
        data_json text NOT NULL,
        occurrences integer NOT NULL,
        frequency double precision NOT NULL,
        confidence double precision NOT NULL,
        discovered_at timestamptz NOT NULL,
        updated_at timestamptz NOT NULL
    );
    CREATE INDEX learning_patterns_user ON learning_patterns (user_id);
    """,
    # The two-session rule (core.learning): how many sessions the current value was seen in, and the last one.
    """
    ALTER TABLE learning_preferences ADD COLUMN sessions integer NOT NULL DEFAULT 1;
    ALTER TABLE learning_preferences ADD COLUMN last_session text NOT NULL DEFAULT '';
    """ + LEGACY_CONTENT_SCRUB,
]

_INSERT_INTERACTION = f"INSERT INTO learning_interactions ({_INTERACTION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
_UPSERT_PREFERENCE = (
    f"INSERT INTO learning_preferences ({_PREFERENCE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) "
    "ON CONFLICT (user_id, category, key) DO UPDATE SET value_json = EXCLUDED.value_json, "
    "confidence = EXCLUDED.confidence, sample_size = EXCLUDED.sample_size, support = EXCLUDED.support, "
    "source = EXCLUDED.source, updated_at = EXCLUDED.updated_at, sessions = EXCLUDED.sessions, "
    "last_session = EXCLUDED.last_session"
)
_UPSERT_PATTERN = (
    f"INSERT INTO learning_patterns ({_PATTERN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) "
    "ON CONFLICT (pattern_id) DO UPDATE SET user_id = EXCLUDED.user_id, pattern_type = EXCLUDED.pattern_type, "
    "tool_name = EXCLUDED.tool_name, data_json = EXCLUDED.data_json, occurrences = EXCLUDED.occurrences, "
    "frequency = EXCLUDED.frequency, confidence = EXCLUDED.confidence, discovered_at = EXCLUDED.discovered_at, "
    "updated_at = EXCLUDED.updated_at"
)


def _rowcount(status: str) -> int:
    try:
        return int(status.rsplit(" ", 1)[-1])
    except ValueError:
        return 0


class PostgresLearningStore:
    """LearningStore on PostgreSQL; see the module docstring."""

    name = "postgres"

    def __init__(self, dsn: str, schema: str | None = None) -> None:
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise StoreError("The PostgreSQL DSN must be a postgresql:// URL, e.g. postgresql://user@host:5432/amfs")
        self.dsn = dsn
        self.schema = schema or schema_from_dsn(dsn) or DEFAULT_SCHEMA
        self._pool: Any | None = None
        self._open_lock = asyncio.Lock()

    @property
    def where(self) -> str:
        return f"{redact_dsn(self.dsn)} (schema {self.schema})"

    # -- plumbing ---------------------------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            return
        async with self._open_lock:
            if self._pool is not None:
                return
            import asyncpg

            try:
                conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT_S)
            except Exception as error:
                raise StoreError(
                    f"Cannot connect to PostgreSQL at {redact_dsn(self.dsn)} for the learning store: "
                    f"{type(error).__name__}: {error}. Check AMFS_POSTGRES_DSN, or use learning.storage.type: sqlite."
                ) from error
            try:
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
                    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(self.schema)}")
                    await conn.execute(f"SET LOCAL search_path TO {quote_ident(self.schema)}")
                    await self._migrate(conn)
            except StoreError:
                raise
            except Exception as error:
                raise StoreError(f"Cannot prepare the learning tables at {self.where}: {type(error).__name__}: {error}") from error
            finally:
                await conn.close()
            try:
                self._pool = await asyncpg.create_pool(
                    self.dsn, min_size=1, max_size=POOL_MAX_SIZE, timeout=CONNECT_TIMEOUT_S,
                    server_settings={"search_path": quote_ident(self.schema), "application_name": "amfs-server-learning"},
                )
            except Exception as error:
                raise StoreError(f"Cannot open a connection pool to PostgreSQL at {self.where}: {error}") from error

    async def _migrate(self, conn: Any) -> None:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS learning_schema_migrations (version integer PRIMARY KEY, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        current = await conn.fetchval("SELECT coalesce(max(version), 0) FROM learning_schema_migrations")
        if current > len(MIGRATIONS):
            raise StoreError(
                f"The learning tables at {self.where} have schema version {current}, newer than this amfs-server "
                f"({len(MIGRATIONS)}). Upgrade amfs-server."
            )
        for number, script in enumerate(MIGRATIONS[current:], start=current + 1):
            await conn.execute(script)
            await conn.execute("INSERT INTO learning_schema_migrations (version) VALUES ($1)", number)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def drop_schema(self) -> None:
        """Drop this store's schema and everything in it. For tests and teardown."""
        import asyncpg

        await self.close()
        conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT_S)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(self.schema)} CASCADE")
        finally:
            await conn.close()

    def _require_pool(self) -> Any:
        if self._pool is None:
            raise StoreError("The PostgreSQL learning store is not open; call `await store.open()` first.")
        return self._pool

    async def _tx(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        import asyncpg

        pool = self._require_pool()
        for attempt in range(1, MAX_TX_ATTEMPTS + 1):
            try:
                async with pool.acquire() as conn:
                    async with conn.transaction():
                        return await fn(conn)
            except (asyncpg.DeadlockDetectedError, asyncpg.SerializationError) as error:
                if attempt == MAX_TX_ATTEMPTS:
                    raise ConflictError(f"A learning-store transaction kept conflicting ({error}); retry the call.") from error
                await asyncio.sleep(random.uniform(0.005, 0.02) * attempt)
            except (OSError, asyncpg.PostgresConnectionError, asyncpg.ConnectionDoesNotExistError) as error:
                raise StoreError(f"Lost the connection to PostgreSQL at {self.where}: {error}") from error
        raise AssertionError("unreachable")  # pragma: no cover

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        import asyncpg

        try:
            async with self._require_pool().acquire() as conn:
                rows: list[Any] = await conn.fetch(sql, *args)
                return rows
        except (OSError, asyncpg.PostgresConnectionError, asyncpg.ConnectionDoesNotExistError) as error:
            raise StoreError(f"Lost the connection to PostgreSQL at {self.where}: {error}") from error

    # -- interactions and preferences -------------------------------------------------------

    async def record(self, interaction: Interaction | None, changes: Sequence[PreferenceChange]) -> list[Preference]:
        names = sorted({f"{c.user_id}\x1f{c.category}\x1f{c.key}" for c in changes})

        async def write(conn: Any) -> list[Preference]:
            if interaction is not None:
                await conn.execute(_INSERT_INTERACTION, *interaction_row(interaction))
            if names:
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtext($1), h) FROM "
                    "(SELECT DISTINCT hashtext(n) AS h FROM unnest($2::text[]) AS n ORDER BY h) AS locks",
                    f"{self.schema}:learning", names,
                )
            stored: list[Preference] = []
            for change in changes:
                row = await conn.fetchrow(
                    f"SELECT {_PREFERENCE_COLUMNS} FROM learning_preferences "
                    "WHERE user_id = $1 AND category = $2 AND key = $3",
                    change.user_id, change.category, change.key,
                )
                preference = change.apply(None if row is None else row_to_preference(row, row["updated_at"]))
                await conn.execute(_UPSERT_PREFERENCE, *preference_row(preference))
                stored.append(preference)
            return stored

        return await self._tx(write)

    async def interactions(self, user_id: str | None = None, limit: int | None = None) -> list[Interaction]:
        where, args = ("WHERE user_id = $1", [user_id]) if user_id is not None else ("", [])
        sql = f"SELECT {_INTERACTION_COLUMNS} FROM learning_interactions {where} ORDER BY at DESC, seq DESC"
        if limit is not None:
            sql += f" LIMIT {max(0, int(limit))}"  # a negative LIMIT is none to SQLite, an error to PostgreSQL
        rows = await self._fetch(sql, *args)
        return [row_to_interaction(row, row["at"]) for row in reversed(rows)]

    async def interaction_stats(self, user_id: str) -> tuple[int, datetime | None]:
        rows = await self._fetch("SELECT count(*) AS n, max(at) AS newest FROM learning_interactions WHERE user_id = $1", user_id)
        return rows[0]["n"], rows[0]["newest"]

    async def users(self) -> list[str]:
        rows = await self._fetch(
            "SELECT user_id FROM learning_interactions UNION SELECT user_id FROM learning_patterns ORDER BY 1"
        )
        return [row["user_id"] for row in rows]

    async def purge_interactions(self, before: datetime) -> int:
        async def delete(conn: Any) -> int:
            return _rowcount(await conn.execute("DELETE FROM learning_interactions WHERE at < $1", before))

        removed = await self._tx(delete)
        if removed:
            await vacuum(self._require_pool(), self.where, "learning_interactions")
        return removed

    async def preferences(self, user_id: str | None = None, category: str | None = None) -> list[Preference]:
        rows = await self._fetch(
            f"SELECT {_PREFERENCE_COLUMNS} FROM learning_preferences "
            "WHERE ($1::text IS NULL OR user_id = $1) AND ($2::text IS NULL OR category = $2) "
            "ORDER BY user_id, category, key",
            user_id, category,
        )
        return [row_to_preference(row, row["updated_at"]) for row in rows]

    async def delete_preference(self, user_id: str | None, category: str, key: str) -> int:
        async def delete(conn: Any) -> int:
            return _rowcount(await conn.execute(
                "DELETE FROM learning_preferences WHERE category = $1 AND key = $2 AND ($3::text IS NULL OR user_id = $3)",
                category, key, user_id,
            ))

        removed = await self._tx(delete)
        if removed:
            await vacuum(self._require_pool(), self.where, "learning_preferences")
        return removed

    # -- patterns ---------------------------------------------------------------------------

    async def patterns(self, user_id: str | None = None) -> list[Pattern]:
        rows = await self._fetch(
            f"SELECT {_PATTERN_COLUMNS} FROM learning_patterns WHERE ($1::text IS NULL OR user_id = $1) "
            "ORDER BY user_id, pattern_id",
            user_id,
        )
        return [row_to_pattern(row, row["discovered_at"], row["updated_at"]) for row in rows]

    async def replace_patterns(self, user_id: str, patterns: Sequence[Pattern]) -> None:
        async def write(conn: Any) -> None:
            await conn.execute("DELETE FROM learning_patterns WHERE user_id = $1", user_id)
            if patterns:
                await conn.executemany(_UPSERT_PATTERN, [pattern_row(p) for p in patterns])

        await self._tx(write)

    # -- maintenance --------------------------------------------------------------------------

    async def clear(self) -> None:
        async def delete(conn: Any) -> None:
            await conn.execute("TRUNCATE learning_interactions, learning_preferences, learning_patterns")

        await self._tx(delete)

    async def export_snapshot(self) -> LearningSnapshot:
        async def fetch(conn: Any) -> LearningSnapshot:
            interactions = await conn.fetch(
                f"SELECT {_INTERACTION_COLUMNS} FROM learning_interactions ORDER BY at, seq"
            )
            preferences = await conn.fetch(
                f"SELECT {_PREFERENCE_COLUMNS} FROM learning_preferences ORDER BY user_id, category, key"
            )
            patterns = await conn.fetch(f"SELECT {_PATTERN_COLUMNS} FROM learning_patterns ORDER BY user_id, pattern_id")
            return LearningSnapshot(
                [row_to_interaction(r, r["at"]) for r in interactions],
                [row_to_preference(r, r["updated_at"]) for r in preferences],
                [row_to_pattern(r, r["discovered_at"], r["updated_at"]) for r in patterns],
            )

        import asyncpg

        try:  # one consistent snapshot across the three tables
            async with self._require_pool().acquire() as conn:
                async with conn.transaction(isolation="repeatable_read", readonly=True):
                    return await fetch(conn)
        except (OSError, asyncpg.PostgresConnectionError, asyncpg.ConnectionDoesNotExistError) as error:
            raise StoreError(f"Lost the connection to PostgreSQL at {self.where}: {error}") from error

    async def import_snapshot(self, snapshot: LearningSnapshot, check_only: bool = False) -> None:
        async def write(conn: Any) -> None:
            ids = [i.interaction_id for i in snapshot.interactions]
            if ids:
                found = await conn.fetchval(
                    "SELECT interaction_id FROM learning_interactions WHERE interaction_id = ANY($1::text[]) LIMIT 1", ids
                )
                if found is not None:
                    raise import_conflict(f"interaction {found!r}")
            if snapshot.preferences:
                found = await conn.fetchrow(
                    "SELECT p.user_id, p.category, p.key FROM learning_preferences p "
                    "JOIN unnest($1::text[], $2::text[], $3::text[]) AS n (user_id, category, key) "
                    "ON p.user_id = n.user_id AND p.category = n.category AND p.key = n.key LIMIT 1",
                    [p.user_id for p in snapshot.preferences], [p.category for p in snapshot.preferences],
                    [p.key for p in snapshot.preferences],
                )
                if found is not None:
                    raise import_conflict(f"preference '{found['category']}.{found['key']}' of {found['user_id']!r}")
            if check_only:
                return
            if snapshot.interactions:
                await conn.executemany(_INSERT_INTERACTION, [interaction_row(i) for i in snapshot.interactions])
            if snapshot.preferences:
                await conn.executemany(_UPSERT_PREFERENCE, [preference_row(p) for p in snapshot.preferences])
            if snapshot.patterns:
                await conn.executemany(_UPSERT_PATTERN, [pattern_row(p) for p in snapshot.patterns])

        await self._tx(write)
