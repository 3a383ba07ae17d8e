"""The embedded SQLite `LearningStore`: interactions, preferences and patterns in their own file
(`<data_dir>/learning.db` unless `learning.storage.path` says otherwise), so the entry store's file
and schema version stay untouched. Same plumbing as `adapters/sqlite.py`: WAL, `BEGIN IMMEDIATE`
around every change, one connection used from worker threads behind a lock, `user_version` migrations.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..core.learning_records import Interaction, LearningSnapshot, Pattern, Preference, PreferenceChange
from .sql_common import (
    INTERACTION_COLUMNS,
    LEGACY_CONTENT_SCRUB,
    PATTERN_COLUMNS,
    PREFERENCE_COLUMNS,
    SQLITE,
    export_learning,
    import_learning,
    insert_interaction_sql,
    interaction_from_row,
    interaction_params,
    pattern_from_row,
    pattern_params,
    preference_from_row,
    preference_params,
    run_sqlite,
    select,
    upsert_pattern_sql,
    upsert_preference_sql,
    without_parameter,
)
from .sqlite_base import SQLiteDatabase, _dt, _ts

MIGRATIONS: list[str] = [
    """
    CREATE TABLE learning_interactions (
        interaction_id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        tool_name TEXT NOT NULL,
        source TEXT NOT NULL,
        parameters_json TEXT NOT NULL,
        outcome_json TEXT,
        result_json TEXT NOT NULL,
        execution_ms REAL,
        at REAL NOT NULL
    );
    CREATE INDEX learning_interactions_user_at ON learning_interactions (user_id, at);
    CREATE INDEX learning_interactions_at ON learning_interactions (at);
    CREATE TABLE learning_preferences (
        user_id TEXT NOT NULL,
        category TEXT NOT NULL,
        key TEXT NOT NULL,
        value_json TEXT NOT NULL,
        confidence REAL NOT NULL,
        sample_size INTEGER NOT NULL,
        support INTEGER NOT NULL,
        source TEXT NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (user_id, category, key)
    );
    CREATE TABLE learning_patterns (
        pattern_id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        pattern_type TEXT NOT NULL,
        tool_name TEXT NOT NULL,
        data_json TEXT NOT NULL,
        occurrences INTEGER NOT NULL,
        frequency REAL NOT NULL,
        confidence REAL NOT NULL,
        discovered_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX learning_patterns_user ON learning_patterns (user_id);
    """,
    # The two-session rule (core.learning): how many sessions the current value was seen in, and the last one.
    """
    ALTER TABLE learning_preferences ADD COLUMN sessions INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE learning_preferences ADD COLUMN last_session TEXT NOT NULL DEFAULT '';
    """ + LEGACY_CONTENT_SCRUB,
]

_INSERT_INTERACTION = insert_interaction_sql(SQLITE)
_UPSERT_PREFERENCE = upsert_preference_sql(SQLITE)
_UPSERT_PATTERN = upsert_pattern_sql(SQLITE)


class SQLiteLearningStore(SQLiteDatabase):
    """LearningStore on one SQLite file."""

    name = "sqlite"
    MIGRATIONS = MIGRATIONS
    DESCRIPTION = "SQLite learning store"
    LOCATION_HINT = "set learning.storage.path (AMFS_LEARNING_PATH)"


    # -- interactions and preferences -------------------------------------------------------

    async def record(self, interaction: Interaction | None, changes: Sequence[PreferenceChange]) -> list[Preference]:
        def write() -> list[Preference]:
            stored: list[Preference] = []
            with self._transaction() as conn:
                if interaction is not None:
                    conn.execute(_INSERT_INTERACTION, interaction_params(interaction, SQLITE))
                for change in changes:
                    row = conn.execute(
                        select("learning_preferences", PREFERENCE_COLUMNS, "WHERE user_id = ? AND category = ? AND key = ?"),
                        (change.user_id, change.category, change.key),
                    ).fetchone()
                    preference = change.apply(None if row is None else preference_from_row(row, SQLITE))
                    conn.execute(_UPSERT_PREFERENCE, preference_params(preference, SQLITE))
                    stored.append(preference)
            return stored

        return await self._run(write)

    async def interactions(self, user_id: str | None = None, limit: int | None = None) -> list[Interaction]:
        where, params = ("WHERE user_id = ?", [user_id]) if user_id is not None else ("", [])
        sql = select("learning_interactions", INTERACTION_COLUMNS, f"{where} ORDER BY at DESC, rowid DESC")
        if limit is not None:
            sql += f" LIMIT {max(0, int(limit))}"  # a negative LIMIT is none to SQLite, an error to PostgreSQL

        def fetch() -> list[Interaction]:
            rows = self._connection().execute(sql, params).fetchall()
            return [interaction_from_row(row, SQLITE) for row in reversed(rows)]

        return await self._run(fetch)

    async def interaction_stats(self, user_id: str) -> tuple[int, datetime | None]:
        def fetch() -> tuple[int, datetime | None]:
            row = self._connection().execute(
                "SELECT count(*), max(at) FROM learning_interactions WHERE user_id = ?", (user_id,)
            ).fetchone()
            return row[0], _dt(row[1])

        return await self._run(fetch)

    async def users(self) -> list[str]:
        def fetch() -> list[str]:
            rows = self._connection().execute(
                "SELECT user_id FROM learning_interactions UNION SELECT user_id FROM learning_patterns ORDER BY user_id"
            ).fetchall()
            return [row[0] for row in rows]

        return await self._run(fetch)

    async def purge_interactions(self, before: datetime) -> int:
        def delete() -> int:
            with self._transaction() as conn:
                removed = conn.execute("DELETE FROM learning_interactions WHERE at < ?", (_ts(before),)).rowcount
            if removed:
                self._checkpoint()
            return removed

        return await self._run(delete)

    async def preferences(self, user_id: str | None = None, category: str | None = None) -> list[Preference]:
        clauses, params = [], []
        if user_id is not None:
            clauses.append("user_id = ?")
            params.append(user_id)
        if category is not None:
            clauses.append("category = ?")
            params.append(category)
        where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
        sql = select("learning_preferences", PREFERENCE_COLUMNS, f"{where}ORDER BY user_id, category, key")

        def fetch() -> list[Preference]:
            return [preference_from_row(row, SQLITE) for row in self._connection().execute(sql, params).fetchall()]

        return await self._run(fetch)

    async def delete_preference(self, user_id: str | None, category: str, key: str) -> int:
        sql = "DELETE FROM learning_preferences WHERE category = ? AND key = ?"
        params: list[Any] = [category, key]
        if user_id is not None:
            sql += " AND user_id = ?"
            params.append(user_id)

        users, user_params = ("user_id = ?", [user_id]) if user_id is not None else ("1 = 1", [])

        def delete() -> int:
            with self._transaction() as conn:
                removed = conn.execute(sql, params).rowcount
                if removed:
                    calls = conn.execute(
                        f"SELECT interaction_id, parameters_json FROM learning_interactions WHERE tool_name = ? AND {users}",
                        [category, *user_params],
                    ).fetchall()
                    for interaction_id, parameters_json in calls:
                        if (kept := without_parameter(parameters_json, key)) is not None:
                            conn.execute("UPDATE learning_interactions SET parameters_json = ? WHERE interaction_id = ?",
                                         (kept, interaction_id))
                    conn.execute(f"DELETE FROM learning_patterns WHERE {users}", user_params)
            if removed:
                self._checkpoint()
            return removed

        return await self._run(delete)

    # -- patterns ---------------------------------------------------------------------------

    async def patterns(self, user_id: str | None = None) -> list[Pattern]:
        where, params = ("WHERE user_id = ? ", [user_id]) if user_id is not None else ("", [])
        sql = select("learning_patterns", PATTERN_COLUMNS, f"{where}ORDER BY user_id, pattern_id")

        def fetch() -> list[Pattern]:
            return [pattern_from_row(row, SQLITE) for row in self._connection().execute(sql, params).fetchall()]

        return await self._run(fetch)

    async def replace_patterns(self, user_id: str, patterns: Sequence[Pattern]) -> None:
        def write() -> None:
            with self._transaction() as conn:
                conn.execute("DELETE FROM learning_patterns WHERE user_id = ?", (user_id,))
                conn.executemany(_UPSERT_PATTERN, [pattern_params(p, SQLITE) for p in patterns])

        await self._run(write)

    # -- maintenance --------------------------------------------------------------------------

    async def clear(self) -> None:
        def delete() -> None:
            with self._transaction() as conn:
                for table in ("learning_interactions", "learning_preferences", "learning_patterns"):
                    conn.execute(f"DELETE FROM {table}")
            self._checkpoint(vacuum=True)

        await self._run(delete)

    async def export_snapshot(self) -> LearningSnapshot:
        def fetch() -> LearningSnapshot:
            conn = self._connection()
            conn.execute("BEGIN")  # one consistent read snapshot across tables
            try:
                return run_sqlite(conn, export_learning(SQLITE))
            finally:
                conn.execute("COMMIT")

        return await self._run(fetch)

    async def import_snapshot(self, snapshot: LearningSnapshot, check_only: bool = False) -> None:
        def write() -> None:
            with self._transaction() as conn:
                run_sqlite(conn, import_learning(snapshot, SQLITE, check_only))

        await self._run(write)
