"""What the tools return: pydantic output models (structured output) built from domain objects.

Listings keep results bounded: a value whose JSON is longer than a budget is cut and marked with
its full size and the amfs_read call that returns all of it. amfs_read itself never truncates.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..core.models import MemoryEntry, Tier

LISTING_VALUE_CHARS = 2000
"""Value budget per entry in retrieve, search and history results."""
LIST_VALUE_CHARS = 200
"""Value budget per entry in amfs_list, which is for seeing what exists."""

MemoryTypeName = Literal["fact", "belief", "experience"]
OutcomeTypeName = Literal["critical_failure", "failure", "minor_failure", "success"]
TierName = Literal["hot", "warm", "archive"]
_TIER_NAMES: dict[Tier, TierName] = {Tier.HOT: "hot", Tier.WARM: "warm", Tier.ARCHIVE: "archive"}


def bounded_value(entry: MemoryEntry, budget: int | None, read_hint: str) -> tuple[Any, bool]:
    """The entry's value, or its JSON cut to `budget` characters with a marker saying how to read it all."""
    if budget is None:
        return entry.value, False
    text = entry.value if isinstance(entry.value, str) else json.dumps(entry.value, ensure_ascii=False)
    if len(text) <= budget:
        return entry.value, False
    return f"{text[:budget]}…[truncated: {len(text)} chars; call {read_hint} for the whole value]", True


class EntryView(BaseModel):
    entry_key: str = Field(description="entity_path/key")
    entity_path: str
    key: str
    version: int
    value: Any
    truncated: bool = Field(False, description="True when value was cut; amfs_read returns all of it.")
    confidence: float
    memory_type: MemoryTypeName
    tier: TierName
    provenance_tier: str
    agent_id: str
    written_at: datetime
    outcome_count: int
    recall_count: int
    ttl_at: datetime | None = None
    importance_score: float | None = None
    event_at: datetime | None = Field(None, description="When the remembered event happened, if the writer said.")

    @classmethod
    def of(cls, entry: MemoryEntry, budget: int | None = LISTING_VALUE_CHARS, pin_version: bool = False) -> EntryView:
        hint = f"amfs_read(entity_path={entry.entity_path!r}, key={entry.key!r}" + (
            f", version={entry.version})" if pin_version else ")"
        )
        value, truncated = bounded_value(entry, budget, hint)
        return cls(
            entry_key=entry.entry_key, entity_path=entry.entity_path, key=entry.key, version=entry.version,
            value=value, truncated=truncated, confidence=entry.confidence, memory_type=entry.memory_type.value,
            tier=_TIER_NAMES[entry.tier], provenance_tier=entry.provenance_tier.name.lower(),
            agent_id=entry.provenance.agent_id, written_at=entry.provenance.written_at,
            outcome_count=entry.outcome_count, recall_count=entry.recall_count, ttl_at=entry.ttl_at,
            importance_score=entry.importance_score, event_at=entry.event_at,
        )


class WriteResult(BaseModel):
    entry_key: str
    entity_path: str
    key: str
    version: int = Field(description="1 for a new key; each write to the same key adds a version.")
    confidence: float
    memory_type: MemoryTypeName
    event_at: datetime | None = None


class EntryList(BaseModel):
    count: int
    entries: list[EntryView]


class ListedEntry(BaseModel):
    entry_key: str
    version: int
    confidence: float
    memory_type: MemoryTypeName
    value: Any = Field(description=f"At most {LIST_VALUE_CHARS} characters; amfs_read returns the whole value.")
    truncated: bool = False

    @classmethod
    def of(cls, entry: MemoryEntry) -> ListedEntry:
        value, truncated = bounded_value(
            entry, LIST_VALUE_CHARS, f"amfs_read(entity_path={entry.entity_path!r}, key={entry.key!r})"
        )
        return cls(
            entry_key=entry.entry_key, version=entry.version, confidence=entry.confidence,
            memory_type=entry.memory_type.value, value=value, truncated=truncated,
        )


class Listing(BaseModel):
    count: int
    more: bool = Field(description="True when limit cut the listing; narrow entity_path or raise limit.")
    entries: list[ListedEntry]


class History(BaseModel):
    entity_path: str
    key: str
    versions: list[EntryView] = Field(description="Oldest first.")


class StrategyHitView(BaseModel):
    rank: int
    raw_score: float
    contribution: float


class RetrievedView(BaseModel):
    rank: int
    score: float
    entry: EntryView
    explain: dict[str, StrategyHitView] | None = Field(
        None, description="Per retrieval strategy: its rank, raw score and share of the fused score (explain=true)."
    )


class RetrieveResult(BaseModel):
    count: int
    results: list[RetrievedView]


class OutcomeEffectView(BaseModel):
    entry_key: str
    version_read: int | None = Field(description="The version the session read, if it read this entry.")
    version_updated: int
    confidence_before: float
    confidence_after: float


class OutcomeResult(BaseModel):
    outcome_ref: str
    outcome_type: OutcomeTypeName
    multiplier: float
    already_applied: bool = Field(description="True when this outcome_ref was committed before; nothing changed now.")
    updated: list[OutcomeEffectView]


class ForgetResult(BaseModel):
    entry_key: str
    versions_removed: int
