"""The PostgreSQL `LearningStore` (asyncpg): learning tables next to the entry tables, on the same DSN.

Tables `learning_interactions`, `learning_preferences`, `learning_patterns` live in the same schema
as the entry store (the constructor's `schema`, else the DSN's search path, else `amfs`: the rule of
`adapters/postgres_base.py`, shared with the entry store) with their own migration ledger
`learning_schema_migrations`, so the entry store's migrations are untouched. Its own small pool.

Start-up takes the same database-wide advisory lock as the entry store while it creates the schema and
applies migrations, so processes starting together are safe. A preference's read-modify-write takes
`pg_advisory_xact_lock(hashtext(schema || ':learning'), hashtext(user/category/key))` first, so two
processes observing the same preference serialise instead of losing an observation.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..core.learning_records import Interaction, LearningSnapshot, Pattern, Preference, PreferenceChange
from .postgres_base import MIGRATION_LOCK_KEY, PostgresDatabase, rowcount, vacuum
from .sql_common import (
    INTERACTION_COLUMNS,
    LEGACY_CONTENT_SCRUB,
    PATTERN_COLUMNS,
    POSTGRES,
    PREFERENCE_COLUMNS,
    export_learning,
    import_learning,
    insert_interaction_sql,
    interaction_from_row,
    interaction_params,
    pattern_from_row,
    pattern_params,
    preference_from_row,
    preference_params,
    run_postgres,
    select,
    upsert_pattern_sql,
    upsert_preference_sql,
    without_parameter,
)

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

_INSERT_INTERACTION = insert_interaction_sql(POSTGRES)
# An interaction alone (no preference changed): one statement, committed without waiting for the WAL flush, like the
# entry store's read bookkeeping. A PostgreSQL crash may lose the last fraction of a second of such records (as an OS
# crash may on SQLite, synchronous = NORMAL); it never leaves the store inconsistent. set_config(..., true) holds for
# the statement's own transaction, whose commit reads it.
_RECORD_INTERACTION = (
    "WITH settings AS (SELECT set_config('synchronous_commit', 'off', true)) "
    f"INSERT INTO learning_interactions ({', '.join(INTERACTION_COLUMNS)}) "
    f"SELECT {POSTGRES.marks(len(INTERACTION_COLUMNS))} FROM settings"
)
_UPSERT_PREFERENCE = upsert_preference_sql(POSTGRES)
_UPSERT_PATTERN = upsert_pattern_sql(POSTGRES)


class PostgresLearningStore(PostgresDatabase):
    """LearningStore on PostgreSQL; see the module docstring."""

    name = "postgres"
    DESCRIPTION = "PostgreSQL learning store"
    CONNECT_HINT = "Check AMFS_POSTGRES_DSN, or use learning.storage.type: sqlite."
    APPLICATION_NAME = "amfs-server-learning"
    POOL_MAX_SIZE = 4
    NUL_MESSAGE = (
        "PostgreSQL cannot store the NUL character (\\x00) in text; remove it from the user id, session id, "
        "tool name or preference name."
    )

    async def _bootstrap(self, conn: Any) -> None:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
            await self._create_schema(conn)
            await self._migrate(conn, "learning_schema_migrations", MIGRATIONS)

    # -- interactions and preferences -------------------------------------------------------

    async def record(self, interaction: Interaction | None, changes: Sequence[PreferenceChange]) -> list[Preference]:
        if not changes:
            if interaction is not None:
                await self._tx(lambda conn: conn.execute(_RECORD_INTERACTION, *interaction_params(interaction, POSTGRES)),
                               transaction=False)
            return []
        names = sorted({f"{c.user_id}\x1f{c.category}\x1f{c.key}" for c in changes})

        async def write(conn: Any) -> list[Preference]:
            if interaction is not None:
                await conn.execute(_INSERT_INTERACTION, *interaction_params(interaction, POSTGRES))
            if names:
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtext($1), h) FROM "
                    "(SELECT DISTINCT hashtext(n) AS h FROM unnest($2::text[]) AS n ORDER BY h) AS locks",
                    f"{self.schema}:learning", names,
                )
            stored: list[Preference] = []
            for change in changes:
                row = await conn.fetchrow(
                    select("learning_preferences", PREFERENCE_COLUMNS, "WHERE user_id = $1 AND category = $2 AND key = $3"),
                    change.user_id, change.category, change.key,
                )
                preference = change.apply(None if row is None else preference_from_row(row, POSTGRES))
                await conn.execute(_UPSERT_PREFERENCE, *preference_params(preference, POSTGRES))
                stored.append(preference)
            return stored

        return await self._tx(write)

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        rows: list[Any] = await self._read(lambda conn: conn.fetch(sql, *args))
        return rows

    async def interactions(self, user_id: str | None = None, limit: int | None = None) -> list[Interaction]:
        where, args = ("WHERE user_id = $1", [user_id]) if user_id is not None else ("", [])
        sql = select("learning_interactions", INTERACTION_COLUMNS, f"{where} ORDER BY at DESC, seq DESC")
        if limit is not None:
            sql += f" LIMIT {max(0, int(limit))}"  # a negative LIMIT is none to SQLite, an error to PostgreSQL
        rows = await self._fetch(sql, *args)
        return [interaction_from_row(row, POSTGRES) for row in reversed(rows)]

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
            return rowcount(await conn.execute("DELETE FROM learning_interactions WHERE at < $1", before))

        removed = await self._tx(delete)
        if removed:
            await vacuum(self._require_pool(), self.where, "learning_interactions")
        return removed

    async def preferences(self, user_id: str | None = None, category: str | None = None) -> list[Preference]:
        rows = await self._fetch(
            select(
                "learning_preferences", PREFERENCE_COLUMNS,
                "WHERE ($1::text IS NULL OR user_id = $1) AND ($2::text IS NULL OR category = $2) "
                "ORDER BY user_id, category, key",
            ),
            user_id, category,
        )
        return [preference_from_row(row, POSTGRES) for row in rows]

    async def delete_preference(self, user_id: str | None, category: str, key: str) -> int:
        async def delete(conn: Any) -> int:
            removed = rowcount(await conn.execute(
                "DELETE FROM learning_preferences WHERE category = $1 AND key = $2 AND ($3::text IS NULL OR user_id = $3)",
                category, key, user_id,
            ))
            if removed:
                calls = await conn.fetch(
                    "SELECT interaction_id, parameters_json FROM learning_interactions "
                    "WHERE tool_name = $1 AND ($2::text IS NULL OR user_id = $2)", category, user_id,
                )
                for call in calls:
                    if (kept := without_parameter(call["parameters_json"], key)) is not None:
                        await conn.execute("UPDATE learning_interactions SET parameters_json = $1 WHERE interaction_id = $2",
                                           kept, call["interaction_id"])
                await conn.execute("DELETE FROM learning_patterns WHERE ($1::text IS NULL OR user_id = $1)", user_id)
            return removed

        removed = await self._tx(delete)
        if removed:
            await vacuum(self._require_pool(), self.where, "learning_preferences", "learning_interactions",
                         "learning_patterns")
        return removed

    # -- patterns ---------------------------------------------------------------------------

    async def patterns(self, user_id: str | None = None) -> list[Pattern]:
        rows = await self._fetch(
            select(
                "learning_patterns", PATTERN_COLUMNS,
                "WHERE ($1::text IS NULL OR user_id = $1) ORDER BY user_id, pattern_id",
            ),
            user_id,
        )
        return [pattern_from_row(row, POSTGRES) for row in rows]

    async def replace_patterns(self, user_id: str, patterns: Sequence[Pattern]) -> None:
        async def write(conn: Any) -> None:
            await conn.execute("DELETE FROM learning_patterns WHERE user_id = $1", user_id)
            if patterns:
                await conn.executemany(_UPSERT_PATTERN, [pattern_params(p, POSTGRES) for p in patterns])

        await self._tx(write)

    # -- maintenance --------------------------------------------------------------------------

    async def clear(self) -> None:
        async def delete(conn: Any) -> None:
            await conn.execute("TRUNCATE learning_interactions, learning_preferences, learning_patterns")

        await self._tx(delete)

    async def export_snapshot(self) -> LearningSnapshot:
        # One consistent snapshot across the three tables.
        return await self._tx(
            lambda conn: run_postgres(conn, export_learning(POSTGRES)), readonly=True, isolation="repeatable_read"
        )

    async def import_snapshot(self, snapshot: LearningSnapshot, check_only: bool = False) -> None:
        await self._tx(lambda conn: run_postgres(conn, import_learning(snapshot, POSTGRES, check_only)))
