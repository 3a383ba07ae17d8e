"""The confidence document's worked examples, computed exactly."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from amfs_server.core.confidence import (
    DEFAULT_MULTIPLIERS,
    apply_outcome,
    effective_confidence,
    effective_half_life_days,
    validate_multipliers,
)
from amfs_server.core.errors import ValidationError
from amfs_server.core.models import MemoryEntry, MemoryType, OutcomeType, Provenance, utcnow


def test_outcome_sequence_from_the_document_is_reproduced_exactly() -> None:
    sequence = [
        OutcomeType.CRITICAL_FAILURE, OutcomeType.SUCCESS, OutcomeType.SUCCESS,
        OutcomeType.SUCCESS, OutcomeType.FAILURE, OutcomeType.SUCCESS,
    ]
    expected = [0.9775, 0.9482, 0.9197, 0.8921, 0.9814, 0.9519]
    confidence = 0.85
    for outcome, want in zip(sequence, expected):
        confidence = apply_outcome(confidence, DEFAULT_MULTIPLIERS[outcome])
        assert round(confidence, 4) == want
    assert confidence == pytest.approx(0.85 * 1.15 * 0.97**4 * 1.10, rel=1e-12)


def test_effective_half_life_of_a_30_day_fact_with_10_reads_and_an_outcome_is_203_9_days() -> None:
    half_life = effective_half_life_days(30.0, MemoryType.FACT, recall_count=10, outcome_count=1)
    assert round(half_life, 1) == 203.9
    assert half_life == pytest.approx(30 * (1 + math.log1p(10)) * 2)


@pytest.mark.parametrize(
    ("memory_type", "factor"), [(MemoryType.FACT, 1.0), (MemoryType.BELIEF, 0.5), (MemoryType.EXPERIENCE, 1.5)]
)
def test_memory_type_scales_the_half_life(memory_type: MemoryType, factor: float) -> None:
    assert effective_half_life_days(10.0, memory_type, 0, 0) == pytest.approx(10.0 * factor)


def _entry(age_days: float, memory_type: MemoryType = MemoryType.FACT, recalls: int = 0, outcomes: int = 0) -> MemoryEntry:
    now = utcnow()
    return MemoryEntry(
        "svc", "k", "v", 1, 0.8, Provenance("a", "s", now - timedelta(days=age_days)),
        outcome_count=outcomes, recall_count=recalls, memory_type=memory_type,
    )


def test_effective_confidence_halves_after_one_effective_half_life() -> None:
    entry = _entry(age_days=30.0)
    assert effective_confidence(entry, utcnow(), 30.0) == pytest.approx(0.4, rel=1e-4)


def test_belief_decays_twice_as_fast_as_a_fact() -> None:
    assert effective_confidence(_entry(15.0, MemoryType.BELIEF), utcnow(), 30.0) == pytest.approx(0.4, rel=1e-4)


def test_no_half_life_means_no_decay() -> None:
    assert effective_confidence(_entry(3650.0), utcnow(), None) == 0.8


def test_multipliers_can_be_overridden_but_must_be_positive_and_known() -> None:
    resolved = validate_multipliers({"success": 0.9})
    assert resolved[OutcomeType.SUCCESS] == 0.9 and resolved[OutcomeType.FAILURE] == 1.10
    with pytest.raises(ValidationError, match="Unknown outcome type"):
        validate_multipliers({"meltdown": 2.0})
    with pytest.raises(ValidationError, match="finite number > 0"):
        validate_multipliers({"success": -1})


def test_outcomes_never_push_confidence_past_the_maximum_or_to_infinity() -> None:
    from amfs_server.core.validation import MAX_CONFIDENCE

    confidence = 1.0
    for _ in range(10_000):
        confidence = apply_outcome(confidence, DEFAULT_MULTIPLIERS[OutcomeType.CRITICAL_FAILURE])
    assert confidence == MAX_CONFIDENCE
    assert apply_outcome(MAX_CONFIDENCE, 1e308) == MAX_CONFIDENCE
    assert apply_outcome(math.inf, 0.97) == MAX_CONFIDENCE * 0.97  # a store written before the cap
    assert apply_outcome(MAX_CONFIDENCE, DEFAULT_MULTIPLIERS[OutcomeType.SUCCESS]) < MAX_CONFIDENCE


async def test_a_long_chain_of_critical_failures_keeps_stored_confidence_finite_and_capped(service, actor) -> None:
    from amfs_server.core.service import WriteRequest
    from amfs_server.core.validation import MAX_CONFIDENCE

    await service.write(actor, WriteRequest(entity_path="svc", key="k", value="v", confidence=MAX_CONFIDENCE))
    for n in range(40):
        record = await service.commit_outcome(actor, f"INC-{n}", OutcomeType.CRITICAL_FAILURE, ["svc/k"])
        assert math.isfinite(record.effects[0].confidence_after)
    entry = await service.read(actor, "svc", "k")
    assert entry.confidence == MAX_CONFIDENCE
    listed = await service.list(entity_path="svc")
    assert [e.confidence for e in listed] == [MAX_CONFIDENCE]


async def test_an_infinite_confidence_left_by_older_code_is_read_back_as_the_maximum(store, service, actor) -> None:
    from amfs_server.core.service import WriteRequest
    from amfs_server.core.validation import MAX_CONFIDENCE

    await service.write(actor, WriteRequest(entity_path="svc", key="k", value="v"))
    if hasattr(store, "_pool"):
        async with store._pool.acquire() as conn:
            await conn.execute("UPDATE entries SET confidence = 'Infinity'::float8")
    else:
        store._connection().execute("UPDATE entries SET confidence = 9e999")
        store._connection().commit()
    assert (await service.read(actor, "svc", "k")).confidence == MAX_CONFIDENCE
    record = await service.commit_outcome(actor, "INC-1", OutcomeType.SUCCESS, ["svc/k"])
    assert record.effects[0].confidence_after == MAX_CONFIDENCE * DEFAULT_MULTIPLIERS[OutcomeType.SUCCESS]
