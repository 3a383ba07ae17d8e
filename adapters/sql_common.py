"""What the SQLite and PostgreSQL stores share: one mapping between rows and records, one tie-break
table, and one import / export path.

A `Dialect` holds what differs between the two databases for the same column: timestamps (epoch
seconds in SQLite, timestamptz in PostgreSQL), booleans, embeddings (a float32 blob, a pgvector), the
parameter marks (`?`, `$n`) and the insertion-order column (`rowid`, `seq`). Everything else, the
column lists, the row -> record mapping and back, and the order of import and export, is written once.

Import and export are written as generators of `Step`s (a query to fetch, rows to insert, keys to look
up) that each store runs on its own connection: `run_sqlite` in its worker thread, `run_postgres` on an
asyncpg connection, inside the transaction the store opens. So the sequence of checks and writes is the
same code for both stores, and only the SQL text differs.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, TypeVar

from ..core.confidence import bounded_confidence
from ..core.errors import ValidationError
from ..core.learning_records import Interaction, LearningSnapshot, Pattern, Preference
from ..core.models import (
    AMFS_VERSION,
    MemoryEntry,
    MemoryType,
    NewEntry,
    OutcomeEffect,
    OutcomeRecord,
    OutcomeType,
    Provenance,
    SortBy,
    Tier,
    TraceEvent,
    ValueHead,
)
from ..core.ports import StoreSnapshot, vector_width
from ..core.retrieval import distinct_words, keyword_length_factor, search_form, words_apart

T = TypeVar("T")


# -- dialects ---------------------------------------------------------------------------------


class Dialect:
    """One database's spelling of the shared columns. Subclasses: `SQLiteDialect`, `PostgresDialect`."""

    name = ""
    seq = ""
    """The column holding insertion order, the last tie-break wherever times are equal."""
    nulls_last = ""
    """What `DESC` needs to put NULLs last (SQLite's DESC already does)."""

    def mark(self, position: int) -> str:
        """The placeholder of the `position`-th (1-based) parameter."""
        raise NotImplementedError

    def marks(self, count: int, start: int = 1) -> str:
        return ", ".join(self.mark(position) for position in range(start, start + count))

    def ts(self, moment: datetime | None) -> Any:
        return moment

    def dt(self, value: Any) -> datetime | None:
        return value  # type: ignore[no-any-return]

    def flag(self, value: bool) -> Any:
        return value

    def embedding_param(self, embedding: list[float] | None) -> Any:
        return embedding

    def embedding_value(self, value: Any) -> list[float] | None:
        raise NotImplementedError

    def search_text(self, text: str) -> str:
        return search_form(text)

    def passages_param(self, passages: list[list[float]] | None, embedding: list[float] | None) -> bytes | None:
        """Passage embeddings as one float32 blob, rows one after another (both stores): each row as long as the
        entry's embedding, which tells the row length when it is read back."""
        if not passages:
            return None
        if embedding is None or any(len(row) != len(embedding) for row in passages):
            raise ValidationError(
                "passage embeddings need an entry embedding of the same dimension; re-embed the store with "
                "`amfs-server memory reembed` if it came from another embedder.")
        import numpy as np

        return np.asarray(passages, dtype=np.float32).tobytes()

    def passages_array(self, value: Any, dimension: int) -> Any:
        """The blob back as a (passages, dimension) float32 array (a view, no copy), or None."""
        if value is None or dimension <= 0:
            return None
        import numpy as np

        return np.frombuffer(bytes(value) if isinstance(value, memoryview) else value, dtype=np.float32).reshape(
            -1, dimension)

    def under(self, column: str, entity_path: str) -> tuple[str, tuple[Any, ...]]:
        """SQL for `column` being `entity_path` or a path below it, with its parameters (numbered from 1)."""
        raise NotImplementedError

    def insert(self, table: str, columns: Sequence[str], suffix: str = "") -> str:
        return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({self.marks(len(columns))}){suffix}"

    def upsert(self, table: str, columns: Sequence[str], key: Sequence[str]) -> str:
        """Insert, or replace every non-key column of the row with the same `key`."""
        updates = ", ".join(f"{column} = excluded.{column}" for column in columns if column not in key)
        return self.insert(table, columns, f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}")


class SQLiteDialect(Dialect):
    name = "sqlite"
    seq = "rowid"

    def mark(self, position: int) -> str:
        return "?"

    def under(self, column: str, entity_path: str) -> tuple[str, tuple[Any, ...]]:
        # Without LIKE (paths contain `_`): a path starts with `p/` exactly when it sorts from `p/` up to, not
        # including, `p0` ('0' follows '/'), a range the (entity_path, key) index answers.
        return (f"({column} = ? OR ({column} >= ? AND {column} < ?))",
                (entity_path, entity_path + "/", entity_path + "0"))

    def ts(self, moment: datetime | None) -> float | None:
        return None if moment is None else moment.timestamp()

    def dt(self, value: Any) -> datetime | None:
        return None if value is None else datetime.fromtimestamp(value, tz=timezone.utc)

    def flag(self, value: bool) -> int:
        return int(value)

    def embedding_param(self, embedding: list[float] | None) -> bytes | None:
        if embedding is None:
            return None
        import numpy as np

        return np.asarray(embedding, dtype=np.float32).tobytes()

    def embedding_value(self, value: Any) -> list[float] | None:
        if value is None:
            return None
        import numpy as np

        values: list[float] = np.frombuffer(value, dtype=np.float32).tolist()
        return values


class PostgresDialect(Dialect):
    name = "postgres"
    seq = "seq"
    nulls_last = " NULLS LAST"

    def mark(self, position: int) -> str:
        return f"${position}"

    def under(self, column: str, entity_path: str) -> tuple[str, tuple[Any, ...]]:
        return f"({column} = $1 OR starts_with({column}, $1 || '/'))", (entity_path,)

    def embedding_value(self, value: Any) -> list[float] | None:
        if value is None:
            return None
        if hasattr(value, "to_list"):
            return [float(x) for x in value.to_list()]
        return [float(x) for x in value]

    def search_text(self, text: str) -> str:
        """Search text is only for matching: its words apart (`words_apart`: PostgreSQL's parser joins words at dots,
        slashes and @ into tokens no query matches), and NUL, which PostgreSQL text cannot hold, gone with them."""
        return words_apart(search_form(text))


SQLITE = SQLiteDialect()
POSTGRES = PostgresDialect()


def dump_json(value: Any) -> str:
    """Compact JSON that keeps non-ASCII text as it is (values are stored as their exact JSON text)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def without_parameter(parameters_json: str, name: str) -> str | None:
    """A recorded call's parameters without `name` (what a forgotten preference was learned from); None when
    it has no such parameter."""
    parameters = json.loads(parameters_json)
    if not isinstance(parameters, dict) or name not in parameters:
        return None
    del parameters[name]
    return dump_json(parameters)


# -- entries ----------------------------------------------------------------------------------

ENTRY_BASE_COLUMNS = (
    "row_id, entity_path, key, version, value_json, confidence, agent_id, session_id, written_at, "
    "outcome_count, recall_count, ttl_at, memory_type, tier, priority_score, importance_score, "
    "importance_dimensions, amfs_version, event_at"
)
ENTRY_COLUMNS = ENTRY_BASE_COLUMNS + ", embedding, passage_embeddings, context_key"
# The base columns with every value read as JSON null (`find_current(values=False)`).
ENTRY_COLUMNS_WITHOUT_VALUES = ENTRY_BASE_COLUMNS.replace("value_json", "'null' AS value_json")


def value_columns(head: int | None, table: str = "") -> str:
    """The value's columns for `value_from_row`: `value_json`, or with `head`, a value whose JSON is longer than
    `head` characters as its first `head` characters and its length (a `ValueHead`), so a listing parses none of
    a long value. The same SQL on both stores: length and substr count characters of text on both."""
    column = f"{table}value_json"
    if head is None:
        return column
    head = int(head)
    if head < 1:  # PostgreSQL refuses a negative substr length, SQLite returns ''
        raise ValueError(f"value_head must be at least 1, got {head}")
    return (f"CASE WHEN length({column}) <= {head} THEN {column} END AS value_json, "
            f"CASE WHEN length({column}) > {head} THEN substr({column}, 1, {head}) END AS value_head, "
            f"length({column}) AS value_chars")


def entry_columns(head: int | None, columns: str = ENTRY_BASE_COLUMNS) -> str:
    """`columns` (which name `value_json` once) with the value read as `value_columns` reads it."""
    return columns.replace("value_json", value_columns(head), 1)


def read_columns(values: bool, value_head: int | None) -> str:
    """The base columns with the value (`value_head` as in `value_columns`), or with JSON null in its place."""
    return entry_columns(value_head) if values else ENTRY_COLUMNS_WITHOUT_VALUES


# What `length_scaled` reads of a keyword candidate's row: its word count, and its search text only where a server
# before 0.7.13 wrote it without one.
WORD_COUNT_COLUMNS = "distinct_words, CASE WHEN distinct_words IS NULL THEN search_text END AS search_text"


def length_scaled(hits: list[tuple[MemoryEntry, float, Any]]) -> list[tuple[MemoryEntry, float]]:
    """Keyword candidates (entry, share, row read with `WORD_COUNT_COLUMNS`) in the stores' order, each share times
    the length factor of the text it was matched on, re-sorted stably: an entry of very many distinct words no longer
    holds the question's words by its length alone. Counted on the stored search text when it was written, not on
    the value: a value of 1 MiB is neither read nor serialised to rank it (both stores, so they rank alike)."""
    scaled = [(entry, share * keyword_length_factor(_words_of(row))) for entry, share, row in hits]
    return sorted(scaled, key=lambda pair: -pair[1])


def _words_of(row: Any) -> int:
    count = row["distinct_words"]
    return distinct_words(row["search_text"]) if count is None else int(count)


def value_from_row(row: Any) -> Any:
    """The row's value, or its `ValueHead` when it was read by `value_columns` with a head and is long."""
    if row["value_json"] is None:  # NOT NULL in the table: only a head read leaves it out
        return ValueHead(row["value_head"], int(row["value_chars"]))
    return json.loads(row["value_json"])
ENTRY_INSERT_COLUMNS = (
    "entity_path", "key", "version", "is_current", "value_json", "confidence", "agent_id", "session_id",
    "written_at", "outcome_count", "recall_count", "ttl_at", "memory_type", "tier", "priority_score",
    "importance_score", "importance_dimensions", "embedding", "amfs_version", "search_text", "event_at",
    "passage_embeddings", "context_key", "distinct_words",
)


def sort_sql(d: Dialect) -> dict[SortBy, str]:
    """ORDER BY of each `SortBy`. Ties go to the newer write: written_at, then row_id (a batch shares one
    written_at, and both stores insert a batch in key order)."""
    return {
        "confidence": "confidence DESC, written_at DESC, row_id DESC",
        "recency": "written_at DESC, row_id DESC",
        "recall_count": "recall_count DESC, written_at DESC, row_id DESC",
        "priority": f"priority_score DESC{d.nulls_last}, written_at DESC, row_id DESC",
        "path": "entity_path, key",
    }


def entry_from_row(row: Any, d: Dialect, with_embedding: bool = True) -> MemoryEntry:
    dims = row["importance_dimensions"]
    embedding = d.embedding_value(row["embedding"]) if with_embedding else None
    passages = d.passages_array(row["passage_embeddings"], len(embedding)) if embedding else None
    return MemoryEntry(
        entity_path=row["entity_path"],
        key=row["key"],
        value=value_from_row(row),
        version=row["version"],
        confidence=bounded_confidence(row["confidence"]),
        provenance=Provenance(row["agent_id"], row["session_id"], d.dt(row["written_at"])),  # type: ignore[arg-type]
        outcome_count=row["outcome_count"],
        recall_count=row["recall_count"],
        ttl_at=d.dt(row["ttl_at"]),
        memory_type=MemoryType(row["memory_type"]),
        tier=Tier(row["tier"]),
        priority_score=row["priority_score"],
        importance_score=row["importance_score"],
        importance_dimensions=json.loads(dims) if dims else None,
        embedding=embedding,
        amfs_version=row["amfs_version"],
        event_at=d.dt(row["event_at"]),
        passage_embeddings=None if passages is None else passages.tolist(),
        context_key=row["context_key"] if with_embedding else None,
    )


def draft_params(draft: NewEntry, version: int, d: Dialect) -> tuple[Any, ...]:
    """`ENTRY_INSERT_COLUMNS` values of a new current version."""
    search_text = d.search_text(draft.search_text)
    return (
        draft.entity_path, draft.key, version, d.flag(True), draft.value_json, float(draft.confidence),
        draft.agent_id, draft.session_id, d.ts(draft.written_at), 0, 0, d.ts(draft.ttl_at), draft.memory_type.value,
        int(draft.tier), draft.priority_score, draft.importance_score, _dimensions_json(draft.importance_dimensions),
        d.embedding_param(draft.embedding), AMFS_VERSION, search_text, d.ts(draft.event_at),
        d.passages_param(draft.passage_embeddings, draft.embedding), draft.context_key, distinct_words(search_text),
    )


def entry_params(entry: MemoryEntry, is_current: bool, d: Dialect) -> tuple[Any, ...]:
    """`ENTRY_INSERT_COLUMNS` values of an imported version, as it was exported."""
    from ..core.embedding import embedding_text

    search_text = d.search_text(embedding_text(entry.entity_path, entry.key, entry.value, entry.event_at))
    return (
        entry.entity_path, entry.key, entry.version, d.flag(is_current), dump_json(entry.value),
        float(entry.confidence), entry.provenance.agent_id, entry.provenance.session_id,
        d.ts(entry.provenance.written_at), entry.outcome_count, entry.recall_count, d.ts(entry.ttl_at),
        entry.memory_type.value, int(entry.tier), entry.priority_score, entry.importance_score,
        _dimensions_json(entry.importance_dimensions), d.embedding_param(entry.embedding), entry.amfs_version,
        search_text, d.ts(entry.event_at), d.passages_param(entry.passage_embeddings, entry.embedding),
        entry.context_key, distinct_words(search_text),
    )


def _dimensions_json(dimensions: dict[str, float] | None) -> str | None:
    return json.dumps(dimensions) if dimensions else None


# -- traces, outcomes, meta -------------------------------------------------------------------

TRACE_INSERT_COLUMNS = ("session_id", "agent_id", "kind", "entity_path", "key", "version", "at", "detail")
TRACE_COLUMNS = ", ".join(TRACE_INSERT_COLUMNS)
OUTCOME_COLUMNS = ("outcome_ref", "outcome_type", "multiplier", "committed_at", "agent_id", "session_id")
EFFECT_COLUMNS = (
    "outcome_ref", "position", "entity_path", "key", "version_read", "version_updated", "confidence_before",
    "confidence_after",
)


def trace_params(
    session_id: str, agent_id: str, kind: str, entity_path: str, key: str, version: int, at: datetime,
    detail: dict[str, Any] | None, d: Dialect,
) -> tuple[Any, ...]:
    return (session_id, agent_id, kind, entity_path, key, version, d.ts(at), None if detail is None else json.dumps(detail))


def trace_from_row(row: Any, d: Dialect) -> TraceEvent:
    detail = row["detail"]
    return TraceEvent(
        row["session_id"], row["agent_id"], row["kind"], row["entity_path"], row["key"], row["version"],
        d.dt(row["at"]),  # type: ignore[arg-type]
        json.loads(detail) if detail else None,
    )


def outcome_params(
    outcome_ref: str, outcome_type: OutcomeType, multiplier: float, committed_at: datetime, agent_id: str,
    session_id: str, d: Dialect,
) -> tuple[Any, ...]:
    return (outcome_ref, outcome_type.value, float(multiplier), d.ts(committed_at), agent_id, session_id)


def effect_params(outcome_ref: str, effects: Iterable[OutcomeEffect]) -> list[tuple[Any, ...]]:
    return [
        (outcome_ref, position, e.entity_path, e.key, e.version_read, e.version_updated, e.confidence_before,
         e.confidence_after)
        for position, e in enumerate(effects)
    ]


def already_applied(record: OutcomeRecord) -> OutcomeRecord:
    return replace(record, already_applied=True)


def upsert_meta_sql(d: Dialect) -> str:
    return d.upsert("meta", ("name", "value_json"), ("name",))


# -- steps: what import and export ask of a connection -----------------------------------------


@dataclass(frozen=True)
class Fetch:
    """Every row of one query."""

    sql: str
    params: tuple[Any, ...] = ()


@dataclass(frozen=True)
class ExecuteMany:
    """One statement for each of `rows` (nothing when there are none)."""

    sql: str
    rows: list[tuple[Any, ...]] = field(default_factory=list)


@dataclass(frozen=True)
class FirstExisting:
    """The first of `keys`, in their order, that `table` holds (matched on the text `columns`), or None."""

    table: str
    columns: tuple[str, ...]
    keys: Sequence[tuple[str, ...]]


Step = Fetch | ExecuteMany | FirstExisting
Steps = Generator[Step, Any, T]


def run_sqlite(conn: Any, steps: Steps[T]) -> T:
    """Run `steps` on a sqlite3 connection (in the caller's transaction)."""
    reply: Any = None
    while True:
        try:
            step = steps.send(reply)
        except StopIteration as done:
            result: T = done.value
            return result
        if isinstance(step, Fetch):
            reply = conn.execute(step.sql, step.params).fetchall()
        elif isinstance(step, ExecuteMany):
            if step.rows:
                conn.executemany(step.sql, step.rows)
            reply = None
        else:
            sql = f"SELECT 1 FROM {step.table} WHERE {' AND '.join(f'{c} = ?' for c in step.columns)} LIMIT 1"
            reply = next((key for key in step.keys if conn.execute(sql, key).fetchone() is not None), None)


async def run_postgres(conn: Any, steps: Steps[T]) -> T:
    """Run `steps` on an asyncpg connection (in the caller's transaction)."""
    reply: Any = None
    while True:
        try:
            step = steps.send(reply)
        except StopIteration as done:
            result: T = done.value
            return result
        if isinstance(step, Fetch):
            reply = await conn.fetch(step.sql, *step.params)
        elif isinstance(step, ExecuteMany):
            if step.rows:
                await conn.executemany(step.sql, step.rows)
            reply = None
        else:
            reply = None
            if step.keys:
                columns = ", ".join(f"n.{c}" for c in step.columns)
                arrays = ", ".join(f"${i}::text[]" for i in range(1, len(step.columns) + 1))
                match = " AND ".join(f"t.{c} = n.{c}" for c in step.columns)
                row = await conn.fetchrow(
                    f"SELECT {columns} FROM unnest({arrays}) WITH ORDINALITY AS n ({', '.join(step.columns)}, ord) "
                    f"WHERE EXISTS (SELECT 1 FROM {step.table} t WHERE {match}) ORDER BY n.ord LIMIT 1",
                    *([key[i] for key in step.keys] for i in range(len(step.columns))),
                )
                reply = None if row is None else tuple(row)


# -- the entry store's import and export --------------------------------------------------------


def outcome_records(
    d: Dialect, where: str = "", params: tuple[Any, ...] = (), *, newest_first: bool = False, offset: int = 0,
    limit: int | None = None,
) -> Steps[list[OutcomeRecord]]:
    """The outcomes `where` (on `outcomes o`) selects, oldest first (or newest first), each with its effects in
    order; `offset` and `limit` page them in the query, so a page costs its own rows, not the store's."""
    order = " DESC" if newest_first else ""
    page = "" if limit is None else f" LIMIT {int(limit)} OFFSET {int(offset)}"
    if limit is None and offset:
        raise ValueError("an offset needs a limit")
    outcome_rows = yield Fetch(
        f"SELECT o.{', o.'.join(OUTCOME_COLUMNS)} FROM outcomes o {where} "
        f"ORDER BY o.committed_at{order}, o.{d.seq}{order}{page}", params
    )
    if not outcome_rows:
        return []
    if limit is None:
        effect_rows = yield Fetch(
            f"SELECT {', '.join(EFFECT_COLUMNS)} FROM outcome_effects "
            f"WHERE outcome_ref IN (SELECT o.outcome_ref FROM outcomes o {where}) ORDER BY outcome_ref, position",
            params,
        )
    else:
        refs = tuple(row["outcome_ref"] for row in outcome_rows)
        effect_rows = yield Fetch(
            f"SELECT {', '.join(EFFECT_COLUMNS)} FROM outcome_effects "
            f"WHERE outcome_ref IN ({d.marks(len(refs))}) ORDER BY outcome_ref, position",
            refs,
        )
    effects: dict[str, list[OutcomeEffect]] = {}
    for e in effect_rows:
        effects.setdefault(e["outcome_ref"], []).append(
            OutcomeEffect(
                e["entity_path"], e["key"], e["version_read"], e["version_updated"],
                bounded_confidence(e["confidence_before"]), bounded_confidence(e["confidence_after"]),
            )
        )
    return [
        OutcomeRecord(
            row["outcome_ref"], OutcomeType(row["outcome_type"]), row["multiplier"],
            d.dt(row["committed_at"]),  # type: ignore[arg-type]
            row["agent_id"], row["session_id"], tuple(effects.get(row["outcome_ref"], ())),
        )
        for row in outcome_rows
    ]


def outcome_filter(d: Dialect, entity_path: str | None, key: str | None) -> tuple[str, tuple[Any, ...]]:
    """The WHERE clause (on `outcomes o`) for the outcomes with an effect on `entity_path` or below it, or with `key`
    on that one entry; none for every outcome."""
    if entity_path is None:
        if key is not None:
            raise ValueError("an outcome filter by key needs its entity path")
        return "", ()
    if key is not None:
        clause, params = f"e.entity_path = {d.mark(1)} AND e.key = {d.mark(2)}", (entity_path, key)
    else:
        clause, params = d.under("e.entity_path", entity_path)
    return f"WHERE o.outcome_ref IN (SELECT e.outcome_ref FROM outcome_effects e WHERE {clause})", params


def count_outcomes(where: str = "", params: tuple[Any, ...] = ()) -> Steps[int]:
    """How many outcomes `where` (on `outcomes o`) selects."""
    rows = yield Fetch(f"SELECT COUNT(*) AS n FROM outcomes o {where}", params)
    return int(rows[0]["n"])


def export_store(d: Dialect, hidden_meta: Sequence[str] = ()) -> Steps[StoreSnapshot]:
    """Every version of every key, the outcomes, the traces and the meta rows (less `hidden_meta`), in export
    order. Run it inside one read transaction, so the tables agree."""
    entry_rows = yield Fetch(f"SELECT {ENTRY_COLUMNS} FROM entries ORDER BY entity_path, key, version")
    outcomes = yield from outcome_records(d)
    trace_rows = yield Fetch(f"SELECT {TRACE_COLUMNS} FROM trace_events ORDER BY event_id")
    meta_rows = yield Fetch("SELECT name, value_json FROM meta ORDER BY name")
    return StoreSnapshot(
        [entry_from_row(row, d) for row in entry_rows],
        outcomes,
        [trace_from_row(row, d) for row in trace_rows],
        {row["name"]: json.loads(row["value_json"]) for row in meta_rows if row["name"] not in hidden_meta},
    )


def latest_versions(snapshot: StoreSnapshot) -> dict[tuple[str, str], int]:
    """Each imported key's newest version (the one that becomes current)."""
    latest: dict[tuple[str, str], int] = {}
    for entry in snapshot.entries:
        pair = (entry.entity_path, entry.key)
        latest[pair] = max(latest.get(pair, 0), entry.version)
    return latest


def _repeated(keys: Iterable[tuple[str, ...]]) -> tuple[str, ...] | None:
    """The first key that occurs a second time, or None."""
    seen: set[tuple[str, ...]] = set()
    for key in keys:
        if key in seen:
            return key
        seen.add(key)
    return None


# What a store raises (ConflictError) when `import_snapshot(replacing=...)` finds it no longer that snapshot.
STORE_CHANGED = "the store changed after the snapshot being replaced was taken"


def import_store(snapshot: StoreSnapshot, d: Dialect) -> Steps[None]:
    """Write `snapshot` into a store that holds none of its keys and none of its outcome refs; refuses
    (before writing anything) otherwise, and when its vectors mix widths. Run it inside one write transaction."""
    vector_width(snapshot)
    latest = latest_versions(snapshot)
    taken = yield FirstExisting("entries", ("entity_path", "key"), sorted(latest))
    if taken is not None:
        raise ValidationError(
            f"The store already holds '{taken[0]}/{taken[1]}'; import refuses to overwrite. "
            "Import into an empty store, or `memory forget` that key first."
        )
    refs = [(record.outcome_ref,) for record in snapshot.outcomes]
    taken = _repeated(refs)
    if taken is None:
        taken = yield FirstExisting("outcomes", ("outcome_ref",), refs)
    if taken is not None:  # a ref the snapshot repeats would be in the store by its second import
        raise ValidationError(f"Outcome {taken[0]!r} is already in the store; nothing imported.")
    yield ExecuteMany(
        d.insert("entries", ENTRY_INSERT_COLUMNS),
        [entry_params(e, latest[(e.entity_path, e.key)] == e.version, d) for e in snapshot.entries],
    )
    yield ExecuteMany(
        d.insert("outcomes", OUTCOME_COLUMNS),
        [
            outcome_params(r.outcome_ref, r.outcome_type, r.multiplier, r.committed_at, r.agent_id, r.session_id, d)
            for r in snapshot.outcomes
        ],
    )
    yield ExecuteMany(
        d.insert("outcome_effects", EFFECT_COLUMNS),
        [row for r in snapshot.outcomes for row in effect_params(r.outcome_ref, r.effects)],
    )
    yield ExecuteMany(
        d.insert("trace_events", TRACE_INSERT_COLUMNS),
        [
            trace_params(t.session_id, t.agent_id, t.kind, t.entity_path, t.key, t.version, t.at, t.detail, d)
            for t in snapshot.traces
        ],
    )
    yield ExecuteMany(upsert_meta_sql(d), [(name, json.dumps(value)) for name, value in snapshot.meta.items()])


# -- the learning store ------------------------------------------------------------------------

LEGACY_CONTENT_SCRUB = """
    UPDATE learning_interactions SET parameters_json = '{}' WHERE tool_name LIKE 'amfs!_%' ESCAPE '!';
    DELETE FROM learning_preferences WHERE category LIKE 'amfs!_%' ESCAPE '!';
    DELETE FROM learning_patterns WHERE pattern_type = 'recurring_parameter' AND tool_name LIKE 'amfs!_%' ESCAPE '!'
"""
"""Before amfs 0.2 stopped recording memory content, calls to its own tools were stored with their
arguments (a memory's value, a query) and learned as preferences: the upgrade drops those arguments
and what was learned from them. Both learning stores run it in their second migration."""

INTERACTION_COLUMNS = (
    "interaction_id", "user_id", "session_id", "tool_name", "source", "parameters_json", "outcome_json",
    "result_json", "execution_ms", "at",
)
PREFERENCE_COLUMNS = (
    "user_id", "category", "key", "value_json", "confidence", "sample_size", "support", "source", "updated_at",
    "sessions", "last_session",
)
PATTERN_COLUMNS = (
    "pattern_id", "user_id", "pattern_type", "tool_name", "data_json", "occurrences", "frequency", "confidence",
    "discovered_at", "updated_at",
)
PREFERENCE_KEY = ("user_id", "category", "key")


def insert_interaction_sql(d: Dialect) -> str:
    return d.insert("learning_interactions", INTERACTION_COLUMNS)


def upsert_preference_sql(d: Dialect) -> str:
    return d.upsert("learning_preferences", PREFERENCE_COLUMNS, PREFERENCE_KEY)


def upsert_pattern_sql(d: Dialect) -> str:
    """A stored pattern id is replaced, whoever held it: replace_patterns and import agree."""
    return d.upsert("learning_patterns", PATTERN_COLUMNS, ("pattern_id",))


def interaction_params(i: Interaction, d: Dialect) -> tuple[Any, ...]:
    return (i.interaction_id, i.user_id, i.session_id, i.tool_name, i.source, dump_json(i.parameters),
            None if i.outcome is None else dump_json(i.outcome), dump_json(i.result), i.execution_ms, d.ts(i.at))


def preference_params(p: Preference, d: Dialect) -> tuple[Any, ...]:
    return (p.user_id, p.category, p.key, dump_json(p.value), p.confidence, p.sample_size, p.support, p.source,
            d.ts(p.updated_at), p.sessions, p.last_session)


def pattern_params(p: Pattern, d: Dialect) -> tuple[Any, ...]:
    return (p.pattern_id, p.user_id, p.pattern_type, p.tool_name, dump_json(p.data), p.occurrences, p.frequency,
            p.confidence, d.ts(p.discovered_at), d.ts(p.updated_at))


def interaction_from_row(row: Any, d: Dialect) -> Interaction:
    outcome = row["outcome_json"]
    return Interaction(
        row["interaction_id"], row["user_id"], row["session_id"], row["tool_name"], row["source"],
        json.loads(row["parameters_json"]), None if outcome is None else json.loads(outcome),
        json.loads(row["result_json"]), row["execution_ms"], d.dt(row["at"]),  # type: ignore[arg-type]
    )


def preference_from_row(row: Any, d: Dialect) -> Preference:
    return Preference(
        row["user_id"], row["category"], row["key"], json.loads(row["value_json"]), row["confidence"],
        row["sample_size"], row["support"], row["source"], d.dt(row["updated_at"]),  # type: ignore[arg-type]
        sessions=row["sessions"], last_session=row["last_session"],
    )


def pattern_from_row(row: Any, d: Dialect) -> Pattern:
    return Pattern(
        row["pattern_id"], row["user_id"], row["pattern_type"], row["tool_name"], json.loads(row["data_json"]),
        row["occurrences"], row["frequency"], row["confidence"],
        d.dt(row["discovered_at"]), d.dt(row["updated_at"]),  # type: ignore[arg-type]
    )


def select(table: str, columns: Sequence[str], rest: str = "") -> str:
    return f"SELECT {', '.join(columns)} FROM {table}{' ' + rest if rest else ''}"


def import_conflict(what: str) -> ValidationError:
    return ValidationError(
        f"The learning store already holds {what}; import refuses to overwrite and nothing was imported. "
        "Import into an empty store, or `amfs-server memory clear` first."
    )


def export_learning(d: Dialect) -> Steps[LearningSnapshot]:
    """Interactions oldest first (insertion order breaks ties), preferences and patterns in key order.
    Run it inside one read transaction."""
    interactions = yield Fetch(select("learning_interactions", INTERACTION_COLUMNS, f"ORDER BY at, {d.seq}"))
    preferences = yield Fetch(select("learning_preferences", PREFERENCE_COLUMNS, "ORDER BY user_id, category, key"))
    patterns = yield Fetch(select("learning_patterns", PATTERN_COLUMNS, "ORDER BY user_id, pattern_id"))
    return LearningSnapshot(
        [interaction_from_row(row, d) for row in interactions],
        [preference_from_row(row, d) for row in preferences],
        [pattern_from_row(row, d) for row in patterns],
    )


def import_learning(snapshot: LearningSnapshot, d: Dialect, check_only: bool = False) -> Steps[None]:
    """Refuse (writing nothing) when the store or the snapshot itself already holds one of its interactions
    or preferences; else write them, and the patterns (which replace stored ones of the same id)."""
    ids = [(i.interaction_id,) for i in snapshot.interactions]
    keys = [(p.user_id, p.category, p.key) for p in snapshot.preferences]
    twice = _repeated(ids)
    if twice is not None:
        raise ValidationError(f"The import holds interaction {twice[0]!r} twice; nothing was imported.")
    twice = _repeated(keys)
    if twice is not None:
        raise ValidationError(f"The import holds preference '{twice[1]}.{twice[2]}' of {twice[0]!r} twice; nothing was imported.")
    taken = yield FirstExisting("learning_interactions", ("interaction_id",), ids)
    if taken is not None:
        raise import_conflict(f"interaction {taken[0]!r}")
    taken = yield FirstExisting("learning_preferences", PREFERENCE_KEY, keys)
    if taken is not None:
        raise import_conflict(f"preference '{taken[1]}.{taken[2]}' of {taken[0]!r}")
    if check_only:
        return
    yield ExecuteMany(insert_interaction_sql(d), [interaction_params(i, d) for i in snapshot.interactions])
    yield ExecuteMany(upsert_preference_sql(d), [preference_params(p, d) for p in snapshot.preferences])
    yield ExecuteMany(upsert_pattern_sql(d), [pattern_params(p, d) for p in snapshot.patterns])
