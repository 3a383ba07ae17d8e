"""The store Protocol every adapter satisfies, proven by the shared contract suite (tests/adapters)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from ..core.models import (
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


@dataclass(frozen=True)
class OutcomeTarget:
    """An entry an outcome applies to, with the version the session read (None when named explicitly)."""

    entity_path: str
    key: str
    version_read: int | None


@dataclass(frozen=True)
class TierUpdate:
    """An entry version's refreshed tier; for reads, `detail` is what the trace keeps (query, strategy ranks)."""

    entity_path: str
    key: str
    version: int
    tier: Tier
    priority_score: float
    detail: dict[str, Any] | None = None


@dataclass
class StoreSnapshot:
    """Everything a store holds, in export order; `memory import` writes it back exactly."""

    entries: list[MemoryEntry] = field(default_factory=list)
    outcomes: list[OutcomeRecord] = field(default_factory=list)
    traces: list[TraceEvent] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


@runtime_checkable
class MemoryStore(Protocol):
    """Persistence for entries (every version), outcome records and decision traces.

    Writes that touch several rows are atomic. Reads return current, live (unexpired) versions
    unless a method says otherwise. SQL lives in the adapters only.
    """

    name: str

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def insert_versions(self, drafts: list[NewEntry], actor: Actor) -> list[MemoryEntry]:
        """Append version n+1 of each draft's key, in one transaction, and trace the writes."""
        ...

    async def get_current(self, entity_path: str, key: str, now: datetime) -> MemoryEntry | None: ...

    async def get_version(self, entity_path: str, key: str, version: int) -> MemoryEntry | None: ...

    async def history(self, entity_path: str, key: str) -> list[MemoryEntry]: ...

    async def find_current(
        self, flt: EntryFilter, now: datetime, sort_by: SortBy, limit: int | None
    ) -> list[MemoryEntry]: ...

    async def entity_counts(self, entity_path: str | None, now: datetime) -> dict[str, int]:
        """How many current live entries each entity path (exactly that path) holds, at or under `entity_path`."""
        ...

    async def entries_at(self, entity_path: str, now: datetime, offset: int, limit: int) -> list[MemoryEntry]:
        """Current live entries at exactly `entity_path`, ordered by key, one page (`offset`, `limit`)."""
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
        targets: list[OutcomeTarget],
    ) -> OutcomeRecord:
        """Multiply the confidence of each target's current version, once per outcome_ref.

        A ref already committed returns the stored record with `already_applied=True` and changes nothing.
        """
        ...

    async def update_tiers(self, updates: list[TierUpdate]) -> None: ...

    async def keyword_candidates(
        self, terms: list[str], flt: EntryFilter, now: datetime, limit: int
    ) -> list[tuple[MemoryEntry, float]]:
        """Current live entries matching ANY of the terms, best full-text rank first (score: higher is better).

        Entries come back without embeddings.
        """
        ...

    async def common_terms(self, terms: list[str], max_matches: int) -> set[str]:
        """The terms that match more than `max_matches` current entries (counted with a bound, so it stays cheap)."""
        ...

    async def semantic_candidates(
        self, vector: list[float], flt: EntryFilter, now: datetime, limit: int
    ) -> list[tuple[MemoryEntry, float]]:
        """Current live entries nearest to `vector` by cosine similarity, best first (approximate index allowed).

        Entries come back without embeddings.
        """
        ...

    async def outcome_records(self, entity_path: str | None = None) -> list[OutcomeRecord]: ...

    async def trace_events(self, session_id: str | None = None) -> list[TraceEvent]: ...

    async def forget(self, entity_path: str, key: str) -> int:
        """Delete every version of a key; returns how many versions went."""
        ...

    async def purge_expired(self, now: datetime) -> int: ...

    async def clear(self) -> None: ...

    async def export_snapshot(self) -> StoreSnapshot: ...

    async def import_snapshot(self, snapshot: StoreSnapshot) -> None:
        """Write a snapshot back in one transaction; refuses (and writes nothing) if any entry version exists."""
        ...

    async def get_meta(self, name: str) -> Any | None: ...

    async def set_meta(self, name: str, value: Any | None) -> None: ...
