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


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_apply_on_a_pure_noise_history_refuses_with_the_reason_and_changes_nothing(
    sqlite_service: MemoryService, seed: int
) -> None:
    await sqlite_service.import_snapshot(planted_history(outcomes=1200, noise_only=True, seed=seed, per_outcome_reads=2))
    report = await ConfidenceCalibrator(sqlite_service).calibrate(apply=True)
    assert report.applied is False
    assert report.apply_refused is not None and "Nothing applied" in report.apply_refused
    assert report.global_multipliers.multipliers == {t.value: m for t, m in DEFAULT_MULTIPLIERS.items()}
    assert sqlite_service.multipliers == DEFAULT_MULTIPLIERS
    assert not any(signal.significant for signal in report.global_multipliers.signals.values())


async def test_apply_on_real_signal_changes_only_significant_types_and_reports_their_intervals(
    sqlite_service: MemoryService,
) -> None:
    await sqlite_service.import_snapshot(planted_history(outcomes=1500))
    report = await ConfidenceCalibrator(sqlite_service).calibrate(apply=True)
    assert report.applied and report.apply_refused is None
    for name, signal in report.global_multipliers.signals.items():
        default = DEFAULT_MULTIPLIERS[OutcomeType(name)]
        if signal.significant:
            lo, hi = signal.multiplier_ci
            assert not lo <= default <= hi
        else:
            assert signal.multiplier == default
    assert report.global_multipliers.signals["critical_failure"].significant


def test_a_non_significant_severity_inversion_is_held_and_a_significant_one_stands() -> None:
    from amfs_server.ml.calibrator import TypeSignal

    def signal(name: str, significant: bool) -> TypeSignal:
        return TypeSignal(name, 50, 50, 0.3, 0.1, 1.0, 1.0, True, significant=significant)

    critical, failure, minor = OutcomeType.CRITICAL_FAILURE, OutcomeType.FAILURE, OutcomeType.MINOR_FAILURE
    signals = {t.value: signal(t.value, t is minor) for t in (critical, failure, minor, OutcomeType.SUCCESS)}
    # minor_failure moved above failure, but its draws overlap failure's: not significant, so it is held there.
    gated = {critical: 1.15, failure: 1.10, minor: 1.16, OutcomeType.SUCCESS: 0.97}
    overlapping = {critical: [1.15] * 100, failure: [1.10] * 100, minor: [1.0 + 0.002 * i for i in range(100)]}
    notes = ConfidenceCalibrator._hold_severity_order(gated, overlapping, signals)
    assert gated[critical] >= gated[failure] >= gated[minor] > 1.0 > gated[OutcomeType.SUCCESS]
    assert gated[minor] == 1.10 and gated[failure] == 1.10  # only the type that moved was held
    assert any("not significant" in note for note in notes)

    signals = {t.value: signal(t.value, True) for t in (critical, failure, minor, OutcomeType.SUCCESS)}
    gated = {critical: 1.15, failure: 1.10, minor: 1.30, OutcomeType.SUCCESS: 0.97}
    separated = {critical: [1.15] * 100, failure: [1.10] * 100, minor: [1.28 + 0.0004 * i for i in range(100)]}
    notes = ConfidenceCalibrator._hold_severity_order(gated, separated, signals)
    assert gated[minor] == 1.30 and any("significant" in note and "stands" in note for note in notes)
