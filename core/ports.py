"""The ports: what the domain needs from the outside, as `typing.Protocol`s.

`MemoryStore` and `LearningStore` are satisfied by the SQLite and PostgreSQL adapters (proven by the contract
suites in tests/adapters), `Embedder` by the embedding runtime, `Clock` by `utcnow` or a test's clock.
core imports no other room; the adapters import these.
"""


from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .models import (
    Actor,
    EntryFilter,
    MemoryEntry,
    NewEntry,
    OutcomeRecord,
    OutcomeType,
    SortBy,
    Tier,
    TraceEvent,
    TraceKind,
)
from .errors import NotFoundError, ValidationError
from .learning_records import Interaction, LearningSnapshot, Pattern, Preference, PreferenceChange


@dataclass(frozen=True)
class OutcomeTarget:
    """An entry an outcome applies to, with the version the session read (None when named explicitly)."""

    entity_path: str
    key: str
    version_read: int | None


def missing_causal_entry(entity_path: str, key: str) -> NotFoundError:
    """The one error for a causal key with no live current version (absent, forgotten or expired)."""
    return NotFoundError(
        f"No memory at '{entity_path}/{key}'; no outcome was recorded. "
        "Check causal_entry_keys with amfs_list or amfs_retrieve."
    )


def nothing_read(session_id: str) -> ValidationError:
    return ValidationError(
        f"Session {session_id!r} has read nothing that still exists, so there is nothing to link the outcome to. "
        "Read the relevant entries first or pass causal_entry_keys."
    )


@dataclass(frozen=True)
class TierUpdate:
    """An entry version's refreshed tier; for reads, `detail` is what the trace keeps (query, strategy ranks)."""

    entity_path: str
    key: str
    version: int
    tier: Tier
    priority_score: float
    detail: dict[str, Any] | None = None
    # When the version read was written: a key forgotten and written again reuses version numbers, and a read that
    # lost a race with the forget must neither leave a trace naming the erased memory nor count for the new one.
    written_at: datetime | None = None


@dataclass
class StoreSnapshot:
    """Everything a store holds, in export order; `memory import` writes it back exactly."""

    entries: list[MemoryEntry] = field(default_factory=list)
    outcomes: list[OutcomeRecord] = field(default_factory=list)
    traces: list[TraceEvent] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def vector_widths(snapshot: StoreSnapshot) -> list[int]:
    """The widths of the snapshot's entry vectors, ascending (a store holds vectors of one width)."""
    return sorted({len(entry.embedding) for entry in snapshot.entries if entry.embedding is not None})


def vector_width(snapshot: StoreSnapshot) -> int | None:
    """The one width of the snapshot's entry vectors (None: it has none); ValidationError when they mix widths."""
    widths = vector_widths(snapshot)
    if len(widths) > 1:
        raise ValidationError(
            f"The snapshot's vectors have {widths} dimensions, but a store holds vectors of one width; nothing was "
            "imported. Re-embed the store they came from (`amfs-server memory reembed`) and export it again."
        )
    return widths[0] if widths else None


@runtime_checkable
class MemoryStore(Protocol):
    """Persistence for entries (every version), outcome records and decision traces.

    Writes that touch several rows are atomic. Reads return current, live (unexpired) versions
    unless a method says otherwise. SQL lives in the adapters only.
    """

    name: str

    async def open(self, *, reembedding: bool = False) -> None:
        """Connect and create what is missing. `reembedding`: opened to be re-embedded (`MemoryService.reembed`), so
        a store whose vectors have another width than the configured embedder's opens for the export; the
        replacing import then changes that width (a store without a fixed width ignores it)."""
        ...

    async def close(self) -> None: ...

    async def insert_versions(self, drafts: list[NewEntry], actor: Actor) -> list[MemoryEntry]:
        """Append version n+1 of each draft's key, in one transaction, and trace the writes.

        Returned in draft order; stored (and traced) in (entity_path, key) order, which is the write order
        that breaks ties between a batch's entries (they share one written_at) in every sorted read.
        """
        ...

    async def get_current(self, entity_path: str, key: str, now: datetime) -> MemoryEntry | None: ...

    async def get_version(self, entity_path: str, key: str, version: int) -> MemoryEntry | None: ...

    async def history(self, entity_path: str, key: str, *, values: bool = True) -> list[MemoryEntry]:
        """Every version, oldest first; `values=False` leaves values None and reads no vectors."""
        ...

    async def find_current(
        self, flt: EntryFilter, now: datetime, sort_by: SortBy, limit: int | None, *, values: bool = True,
        value_head: int | None = None,
    ) -> list[MemoryEntry]:
        """Current live entries, best first by `sort_by`; ties go to the newer write (written_at, then write order).
        `values=False` leaves every value None: a caller that must rank all matches before it keeps a few (decayed
        confidence, priority) then holds no values, whatever their size. `value_head=N`: a value whose stored JSON
        is longer than N characters comes as a `ValueHead` of its first N (for listings, which show a preview)."""
        ...

    async def entity_counts(self, entity_path: str | None, now: datetime) -> dict[str, int]:
        """How many current live entries each entity path (exactly that path) holds, at or under `entity_path`."""
        ...

    async def latest_at(self, entity_path: str, now: datetime, limit: int) -> list[MemoryEntry]:
        """Current live entries at exactly `entity_path`, newest write first (written_at, then write order): an
        index range of that path alone, however many entries the store holds elsewhere."""
        ...

    async def entries_at(
        self, entity_path: str, now: datetime, offset: int, limit: int, *, value_head: int | None = None
    ) -> list[MemoryEntry]:
        """Current live entries at exactly `entity_path`, ordered by key, one page (`offset`, `limit`);
        `value_head` as in `find_current`."""
        ...

    async def record_reads(
        self, actor: Actor, kind: TraceKind, reads: list[TierUpdate], now: datetime
    ) -> None:
        """Bump recall_count of each read version in place, refresh its tier, and trace the reads."""
        ...

    async def session_reads(self, session_id: str) -> list[OutcomeTarget]:
        """Entries read or retrieved in the session, each with the newest version read."""
        ...

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
        """Multiply the confidence of each target's current version and re-tier it, in one transaction, once
        per outcome_ref; returns the record and the updated entries (in effect order, without values or embeddings).

        Targets are the named ones (each once, in order; a None version_read becomes the newest version the actor's
        session read, if any), or with None every entry the session read that still exists (live), each with the
        newest version read. A named target with no live current version (absent, forgotten, expired) raises
        `missing_causal_entry`; a session with nothing left to link raises `nothing_read`; both before anything
        changes. `retier(entry)` gets each updated version and returns it with the tier and priority_score to
        store (the formula stays in core). A ref already committed returns the stored record with
        `already_applied=True`, no entries, and changes nothing, before any target is checked (a retry from a new
        session, or naming an entry forgotten since, is not refused).
        """
        ...

    async def keyword_candidates(
        self, terms: list[str], flt: EntryFilter, now: datetime, limit: int, *, values: bool = True,
        value_head: int | None = None,
    ) -> list[tuple[MemoryEntry, float]]:
        """Current live entries matching ANY word of the terms, best score first; equal scores go to the newer write.

        The score is the share of the query's word weight (IDF) the entry matches: 1 for an entry holding every
        word, near 0 for one holding only common words. It means the same for every query, so the hybrid fusion
        can use it as it is. With `flt.entity_path`, the IDF counts entries at that path and below only (df and N),
        so scores within a scope do not depend on entries outside it. The `limit` best shares are then multiplied
        by `keyword_length_factor` of the distinct words of the text the entry was matched on (its stored search
        text, counted when it was written), so an entry of very many distinct words does not hold a question's words
        by its length alone, and re-sorted (stably).

        Entries come back without embeddings. `values=False`: without values (JSON null); `value_head` as in
        `find_current`.
        """
        ...

    async def common_terms(self, terms: list[str], max_matches: int, entity_path: str | None = None) -> set[str]:
        """The terms that match more than `max_matches` current entries (counted with a bound, so it stays cheap);
        with `entity_path`, entries at that path and below: what lies outside a retrieval's scope never decides
        which of its words are searched."""
        ...

    async def semantic_candidates(
        self, vector: list[float], flt: EntryFilter, now: datetime, limit: int, *, values: bool = True,
        value_head: int | None = None,
    ) -> list[tuple[MemoryEntry, float]]:
        """Current live entries nearest to `vector` by cosine similarity, best first (approximate index allowed);
        equally near entries in the result, newer write first. A zero vector has no neighbours.

        Entries come back without embeddings. `values=False`: without values (JSON null); `value_head` as in
        `find_current`.
        """
        ...

    async def entry_values(
        self, entries: Sequence[MemoryEntry], *, value_head: int | None = None
    ) -> dict[tuple[str, str, int], Any]:
        """The values of these exact versions, keyed by (entity_path, key, version); versions gone are not listed.
        What candidates searched with `values=False` (many, to filter) get once the few kept are chosen.
        `value_head` as in `find_current`."""
        ...

    async def passage_vectors(self, entries: Sequence[MemoryEntry]) -> dict[str, np.ndarray]:
        """The passage embeddings (float32, one row per passage) of these exact versions, keyed by entry_key;
        versions stored without them (one passage, or gone) are not listed. The second look `semantic_candidates`'
        hits get (see `MemoryService._semantic_candidates`)."""
        ...

    async def outcome_records(
        self, entity_path: str | None = None, *, key: str | None = None, newest_first: bool = False, offset: int = 0,
        limit: int | None = None,
    ) -> list[OutcomeRecord]:
        """Outcomes with an effect on `entity_path` or below it (with `key`: on that entry), each with all its
        effects, in commit order (`newest_first` reverses it); `offset` / `limit` page them in the store."""
        ...

    async def count_outcomes(self, entity_path: str | None = None, *, key: str | None = None) -> int:
        """How many outcomes `outcome_records` with the same filter lists."""
        ...

    async def trace_events(self, session_id: str | None = None) -> list[TraceEvent]: ...

    async def forget(self, entity_path: str, key: str) -> int:
        """Delete every version of a key; returns how many versions went."""
        ...

    async def purge_expired(self, now: datetime) -> int: ...

    async def clear(self) -> None: ...

    async def export_snapshot(self) -> StoreSnapshot: ...

    async def import_snapshot(self, snapshot: StoreSnapshot, *, replacing: StoreSnapshot | None = None) -> None:
        """Write a snapshot back in one transaction; refuses (and writes nothing) if one of its keys or outcome refs
        exists, or if its vectors have more than one width (`vector_width`). A store opened without an embedder that
        holds no entry version at all takes the snapshot's vector width in that same transaction (a store whose
        width is not fixed holds any; one of a fixed width refuses vectors of another, as do its writes).
        `replacing`: the export this snapshot replaces (`reembed`). In that same transaction the store must still
        be exactly it (else ConflictError and nothing changes: another process wrote meanwhile), is emptied, takes
        the configured embedder's vector width if it has another, and `snapshot` is written, so neither a crash nor
        a concurrent writer loses anything."""
        ...

    async def get_meta(self, name: str) -> Any | None: ...

    async def set_meta(self, name: str, value: Any | None) -> None: ...

    async def update_meta(
        self, names: Sequence[str], change: Callable[[dict[str, Any | None]], Mapping[str, Any | None]]
    ) -> None:
        """Read the named values (None: absent), then write what `change` returns for them (None deletes), in one
        transaction that no other `update_meta` of any of these names, in any process, interleaves with: two
        processes each adding to one record keep both additions, and values written together are never seen half
        written (a model without the version mark that tells other processes to load it). `change` runs inside
        the transaction: keep it quick, and let it only compute."""
        ...


class Clock(Protocol):
    """Now, timezone-aware UTC. One is injected wherever time matters, so tests can move it."""

    def __call__(self) -> datetime: ...


IMPORT_PENDING_META = "import_pending"
"""Meta row an import sets in its own transaction when the caller has more to import elsewhere (the command's
learned records, another database), cleared once that is in: a rerun after a kill in between knows its memories
are in. Not exported."""


@runtime_checkable
class Embedder(Protocol):
    """Anything that maps texts to L2-normalised float32 vectors.

    A model trained with separate prompts for questions and for what is searched also has
    `embed_query(texts)`, the same contract for questions; `core.embedding.embed_queries` calls it where present."""

    name: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return a float32 array of shape (len(texts), dimension), unit-norm rows, row i for texts[i]."""
        ...


@runtime_checkable
class LearningStore(Protocol):
    """Persistence for interactions, preferences and patterns (SQLite and PostgreSQL adapters).

    Kept apart from `MemoryStore` so that the entry stores stay untouched and learning can live in
    its own file or schema. Writes are atomic; user ids arrive already pseudonymised when that is on.
    """

    name: str

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def record(self, interaction: Interaction | None, changes: Sequence[PreferenceChange]) -> list[Preference]:
        """Insert the interaction (if any) and apply each change to its preference, in one transaction."""
        ...

    async def interactions(self, user_id: str | None = None, limit: int | None = None) -> list[Interaction]:
        """Interactions oldest first; with `limit`, only the newest `limit` of them."""
        ...

    async def interaction_stats(self, user_id: str) -> tuple[int, datetime | None]:
        """How many interactions the user has, and when the newest happened."""
        ...

    async def users(self) -> list[str]:
        """Every user with interactions or patterns, sorted."""
        ...

    async def purge_interactions(self, before: datetime) -> int: ...

    async def preferences(self, user_id: str | None = None, category: str | None = None) -> list[Preference]:
        """Sorted by user, category, key."""
        ...

    async def delete_preference(self, user_id: str | None, category: str, key: str) -> int:
        """Delete (category, key) for one user, or for every user with None; returns how many went. In the same
        transaction, what it was learned from goes too: parameter `key` of those users' recorded calls of tool
        `category`, and their detected patterns (found again, without it, when next asked for)."""
        ...

    async def patterns(self, user_id: str | None = None) -> list[Pattern]: ...

    async def replace_patterns(self, user_id: str, patterns: Sequence[Pattern]) -> None:
        """Make `patterns` the user's patterns: the others of that user are deleted."""
        ...

    async def clear(self) -> None: ...

    async def export_snapshot(self) -> LearningSnapshot: ...

    async def import_snapshot(self, snapshot: LearningSnapshot, check_only: bool = False) -> None:
        """Write the snapshot in one transaction. Refuses (writing nothing) when an interaction id or a
        (user, category, key) preference already exists; patterns with a stored id are replaced.
        `check_only` runs the refusal checks and writes nothing."""
        ...
