"""The confidence calibrator: refusals, recovery of planted signal, apply/revert, per-entity overrides, half-life."""

from __future__ import annotations

from datetime import timedelta

import pytest

from amfs_server.core.ports import StoreSnapshot
from amfs_server.adapters.sqlite import SQLiteStore
from amfs_server.core.confidence import DEFAULT_MULTIPLIERS
from amfs_server.core.errors import InsufficientDataError
from amfs_server.core.models import Actor, OutcomeType, TraceEvent
from amfs_server.core.service import MemoryService
from amfs_server.ml import ConfidenceCalibrator

from .conftest import T0, _entry, planted_history


async def test_calibration_is_refused_below_5_outcomes_per_type_and_names_the_counts(sqlite_service: MemoryService) -> None:
    await sqlite_service.import_snapshot(planted_history(outcomes=400, only={t.value: 4 for t in OutcomeType}))
    with pytest.raises(InsufficientDataError, match=r"at least 5 outcomes per type.*success 4"):
        await ConfidenceCalibrator(sqlite_service).calibrate()
    assert sqlite_service.multipliers == DEFAULT_MULTIPLIERS


async def test_calibration_recovers_the_planted_order_of_signal_strength(sqlite_service: MemoryService) -> None:
    await sqlite_service.import_snapshot(planted_history(outcomes=1500))
    report = await ConfidenceCalibrator(sqlite_service).calibrate()
    signals = report.global_multipliers.signals
    strength = {t: signals[t].signal_strength for t in ("critical_failure", "failure", "minor_failure")}
    assert strength["critical_failure"] > strength["failure"] > strength["minor_failure"], strength
    multipliers = report.global_multipliers.multipliers
    # The strongest signal moves further from 1.0 than its default, the weakest less far; bounded either way.
    assert multipliers["critical_failure"] > DEFAULT_MULTIPLIERS[OutcomeType.CRITICAL_FAILURE]
    assert 1.0 < multipliers["minor_failure"] < DEFAULT_MULTIPLIERS[OutcomeType.MINOR_FAILURE]
    for name, value in multipliers.items():
        default = DEFAULT_MULTIPLIERS[OutcomeType(name)]
        assert 0.5 - 1e-9 <= (value - 1) / (default - 1) <= 2.0 + 1e-9
    assert report.total_outcomes == 1500 and report.total_entries == 60 and report.applied is False
    assert report.to_dict()["global_multipliers"]["entity_path"] is None


async def test_apply_makes_calibrated_multipliers_drive_outcomes_persists_them_and_revert_restores(
    sqlite_service: MemoryService, tmp_path
) -> None:
    await sqlite_service.import_snapshot(planted_history(outcomes=600))
    calibrator = ConfidenceCalibrator(sqlite_service)
    report_only = await calibrator.calibrate()
    assert sqlite_service.multipliers == DEFAULT_MULTIPLIERS  # the default only reports

    report = await calibrator.calibrate(apply=True)
    calibrated = report.global_multipliers.multipliers
    assert report.applied and report.multipliers_in_force == calibrated == report_only.global_multipliers.multipliers
    assert {t.value: m for t, m in sqlite_service.multipliers.items()} == calibrated
    actor = Actor("agent/test", "apply-test")
    await sqlite_service.read(actor, "svc-0", "note-0")
    record = await sqlite_service.commit_outcome(actor, "after-apply", "critical_failure")
    assert record.multiplier == calibrated["critical_failure"]

    reopened = MemoryService(SQLiteStore(tmp_path / "ml.db"))
    await reopened.open()
    assert {t.value: m for t, m in reopened.multipliers.items()} == calibrated  # persisted
    await reopened.close()

    restored = await calibrator.revert()
    assert restored == {t.value: m for t, m in DEFAULT_MULTIPLIERS.items()}
    assert sqlite_service.multipliers == DEFAULT_MULTIPLIERS


async def test_per_entity_overrides_cover_only_entities_with_5_outcomes_of_a_type(sqlite_service: MemoryService) -> None:
    snapshot = planted_history(outcomes=900, entities=3)
    # svc-2's entries join only three outcomes: too few for an override.
    kept = 0
    outcomes = []
    for record in snapshot.outcomes:
        if any(e.entity_path == "svc-2" for e in record.effects):
            kept += 1
            if kept > 3:
                continue
        outcomes.append(record)
    snapshot.outcomes = outcomes
    await sqlite_service.import_snapshot(snapshot)
    report = await ConfidenceCalibrator(sqlite_service).calibrate(per_entity=True)
    assert [m.entity_path for m in report.entity_multipliers] == ["svc-0", "svc-1"]
    for override in report.entity_multipliers:
        assert override.num_outcomes_analyzed >= 5
        assert set(override.multipliers) == {t.value for t in OutcomeType}


async def test_decay_half_life_is_the_median_age_of_the_versions_sessions_read(sqlite_service: MemoryService) -> None:
    snapshot = planted_history(outcomes=300)
    written = T0 - timedelta(days=100)
    snapshot.entries.append(_entry("svc-aged", "old-note", written))
    snapshot.traces = [  # the only reads: ages 1..41 days, median 21
        TraceEvent(f"r-{days}", "agent/x", "read", "svc-aged", "old-note", 1, written + timedelta(days=days))
        for days in range(1, 42)
    ]
    await sqlite_service.import_snapshot(snapshot)
    report = await ConfidenceCalibrator(sqlite_service).calibrate()
    assert report.global_multipliers.decay_half_life_days == pytest.approx(21.0)


async def test_calibration_measures_simulated_sessions_on_each_store(store: object, simulated_history: StoreSnapshot) -> None:
    service = MemoryService(store)  # type: ignore[arg-type]
    await service.open()
    await service.import_snapshot(simulated_history)
    try:
        report = await ConfidenceCalibrator(service).calibrate(per_entity=True)
    except InsufficientDataError as error:  # a small simulation may lack an incident type: the refusal says so
        assert "found" in str(error)
        return
    assert report.total_outcomes == len(simulated_history.outcomes)
    assert report.global_multipliers.signals["success"].num_outcomes >= 5
