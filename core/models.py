"""The domain model: MemoryEntry and its parts, outcome records, decision-trace events.

Plain dataclasses: the engine passes these around; the edges (MCP, SDK, CLI, persistence)
convert them with `to_dict` / `from_dict`, which is also the export format.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Literal

AMFS_VERSION = "0.7.23"

PRODUCTION_AGENT_PREFIXES = ("agent/", "prod/", "prod-")
MANUAL_AGENT_PREFIXES = ("manual", "human/", "user/", "script/", "cli", "import")


class MemoryType(str, enum.Enum):
    FACT = "fact"
    BELIEF = "belief"
    EXPERIENCE = "experience"


class OutcomeType(str, enum.Enum):
    CRITICAL_FAILURE = "critical_failure"
    FAILURE = "failure"
    MINOR_FAILURE = "minor_failure"
    SUCCESS = "success"


class ProvenanceTier(enum.IntEnum):
    PRODUCTION_VALIDATED = 1
    PRODUCTION_OBSERVED = 2
    DEVELOPMENT = 3
    MANUAL = 4


class Tier(enum.IntEnum):
    HOT = 1
    WARM = 2
    ARCHIVE = 3


TraceKind = Literal["read", "retrieve", "write"]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def to_iso(moment: datetime | None) -> str | None:
    return moment.astimezone(timezone.utc).isoformat() if moment is not None else None


def from_iso(text: str | None) -> datetime | None:
    if text is None:
        return None
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def entry_key(entity_path: str, key: str) -> str:
    return f"{entity_path}/{key}"


def split_entry_key(text: str) -> tuple[str, str]:
    """`a/b/key` -> (`a/b`, `key`): keys never contain `/`, entity paths may."""
    entity_path, sep, key = text.rpartition("/")
    if not sep or not entity_path or not key:
        from .errors import ValidationError

        raise ValidationError(
            f"Entry key {text!r} is not of the form 'entity_path/key' (e.g. 'checkout-service/retry-pattern')."
        )
    return entity_path, key


def under(entity_path: str, prefix: str | None) -> bool:
    """Whether `entity_path` is `prefix` or below it (the store's prefix semantics); anything is under None."""
    return prefix is None or entity_path == prefix or entity_path.startswith(prefix + "/")


@dataclass(frozen=True)
class Actor:
    """Who is acting: the agent and the session whose reads feed auto-causal linking.

    `scope` is the entity prefix a prefix-scoped API key confines the actor to (None: unconfined). Its
    outcome refs live in that scope's own namespace, so two teams' refs never meet. A `read_only` actor (a
    read-only API key) leaves no trace of its reads: no recall count, tier or trace changes, so it cannot move
    tiers or what later outcomes are charged to.
    """

    agent_id: str
    session_id: str
    scope: str | None = None
    read_only: bool = False


@dataclass(frozen=True)
class Provenance:
    agent_id: str
    session_id: str
    written_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "session_id": self.session_id, "written_at": to_iso(self.written_at)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Provenance:
        return cls(data["agent_id"], data["session_id"], from_iso(data["written_at"]))  # type: ignore[arg-type]


@dataclass(frozen=True)
class ValueHead:
    """In place of a value too long for a listing to read whole: the first characters of its stored JSON
    (compact, non-ASCII kept) and that JSON's length in characters. Listings ask the store for heads
    (`value_head=`) so that one of 100 values of 1 MiB parses none of them; amfs_read returns the value."""

    json_head: str
    json_chars: int

    @staticmethod
    def enough_for(chars: int) -> int:
        """How many characters of JSON a head must hold to show `chars` characters of the value's text: a JSON
        string spends at most 6 on one character (`\\u0001`), plus its quote and an escape cut at the end."""
        return 6 * chars + 16

    def text_head(self) -> str:
        """The start of the value's text: a string value's own characters, else its JSON."""
        if not self.json_head.startswith('"'):
            return self.json_head
        for end in range(len(self.json_head), max(0, len(self.json_head) - 13), -1):
            try:  # the head may end inside an escape (at most 12 characters: a surrogate pair)
                text = json.loads(self.json_head[:end] + '"')
            except ValueError:
                continue
            if isinstance(text, str):
                return text
        return self.json_head[1:]  # unreachable for a head of valid JSON; a raw head beats an error in a listing


@dataclass(frozen=True)
class MemoryEntry:
    entity_path: str
    key: str
    value: Any
    version: int
    confidence: float
    provenance: Provenance
    outcome_count: int = 0
    recall_count: int = 0
    ttl_at: datetime | None = None
    memory_type: MemoryType = MemoryType.FACT
    tier: Tier = Tier.ARCHIVE
    priority_score: float | None = None
    importance_score: float | None = None
    importance_dimensions: dict[str, float] | None = None
    embedding: list[float] | None = field(default=None, repr=False)
    amfs_version: str = AMFS_VERSION
    # When the remembered event happened (the writer's claim), as opposed to provenance.written_at.
    event_at: datetime | None = None
    # The unit embeddings of the value's passages (sentences) when there are two or more; `embedding` is their
    # normalised mean (core/embedding.py). Like `embedding`, only loaded where a caller needs it.
    passage_embeddings: list[list[float]] | None = field(default=None, repr=False)
    # The key (same entity path) of the turn whose text the last passage embedding was made with (a transcript
    # turn's context passage, core/embedding.py context_passage); forgetting that key strips the row.
    context_key: str | None = None

    @property
    def entry_key(self) -> str:
        return entry_key(self.entity_path, self.key)

    @property
    def event_time(self) -> datetime:
        """What temporal ranking and the event_after/event_before filters use: event_at, else the write time."""
        return self.event_at if self.event_at is not None else self.provenance.written_at

    @property
    def provenance_tier(self) -> ProvenanceTier:
        agent = self.provenance.agent_id
        if agent.startswith(PRODUCTION_AGENT_PREFIXES):
            return ProvenanceTier.PRODUCTION_VALIDATED if self.outcome_count > 0 else ProvenanceTier.PRODUCTION_OBSERVED
        if agent.startswith(MANUAL_AGENT_PREFIXES):
            return ProvenanceTier.MANUAL
        return ProvenanceTier.DEVELOPMENT

    def is_expired(self, now: datetime) -> bool:
        return self.ttl_at is not None and self.ttl_at <= now

    def with_changes(self, **changes: Any) -> MemoryEntry:
        return replace(self, **changes)

    def to_dict(self, include_embedding: bool = True) -> dict[str, Any]:
        return {
            "entity_path": self.entity_path,
            "key": self.key,
            "entry_key": self.entry_key,
            "value": self.value,
            "version": self.version,
            "confidence": self.confidence,
            "provenance": self.provenance.to_dict(),
            "provenance_tier": self.provenance_tier.name.lower(),
            "outcome_count": self.outcome_count,
            "recall_count": self.recall_count,
            "ttl_at": to_iso(self.ttl_at),
            "memory_type": self.memory_type.value,
            "tier": int(self.tier),
            "priority_score": self.priority_score,
            "importance_score": self.importance_score,
            "importance_dimensions": self.importance_dimensions,
            "embedding": self.embedding if include_embedding else None,
            "amfs_version": self.amfs_version,
            "event_at": to_iso(self.event_at),
            "passage_embeddings": self.passage_embeddings if include_embedding else None,
            "context_key": self.context_key,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryEntry:
        return cls(
            entity_path=data["entity_path"],
            key=data["key"],
            value=data["value"],
            version=int(data["version"]),
            confidence=float(data["confidence"]),
            provenance=Provenance.from_dict(data["provenance"]),
            outcome_count=int(data.get("outcome_count", 0)),
            recall_count=int(data.get("recall_count", 0)),
            ttl_at=from_iso(data.get("ttl_at")),
            memory_type=MemoryType(data.get("memory_type", "fact")),
            tier=Tier(int(data.get("tier", 3))),
            priority_score=data.get("priority_score"),
            importance_score=data.get("importance_score"),
            importance_dimensions=data.get("importance_dimensions"),
            embedding=data.get("embedding"),
            amfs_version=data.get("amfs_version", AMFS_VERSION),
            event_at=from_iso(data.get("event_at")),
            passage_embeddings=data.get("passage_embeddings"),
            context_key=data.get("context_key"),
        )


@dataclass(frozen=True)
class NewEntry:
    """A validated write, before the store assigns its version."""

    entity_path: str
    key: str
    value: Any
    value_json: str
    confidence: float
    memory_type: MemoryType
    agent_id: str
    session_id: str
    written_at: datetime
    ttl_at: datetime | None
    importance_score: float | None
    importance_dimensions: dict[str, float] | None
    tier: Tier
    priority_score: float
    embedding: list[float] | None = None
    search_text: str = ""
    event_at: datetime | None = None
    passage_embeddings: list[list[float]] | None = None
    context_key: str | None = None

    def without_context(self) -> NewEntry:
        """This write without its context passage (the last passage row), as a forget of the lender strips it: the
        stores call it when the lender was erased after the passage was made. A one-passage entry keeps none."""
        rest = (self.passage_embeddings or [])[:-1]
        return replace(self, context_key=None, passage_embeddings=rest if len(rest) > 1 else None)


@dataclass(frozen=True)
class OutcomeEffect:
    """One entry's confidence change caused by one outcome."""

    entity_path: str
    key: str
    version_read: int | None
    version_updated: int
    confidence_before: float
    confidence_after: float

    @property
    def entry_key(self) -> str:
        return entry_key(self.entity_path, self.key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "entry_key": self.entry_key,
            "entity_path": self.entity_path,
            "key": self.key,
            "version_read": self.version_read,
            "version_updated": self.version_updated,
            "confidence_before": self.confidence_before,
            "confidence_after": self.confidence_after,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutcomeEffect:
        return cls(
            data["entity_path"], data["key"], data.get("version_read"), int(data["version_updated"]),
            float(data["confidence_before"]), float(data["confidence_after"]),
        )


@dataclass(frozen=True)
class OutcomeRecord:
    outcome_ref: str
    outcome_type: OutcomeType
    multiplier: float
    committed_at: datetime
    agent_id: str
    session_id: str
    effects: tuple[OutcomeEffect, ...]
    already_applied: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome_ref": self.outcome_ref,
            "outcome_type": self.outcome_type.value,
            "multiplier": self.multiplier,
            "committed_at": to_iso(self.committed_at),
            "agent_id": self.agent_id,
            "session_id": self.session_id,
            "effects": [effect.to_dict() for effect in self.effects],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutcomeRecord:
        return cls(
            outcome_ref=data["outcome_ref"],
            outcome_type=OutcomeType(data["outcome_type"]),
            multiplier=float(data["multiplier"]),
            committed_at=from_iso(data["committed_at"]),  # type: ignore[arg-type]
            agent_id=data["agent_id"],
            session_id=data["session_id"],
            effects=tuple(OutcomeEffect.from_dict(effect) for effect in data["effects"]),
        )


@dataclass(frozen=True)
class TraceEvent:
    """One step of a decision trace: what a session read, retrieved or wrote."""

    session_id: str
    agent_id: str
    kind: TraceKind
    entity_path: str
    key: str
    version: int
    at: datetime
    detail: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id, "agent_id": self.agent_id, "kind": self.kind,
            "entity_path": self.entity_path, "key": self.key, "version": self.version, "at": to_iso(self.at),
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TraceEvent:
        return cls(
            data["session_id"], data["agent_id"], data["kind"], data["entity_path"], data["key"],
            int(data["version"]), from_iso(data["at"]), data.get("detail"),  # type: ignore[arg-type]
        )


# "path" (entity path, then key) is the listing order (`MemoryService.list`); amfs_search offers the other four.
SortBy = Literal["confidence", "recency", "recall_count", "priority", "path"]


@dataclass(frozen=True)
class EntryFilter:
    """Filters the store applies to current, live versions (SQL-side); effective confidence is filtered in core."""

    entity_path: str | None = None
    memory_type: MemoryType | None = None
    agent_id: str | None = None
    since: datetime | None = None
    min_stored_confidence: float | None = None
    # On the event time (event_at, else written_at), both ends inclusive.
    event_after: datetime | None = None
    event_before: datetime | None = None
