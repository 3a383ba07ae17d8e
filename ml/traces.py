"""The outcome history the ML layer learns from, and decision traces built from it (read through MemoryService).

A **decision trace** is one session's story, assembled from what the store persists:

- *context*: the entries the session read (`amfs_read`) or was shown (`amfs_retrieve`), each at the
  version it saw, in the order it first saw them. When the session wrote something, only what it saw
  before its last write counts, and an entry the session itself wrote earlier is its own decision, not
  context. When the session saw nothing (the outcome named `causal_entry_keys` explicitly), the
  outcome's causal entries are the context.
- *decisions*: the entry versions the session wrote.
- *outcomes*: the outcome records committed in that session (`OutcomeRecord.session_id`).

A trace is *clean* when it has outcomes and every one is SUCCESS, *failed* when any is an incident.
Sessions without outcomes are not traces: nothing says whether what they did was good.

`OutcomeHistory` also answers "what did this entry look like at time t" (confidence, outcome count,
recall count as they were then), so the ranker learns from features the entry had when it was read,
not from what the outcome did to it afterwards.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ..core.service import MemoryService
from ..core.models import MemoryEntry, OutcomeEffect, OutcomeRecord, OutcomeType, TraceEvent, entry_key, under

INCIDENT_TYPES: tuple[OutcomeType, ...] = (
    OutcomeType.CRITICAL_FAILURE, OutcomeType.FAILURE, OutcomeType.MINOR_FAILURE,
)


@dataclass(frozen=True)
class TraceRead:
    entity_path: str
    key: str
    version: int
    at: datetime
    ranks: dict[str, int] | None = None
    """Per-strategy ranks when the entry came from amfs_retrieve; None for a direct read."""

    @property
    def entry_key(self) -> str:
        return entry_key(self.entity_path, self.key)


@dataclass(frozen=True)
class TraceWrite:
    entity_path: str
    key: str
    version: int
    at: datetime

    @property
    def entry_key(self) -> str:
        return entry_key(self.entity_path, self.key)


@dataclass
class DecisionTrace:
    session_id: str
    agent_id: str
    context: list[TraceRead]
    decisions: list[TraceWrite]
    outcomes: list[OutcomeRecord]

    @property
    def clean(self) -> bool:
        return bool(self.outcomes) and all(o.outcome_type is OutcomeType.SUCCESS for o in self.outcomes)

    @property
    def failed(self) -> bool:
        return any(o.outcome_type is not OutcomeType.SUCCESS for o in self.outcomes)

    @property
    def entity_paths(self) -> list[str]:
        """What the trace is about: the entities it decided on, else those its outcomes blamed or credited."""
        source: Iterable[Any] = self.decisions or [e for o in self.outcomes for e in o.effects] or self.context
        return sorted({item.entity_path for item in source})

    @property
    def ended_at(self) -> datetime:
        return max(o.committed_at for o in self.outcomes)


@dataclass
class OutcomeHistory:
    """Every outcome (oldest first) and trace event, with per-entry indexes for point-in-time lookups."""

    outcomes: list[OutcomeRecord]
    events: list[TraceEvent]
    versions: dict[tuple[str, str, int], MemoryEntry] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.outcomes.sort(key=lambda o: o.committed_at)
        self.sessions: dict[str, list[TraceEvent]] = defaultdict(list)
        self._read_times: dict[tuple[str, str, int], list[float]] = defaultdict(list)
        # (entity_path, key, version_updated) -> [(committed_at, confidence_before)], oldest first
        self._effects_on_version: dict[tuple[str, str, int], list[tuple[float, float]]] = defaultdict(list)
        self.effects_by_entry: dict[str, list[tuple[OutcomeRecord, OutcomeEffect]]] = defaultdict(list)
        self._last_retrieve: dict[str, TraceEvent] = {}
        for event in self.events:
            self.sessions[event.session_id].append(event)
            if event.kind in ("read", "retrieve"):
                self._read_times[(event.entity_path, event.key, event.version)].append(event.at.timestamp())
            if event.kind == "retrieve":
                self._last_retrieve[entry_key(event.entity_path, event.key)] = event
        for times in self._read_times.values():
            times.sort()
        for record in self.outcomes:
            for effect in record.effects:
                self._effects_on_version[(effect.entity_path, effect.key, effect.version_updated)].append(
                    (record.committed_at.timestamp(), effect.confidence_before)
                )
                self.effects_by_entry[effect.entry_key].append((record, effect))

    @classmethod
    async def load(cls, service: MemoryService, entity_path: str | None = None, *, values: bool = True) -> OutcomeHistory:
        """Outcomes touching `entity_path` (all when None), trace events, and the entry versions they name
        (`values=False`: without their values, for what reads only confidence, tiers and times: the ranker and the
        calibrator read every named version's value before, +1.9 GB for 100 values of 1 MiB; red-team finding,
        0.7.10). Without any outcome no version is read: everything built from a history needs one.

        With `entity_path` the history holds nothing from outside it: events elsewhere and outcome effects
        on other entities are dropped, not redacted. A prefix-scoped API key is confined to its prefix this
        way, so an export or model for it can never carry another team's entries, even when one session
        read or wrote under both.
        """
        outcomes = await service.outcome_records(entity_path)
        events = await service.trace_events()
        if entity_path is not None:
            events = [e for e in events if under(e.entity_path, entity_path)]
            outcomes = [
                replace(o, effects=tuple(f for f in o.effects if under(f.entity_path, entity_path))) for o in outcomes
            ]
            outcomes = [o for o in outcomes if o.effects]
        history = cls(outcomes, events)
        if not outcomes:
            return history
        keys = {(e.entity_path, e.key) for e in events}
        keys |= {(f.entity_path, f.key) for o in outcomes for f in o.effects}
        for entity, key in sorted(keys):
            for version in await service.entry_versions(entity, key, values=values):
                history.versions[(entity, key, version.version)] = version
        return history

    # -- point-in-time state ------------------------------------------------------------------

    def version(self, entity_path: str, key: str, version: int) -> MemoryEntry | None:
        return self.versions.get((entity_path, key, version))

    def as_of(self, entry: MemoryEntry, at: datetime) -> MemoryEntry:
        """The entry version as it was at `at`: confidence, outcome count and recall count then."""
        moment = at.timestamp()
        effects = self._effects_on_version.get((entry.entity_path, entry.key, entry.version), [])
        # Outcomes multiply the current version's confidence in place; the first one from `at` on saw the value
        # then. An outcome stamped with the very instant of a read came after it (a session reads, then commits).
        later = [before for when, before in effects if when >= moment]
        confidence = later[0] if later else entry.confidence
        outcome_count = sum(1 for when, _ in effects if when < moment)
        reads = self._read_times.get((entry.entity_path, entry.key, entry.version), [])
        recall_count = bisect.bisect_left(reads, moment)
        return entry.with_changes(confidence=confidence, outcome_count=outcome_count, recall_count=recall_count)

    # -- decision traces ----------------------------------------------------------------------

    def traces(self, entity_path: str | None = None) -> list[DecisionTrace]:
        """One trace per session that committed outcomes, oldest outcome first; filtered to `entity_path`."""
        by_session: dict[str, list[OutcomeRecord]] = defaultdict(list)
        for record in self.outcomes:
            by_session[record.session_id].append(record)
        traces: list[DecisionTrace] = []
        for session_id, records in by_session.items():
            trace = self._trace(session_id, records)
            if entity_path is None or any(under(path, entity_path) for path in trace.entity_paths):
                traces.append(trace)
        traces.sort(key=lambda t: t.ended_at)
        return traces

    def _trace(self, session_id: str, records: list[OutcomeRecord]) -> DecisionTrace:
        events = [e for e in self.sessions.get(session_id, []) if e.at <= max(r.committed_at for r in records)]
        writes = [TraceWrite(e.entity_path, e.key, e.version, e.at) for e in events if e.kind == "write"]
        last_write = writes[-1].at if writes else None
        context: dict[str, TraceRead] = {}
        written: set[str] = set()
        for event in events:
            if event.kind == "write":
                written.add(entry_key(event.entity_path, event.key))
                continue
            if last_write is not None and event.at > last_write:
                continue
            read = TraceRead(
                event.entity_path, event.key, event.version, event.at,
                dict((event.detail or {}).get("ranks") or {}) or None if event.kind == "retrieve" else None,
            )
            if read.entry_key in written:
                continue
            previous = context.get(read.entry_key)
            # Keep the first sighting's position, the newest version seen, and ranks when any sighting had them.
            if previous is None:
                context[read.entry_key] = read
            elif read.version >= previous.version:
                context[read.entry_key] = TraceRead(
                    read.entity_path, read.key, read.version, read.at, read.ranks or previous.ranks
                )
        if not context:
            for record in records:
                for effect in record.effects:
                    context.setdefault(
                        effect.entry_key,
                        TraceRead(effect.entity_path, effect.key, effect.version_read or effect.version_updated,
                                  record.committed_at),
                    )
        agent_id = records[0].agent_id
        return DecisionTrace(session_id, agent_id, list(context.values()), writes, records)

    def read_event_for(self, session_id: str, effect: OutcomeEffect, before: datetime) -> TraceRead | None:
        """The sighting of an outcome's causal entry in the committing session: its last retrieve (which
        carries strategy ranks), else its last read; None when the session never saw it."""
        best: TraceEvent | None = None
        for event in self.sessions.get(session_id, []):
            if event.entity_path != effect.entity_path or event.key != effect.key or event.at > before:
                continue
            if event.kind == "retrieve" or (event.kind == "read" and (best is None or best.kind == "read")):
                best = event
        if best is None:
            return None
        ranks = (best.detail or {}).get("ranks") if best.kind == "retrieve" else None
        return TraceRead(best.entity_path, best.key, best.version, best.at, dict(ranks) if ranks else None)

    def last_retrieve_of(self, entity_path: str, key: str) -> TraceRead | None:
        """The latest time an entry was shown by amfs_retrieve, with its ranks (for never-linked negatives)."""
        event = self._last_retrieve.get(entry_key(entity_path, key))
        if event is None:
            return None
        return TraceRead(event.entity_path, event.key, event.version, event.at,
                         dict((event.detail or {}).get("ranks") or {}) or None)

    def read_ages_days(self, entity_path: str | None = None) -> list[float]:
        """Age of the version read at each read or retrieve, in days (how old actively used entries are)."""
        ages = []
        for event in self.events:
            if event.kind not in ("read", "retrieve") or not under(event.entity_path, entity_path):
                continue
            version = self.versions.get((event.entity_path, event.key, event.version))
            if version is not None:
                ages.append(max(0.0, (event.at - version.provenance.written_at).total_seconds() / 86_400.0))
        return ages
