"""Fixtures for the ML layer: a simulated outcome history (the benchmark's simulator, small), imported
into the `store` fixture's adapter (`[sqlite]`, `[postgres]`) or a plain SQLite store, and synthetic
histories with planted per-type signal for the calibrator."""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from amfs_server.core.ports import StoreSnapshot
from amfs_server.adapters.sqlite import SQLiteStore
from amfs_server.core.models import (
    MemoryEntry,
    MemoryType,
    OutcomeEffect,
    OutcomeRecord,
    OutcomeType,
    Provenance,
    Tier,
    TraceEvent,
)
from amfs_server.core.service import MemoryService
from amfs_server.session_bench.ml_bench import OutcomeSimulator, SimClock, SimConfig, open_service, simulate, simulated_time

SIM_CONFIG = SimConfig(sessions=40, topics=4, services=2, entries_per_topic=10, scenario="static")


def _simulate(sessions: int) -> StoreSnapshot:
    async def build() -> StoreSnapshot:
        with tempfile.TemporaryDirectory() as tmp:
            clock = SimClock()
            with simulated_time(clock):
                simulator = OutcomeSimulator(SIM_CONFIG, clock)
                service = await open_service(Path(tmp) / "sim.db")
                await simulator.seed_world(service)
                await simulate(service, simulator, range(sessions))
                snapshot = await service.export_snapshot()
                await service.close()
        return snapshot

    return asyncio.run(build())


@pytest.fixture(scope="session")
def simulated_history() -> StoreSnapshot:
    """40 simulated sessions: ~200 outcome-linked reads, clean and failed traces, decisions written."""
    return _simulate(SIM_CONFIG.sessions)


@pytest.fixture(scope="session")
def short_history() -> StoreSnapshot:
    """3 sessions: 15 outcome-linked reads, below the ranker's minimum of 20."""
    return _simulate(3)


async def _service(store: object, snapshot: StoreSnapshot | None) -> MemoryService:
    service = MemoryService(store)  # type: ignore[arg-type]
    await service.open()
    if snapshot is not None:
        await service.import_snapshot(snapshot)
    return service


@pytest.fixture
async def sim_service(store: object, simulated_history: StoreSnapshot) -> MemoryService:
    """The simulated history on each adapter."""
    return await _service(store, simulated_history)


@pytest.fixture
async def sqlite_service(tmp_path: Path) -> AsyncIterator[MemoryService]:
    service = await _service(SQLiteStore(tmp_path / "ml.db"), None)
    yield service
    await service.close()


@pytest.fixture
async def sim_sqlite(sqlite_service: MemoryService, simulated_history: StoreSnapshot) -> MemoryService:
    await sqlite_service.import_snapshot(simulated_history)
    return sqlite_service


# -- synthetic histories with planted signal --------------------------------------------------------------

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
CAUSED = {OutcomeType.CRITICAL_FAILURE: 0.7, OutcomeType.FAILURE: 0.25, OutcomeType.MINOR_FAILURE: 0.05}
NOISE = {OutcomeType.CRITICAL_FAILURE: 0.05, OutcomeType.FAILURE: 0.35, OutcomeType.MINOR_FAILURE: 0.6}


def _pick(weights: dict[OutcomeType, float], draw: float) -> OutcomeType:
    cumulative = 0.0
    for outcome_type, weight in weights.items():
        cumulative += weight
        if draw < cumulative:
            return outcome_type
    return next(reversed(weights))


def _entry(entity: str, key: str, written_at: datetime, confidence: float = 1.0) -> MemoryEntry:
    return MemoryEntry(
        entity_path=entity, key=key, value=f"{key} guidance", version=1, confidence=confidence,
        provenance=Provenance("agent/prod-bot", f"write-{key}", written_at), memory_type=MemoryType.FACT, tier=Tier.WARM,
    )


def planted_history(
    outcomes: int = 600, entities: int = 3, per_entity: int = 20, seed: int = 0, per_outcome_reads: int = 1,
    only: dict[str, int] | None = None, noise_only: bool = False,
) -> StoreSnapshot:
    """Entries with hidden badness; each outcome links `per_outcome_reads` entries. Bad entries cause
    incidents of mostly critical type; chance incidents are mostly minor. So critical carries the
    strongest signal and minor the weakest. `only` caps how many outcomes of a type are produced.
    `noise_only`: no entry causes anything; 35% of outcomes are incidents of a random type."""
    rng = random.Random(seed)
    entries = [
        _entry(f"svc-{e}", f"note-{i}", T0 - timedelta(days=rng.uniform(1, 40)))
        for e in range(entities) for i in range(per_entity)
    ]
    bad = {entry.entry_key: rng.random() < 0.4 for entry in entries}
    confidence = {entry.entry_key: 1.0 for entry in entries}
    records: list[OutcomeRecord] = []
    traces: list[TraceEvent] = []
    produced: dict[OutcomeType, int] = {t: 0 for t in OutcomeType}
    for n in range(outcomes):
        at = T0 + timedelta(hours=n)
        linked = rng.sample(entries, per_outcome_reads)
        caused = any(bad[e.entry_key] for e in linked) and rng.random() < 0.7 and not noise_only
        if caused:
            outcome_type = _pick(CAUSED, rng.random())
        elif noise_only:
            outcome_type = OutcomeType.SUCCESS if rng.random() >= 0.35 else rng.choice(list(CAUSED))
        elif rng.random() < 0.25:
            outcome_type = _pick(NOISE, rng.random())
        else:
            outcome_type = OutcomeType.SUCCESS
        if only is not None and produced[outcome_type] >= only.get(outcome_type.value, 10**9):
            continue
        produced[outcome_type] += 1
        session = f"s-{n}"
        effects = []
        for entry in linked:
            before = confidence[entry.entry_key]
            after = before * {OutcomeType.SUCCESS: 0.97}.get(outcome_type, 1.1)
            confidence[entry.entry_key] = after
            effects.append(OutcomeEffect(entry.entity_path, entry.key, 1, 1, before, after))
            traces.append(TraceEvent(session, "agent/prod-bot", "read", entry.entity_path, entry.key, 1, at))
        records.append(OutcomeRecord(f"out-{n}", outcome_type, 1.0, at + timedelta(minutes=1), "agent/prod-bot",
                                     session, tuple(effects)))
    final = [
        e.with_changes(confidence=confidence[e.entry_key],
                       outcome_count=sum(1 for r in records for f in r.effects if f.entry_key == e.entry_key))
        for e in entries
    ]
    return StoreSnapshot(entries=final, outcomes=records, traces=traces)
