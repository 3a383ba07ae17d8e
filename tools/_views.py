"""What the tools return: pydantic output models (structured output) built from domain objects.

Listings keep results bounded: a value whose JSON is longer than a budget is cut and marked with
its full size and the amfs_read call that returns all of it. amfs_read itself never truncates.

Numbers are for a model to read: scores carry 4 significant digits, confidences no float noise
(0.8800000000000001 is 0.88), times are ages ("3h"). amfs_retrieve, amfs_search and amfs_list return
compact entries (key, value, confidence, version, age) unless asked for `verbose` ones (EntryView).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field

from ..core.confidence import bounded_confidence
from ..core.models import MemoryEntry, Tier, ValueHead
from ..core.retrieval import RetrievedEntry

LISTING_VALUE_CHARS = 2000
"""Value budget per entry in retrieve, search and history results."""
LIST_VALUE_CHARS = 200
"""Value budget per entry in amfs_list, which is for seeing what exists."""

MemoryTypeName = Literal["fact", "belief", "experience"]
OutcomeTypeName = Literal["critical_failure", "failure", "minor_failure", "success"]
TierName = Literal["hot", "warm", "archive"]
_TIER_NAMES: dict[Tier, TierName] = {Tier.HOT: "hot", Tier.WARM: "warm", Tier.ARCHIVE: "archive"}


def significant(x: float, digits: int = 4) -> float:
    """`x` to `digits` significant digits: 0.016393442 -> 0.01639."""
    return float(f"{x:.{digits}g}")


def without_noise(x: float) -> float:
    """`x` without binary floating-point noise: 0.8800000000000001 -> 0.88 (6 decimals are kept)."""
    return round(x, 6) + 0.0  # + 0.0 turns -0.0 into 0.0


Score = Annotated[float, AfterValidator(significant)]
# Never infinite or NaN on the way out (JSON would carry null where the schema declares a number), and no float noise.
Confidence = Annotated[float, AfterValidator(lambda x: without_noise(bounded_confidence(x)))]


def age(moment: datetime, now: datetime | None = None) -> str:
    """How long ago `moment` was, in its largest whole unit: "42s", "17m", "3h", "12d"."""
    seconds = max(0, int(((now or datetime.now(timezone.utc)) - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def bounded_value(entry: MemoryEntry, budget: int | None, read_hint: str) -> tuple[Any, bool]:
    """The entry's value, or its text (a string's own, else its JSON) cut to `budget` characters with a marker
    saying how long the value's JSON is and how to read it all. A `ValueHead` (a listing's long value, read
    without the rest) is always cut."""
    if budget is None:
        return entry.value, False
    if isinstance(entry.value, ValueHead):
        text, json_chars = entry.value.text_head(), entry.value.json_chars
    else:
        json_text = json.dumps(entry.value, ensure_ascii=False, separators=(",", ":"))  # as the stores keep it
        text = entry.value if isinstance(entry.value, str) else json_text
        if len(text) <= budget:
            return entry.value, False
        json_chars = len(json_text)
    return f"{text[:budget]}…[truncated: {json_chars} chars of JSON; call {read_hint} for the whole value]", True


class EntryView(BaseModel):
    entry_key: str = Field(description="entity_path/key")
    entity_path: str
    key: str
    version: int
    value: Any
    truncated: bool = Field(False, description="True when value was cut; amfs_read returns all of it.")
    confidence: Confidence
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
    confidence: Confidence
    memory_type: MemoryTypeName
    event_at: datetime | None = None


class CompactEntry(BaseModel):
    """What a model needs of an entry; `verbose=true` returns EntryView instead."""

    entry_key: str = Field(description="entity_path/key")
    version: int
    value: Any
    truncated: bool = Field(
        False, exclude_if=lambda cut: not cut, description="Present (true) when value was cut; amfs_read returns it all."
    )
    confidence: Confidence
    age: str = Field(description='Time since this version was written: "42s", "17m", "3h", "12d".')

    @classmethod
    def of(cls, entry: MemoryEntry, budget: int | None = LISTING_VALUE_CHARS) -> CompactEntry:
        value, truncated = bounded_value(
            entry, budget, f"amfs_read(entity_path={entry.entity_path!r}, key={entry.key!r})"
        )
        return cls(
            entry_key=entry.entry_key, version=entry.version, value=value, truncated=truncated,
            confidence=entry.confidence, age=age(entry.provenance.written_at),
        )


def entry_views(
    entries: Sequence[MemoryEntry], verbose: bool, budget: int = LISTING_VALUE_CHARS
) -> list[CompactEntry] | list[EntryView]:
    """Each entry's view, its value cut to `budget`. The tools build these in a worker thread: cutting a value
    serialises all of it (34 ms for 1 MiB), and a listing of 100 such values held the event loop, and every other
    client, for 17 s (red-team finding, 0.7.10)."""
    if verbose:
        return [EntryView.of(entry, budget) for entry in entries]
    return [CompactEntry.of(entry, budget) for entry in entries]


class EntryList(BaseModel):
    count: int
    entries: list[CompactEntry] | list[EntryView]


class Listing(BaseModel):
    count: int
    more: bool = Field(description="True when limit cut the listing; narrow entity_path or raise limit.")
    entries: list[CompactEntry] | list[EntryView] = Field(
        description=f"Values of at most {LIST_VALUE_CHARS} characters; amfs_read returns the whole value."
    )


class History(BaseModel):
    entity_path: str
    key: str
    versions: list[EntryView] = Field(description="Oldest first.")
    older_versions: int = Field(0, description="Versions older than the first shown (before_version pages to them).")


class StrategyHitView(BaseModel):
    rank: int
    raw_score: Score | None = Field(
        None, exclude_if=lambda raw: raw is None,
        description="The strategy's own score (similarity, keyword score, confidence); temporal gives age instead.",
    )
    age: str | None = Field(None, exclude_if=lambda when: when is None, description="temporal: the age of the entry's event time (event_at, else when it was written).")
    contribution: Score = Field(description="This strategy's share of the fused score.")


_EXPLAIN_DESCRIPTION = "Per retrieval strategy: its rank, raw score (or age) and share of the fused score (explain=true)."


def explain_view(hit: RetrievedEntry) -> dict[str, StrategyHitView] | None:
    if hit.strategies is None:
        return None
    return {
        # the temporal strategy ranks the event time (event_at, else the write time; a future one counts as now):
        # shown as the age it stands for, not the write time's (an event of 2023 written today read "0s")
        name: StrategyHitView(rank=s.rank, age=age(hit.entry.event_time), contribution=s.contribution)
        if name == "temporal"
        else StrategyHitView(rank=s.rank, raw_score=s.raw_score, contribution=s.contribution)
        for name, s in hit.strategies.items()
    }


_NEAR_COPIES_DESCRIPTION = (
    "Present when other results nearly repeat this one's text with a difference (a changed date, name or number?): "
    "their entry_keys. Check which is right before relying on either."
)


class CompactHit(CompactEntry):
    rank: int
    score: Score
    near_copies: list[str] = Field(
        default_factory=list, exclude_if=lambda keys: not keys, description=_NEAR_COPIES_DESCRIPTION
    )
    explain: dict[str, StrategyHitView] | None = Field(
        None, exclude_if=lambda explain: explain is None, description=_EXPLAIN_DESCRIPTION
    )


class RetrievedView(BaseModel):
    rank: int
    score: Score
    entry: EntryView
    near_copies: list[str] = Field(
        default_factory=list, exclude_if=lambda keys: not keys, description=_NEAR_COPIES_DESCRIPTION
    )
    explain: dict[str, StrategyHitView] | None = Field(None, description=_EXPLAIN_DESCRIPTION)


class RetrieveResult(BaseModel):
    count: int
    results: list[CompactHit] | list[RetrievedView]

    @classmethod
    def of(cls, hits: Sequence[RetrievedEntry], verbose: bool = False) -> RetrieveResult:
        if verbose:
            results: list[CompactHit] | list[RetrievedView] = [
                RetrievedView(rank=hit.rank, score=hit.score, entry=EntryView.of(hit.entry),
                              near_copies=list(hit.near_copies), explain=explain_view(hit))
                for hit in hits
            ]
        else:
            results = [
                CompactHit(
                    **CompactEntry.of(hit.entry).model_dump(), rank=hit.rank, score=hit.score,
                    near_copies=list(hit.near_copies), explain=explain_view(hit),
                )
                for hit in hits
            ]
        return cls(count=len(results), results=results)


class OutcomeEffectView(BaseModel):
    entry_key: str
    version_read: int | None = Field(description="The version the session read, if it read this entry.")
    version_updated: int
    confidence_before: Confidence
    confidence_after: Confidence


class OutcomeResult(BaseModel):
    outcome_ref: str
    outcome_type: OutcomeTypeName
    multiplier: float
    already_applied: bool = Field(description="True when this outcome_ref was committed before; nothing changed now.")
    updated: list[OutcomeEffectView]


class ForgetResult(BaseModel):
    entry_key: str
    versions_removed: int
