"""The embedded SQLite `LearningStore`: interactions, preferences and patterns in their own file
(`<data_dir>/learning.db` unless `learning.storage.path` says otherwise), so the entry store's file
and schema version stay untouched. Same plumbing as `adapters/sqlite.py`: WAL, `BEGIN IMMEDIATE`
around every change, one connection used from worker threads behind a lock, `user_version` migrations.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..core.errors import ValidationError
from ..core.learning_records import Interaction, LearningSnapshot, Pattern, Preference, PreferenceChange
from .sqlite_base import SQLiteDatabase, _dt, _ts


LEGACY_CONTENT_SCRUB = """
    UPDATE learning_interactions SET parameters_json = '{}' WHERE tool_name LIKE 'amfs!_%' ESCAPE '!';
    DELETE FROM learning_preferences WHERE category LIKE 'amfs!_%' ESCAPE '!';
    DELETE FROM learning_patterns WHERE pattern_type = 'recurring_parameter' AND tool_name LIKE 'amfs!_%' ESCAPE '!'
"""
"""Before amfs 0.2 stopped recording memory content, calls to its own tools were stored with their
arguments (a memory's value, a query) and learned as preferences: the upgrade drops those arguments
and what was learned from them. Shared with the PostgreSQL learning store."""

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

_INTERACTION_COLUMNS = (
    "interaction_id, user_id, session_id, tool_name, source, parameters_json, outcome_json, result_json, "
    "execution_ms, at"
)
_PREFERENCE_COLUMNS = (
    "user_id, category, key, value_json, confidence, sample_size, support, source, updated_at, sessions, last_session"
)
_PATTERN_COLUMNS = (
    "pattern_id, user_id, pattern_type, tool_name, data_json, occurrences, frequency, confidence, discovered_at, "
    "updated_at"
)
# A stored pattern id is replaced, whoever held it: replace_patterns and import agree, as in PostgreSQL.
_UPSERT_PATTERN = (
    f"INSERT INTO learning_patterns ({_PATTERN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (pattern_id) DO UPDATE SET user_id = excluded.user_id, "
    "pattern_type = excluded.pattern_type, tool_name = excluded.tool_name, "
    "data_json = excluded.data_json, occurrences = excluded.occurrences, "
    "frequency = excluded.frequency, confidence = excluded.confidence, "
    "discovered_at = excluded.discovered_at, updated_at = excluded.updated_at"
)


def dump_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def interaction_row(i: Interaction) -> tuple[Any, ...]:
    """Column values in `_INTERACTION_COLUMNS` order, times left to the caller's dialect (index 9)."""
    return (i.interaction_id, i.user_id, i.session_id, i.tool_name, i.source, dump_json(i.parameters),
            None if i.outcome is None else dump_json(i.outcome), dump_json(i.result), i.execution_ms, i.at)


def preference_row(p: Preference) -> tuple[Any, ...]:
    return (p.user_id, p.category, p.key, dump_json(p.value), p.confidence, p.sample_size, p.support, p.source,
            p.updated_at, p.sessions, p.last_session)


def pattern_row(p: Pattern) -> tuple[Any, ...]:
    return (p.pattern_id, p.user_id, p.pattern_type, p.tool_name, dump_json(p.data), p.occurrences, p.frequency,
            p.confidence, p.discovered_at, p.updated_at)


def row_to_interaction(row: Any, at: datetime) -> Interaction:
    return Interaction(
        row["interaction_id"], row["user_id"], row["session_id"], row["tool_name"], row["source"],
        json.loads(row["parameters_json"]), None if row["outcome_json"] is None else json.loads(row["outcome_json"]),
        json.loads(row["result_json"]), row["execution_ms"], at,
    )


def row_to_preference(row: Any, updated_at: datetime) -> Preference:
    return Preference(
        row["user_id"], row["category"], row["key"], json.loads(row["value_json"]), row["confidence"],
        row["sample_size"], row["support"], row["source"], updated_at, sessions=row["sessions"],
        last_session=row["last_session"],
    )


def row_to_pattern(row: Any, discovered_at: datetime, updated_at: datetime) -> Pattern:
    return Pattern(
        row["pattern_id"], row["user_id"], row["pattern_type"], row["tool_name"], json.loads(row["data_json"]),
        row["occurrences"], row["frequency"], row["confidence"], discovered_at, updated_at,
    )


def import_conflict(what: str) -> ValidationError:
    return ValidationError(
        f"The learning store already holds {what}; import refuses to overwrite and nothing was imported. "
        "Import into an empty store, or `amfs-server memory clear` first."
    )


def _with_times(row: tuple[Any, ...], *indexes: int) -> tuple[Any, ...]:
    return tuple(_ts(value) if index in indexes else value for index, value in enumerate(row))


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
                    conn.execute(
                        f"INSERT INTO learning_interactions ({_INTERACTION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        _with_times(interaction_row(interaction), 9),
                    )
                for change in changes:
                    row = conn.execute(
                        f"SELECT {_PREFERENCE_COLUMNS} FROM learning_preferences WHERE user_id = ? AND category = ? AND key = ?",
                        (change.user_id, change.category, change.key),
                    ).fetchone()
                    previous = None if row is None else row_to_preference(row, _dt(row["updated_at"]))  # type: ignore[arg-type]
                    preference = change.apply(previous)
                    conn.execute(
                        f"INSERT INTO learning_preferences ({_PREFERENCE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT (user_id, category, key) DO UPDATE SET value_json = excluded.value_json, "
                        "confidence = excluded.confidence, sample_size = excluded.sample_size, "
                        "support = excluded.support, source = excluded.source, updated_at = excluded.updated_at, "
                        "sessions = excluded.sessions, last_session = excluded.last_session",
                        _with_times(preference_row(preference), 8),
                    )
                    stored.append(preference)
            return stored

        return await self._run(write)

    async def interactions(self, user_id: str | None = None, limit: int | None = None) -> list[Interaction]:
        where, params = ("WHERE user_id = ?", [user_id]) if user_id is not None else ("", [])
        sql = f"SELECT {_INTERACTION_COLUMNS} FROM learning_interactions {where} ORDER BY at DESC, rowid DESC"
        if limit is not None:
            sql += f" LIMIT {max(0, int(limit))}"  # a negative LIMIT is none to SQLite, an error to PostgreSQL

        def fetch() -> list[Interaction]:
            rows = self._connection().execute(sql, params).fetchall()
            return [row_to_interaction(row, _dt(row["at"])) for row in reversed(rows)]  # type: ignore[arg-type]

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
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""

        def fetch() -> list[Preference]:
            rows = self._connection().execute(
                f"SELECT {_PREFERENCE_COLUMNS} FROM learning_preferences {where} ORDER BY user_id, category, key", params
            ).fetchall()
            return [row_to_preference(row, _dt(row["updated_at"])) for row in rows]  # type: ignore[arg-type]

        return await self._run(fetch)

    async def delete_preference(self, user_id: str | None, category: str, key: str) -> int:
        sql = "DELETE FROM learning_preferences WHERE category = ? AND key = ?"
        params: list[Any] = [category, key]
        if user_id is not None:
            sql += " AND user_id = ?"
            params.append(user_id)

        def delete() -> int:
            with self._transaction() as conn:
                removed = conn.execute(sql, params).rowcount
            if removed:
                self._checkpoint()
            return removed

        return await self._run(delete)

    # -- patterns ---------------------------------------------------------------------------

    async def patterns(self, user_id: str | None = None) -> list[Pattern]:
        where, params = ("WHERE user_id = ?", [user_id]) if user_id is not None else ("", [])

        def fetch() -> list[Pattern]:
            rows = self._connection().execute(
                f"SELECT {_PATTERN_COLUMNS} FROM learning_patterns {where} ORDER BY user_id, pattern_id", params
            ).fetchall()
            return [row_to_pattern(row, _dt(row["discovered_at"]), _dt(row["updated_at"])) for row in rows]  # type: ignore[arg-type]

        return await self._run(fetch)

    async def replace_patterns(self, user_id: str, patterns: Sequence[Pattern]) -> None:
        def write() -> None:
            with self._transaction() as conn:
                conn.execute("DELETE FROM learning_patterns WHERE user_id = ?", (user_id,))
                conn.executemany(_UPSERT_PATTERN, [_with_times(pattern_row(p), 8, 9) for p in patterns])

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
                interactions = [
                    row_to_interaction(row, _dt(row["at"]))  # type: ignore[arg-type]
                    for row in conn.execute(
                        f"SELECT {_INTERACTION_COLUMNS} FROM learning_interactions ORDER BY at, rowid"
                    )
                ]
                preferences = [
                    row_to_preference(row, _dt(row["updated_at"]))  # type: ignore[arg-type]
                    for row in conn.execute(
                        f"SELECT {_PREFERENCE_COLUMNS} FROM learning_preferences ORDER BY user_id, category, key"
                    )
                ]
                patterns = [
                    row_to_pattern(row, _dt(row["discovered_at"]), _dt(row["updated_at"]))  # type: ignore[arg-type]
                    for row in conn.execute(f"SELECT {_PATTERN_COLUMNS} FROM learning_patterns ORDER BY user_id, pattern_id")
                ]
            finally:
                conn.execute("COMMIT")
            return LearningSnapshot(interactions, preferences, patterns)

        return await self._run(fetch)

    async def import_snapshot(self, snapshot: LearningSnapshot, check_only: bool = False) -> None:
        def write() -> None:
            with self._transaction() as conn:
                for i in snapshot.interactions:
                    if conn.execute(
                        "SELECT 1 FROM learning_interactions WHERE interaction_id = ?", (i.interaction_id,)
                    ).fetchone():
                        raise import_conflict(f"interaction {i.interaction_id!r}")
                for p in snapshot.preferences:
                    if conn.execute(
                        "SELECT 1 FROM learning_preferences WHERE user_id = ? AND category = ? AND key = ?",
                        (p.user_id, p.category, p.key),
                    ).fetchone():
                        raise import_conflict(f"preference '{p.name}' of {p.user_id!r}")
                if check_only:
                    return
                conn.executemany(
                    f"INSERT INTO learning_interactions ({_INTERACTION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [_with_times(interaction_row(i), 9) for i in snapshot.interactions],
                )
                conn.executemany(
                    f"INSERT INTO learning_preferences ({_PREFERENCE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [_with_times(preference_row(p), 8) for p in snapshot.preferences],
                )
                conn.executemany(_UPSERT_PATTERN, [_with_times(pattern_row(p), 8, 9) for p in snapshot.patterns])

        await self._run(write)
