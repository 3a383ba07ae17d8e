"""Confidence: outcome multipliers and the four-signal decay model (the formulas live here only)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime

from .errors import ValidationError
from .validation import MAX_CONFIDENCE
from .models import MemoryEntry, MemoryType, OutcomeType

DEFAULT_MULTIPLIERS: dict[OutcomeType, float] = {
    OutcomeType.CRITICAL_FAILURE: 1.15,
    OutcomeType.FAILURE: 1.10,
    OutcomeType.MINOR_FAILURE: 1.08,
    OutcomeType.SUCCESS: 0.97,
}

TYPE_HALF_LIFE_MULTIPLIER: dict[MemoryType, float] = {
    MemoryType.FACT: 1.0,
    MemoryType.BELIEF: 0.5,
    MemoryType.EXPERIENCE: 1.5,
}

SECONDS_PER_DAY = 86_400.0


def validate_multipliers(multipliers: Mapping[OutcomeType | str, float]) -> dict[OutcomeType, float]:
    """Every outcome type gets a finite positive multiplier; missing types keep their defaults."""
    if not isinstance(multipliers, Mapping):
        raise ValidationError(f"Multipliers must map outcome types to numbers, got {multipliers!r}.")
    resolved = dict(DEFAULT_MULTIPLIERS)
    for name, value in multipliers.items():
        try:
            outcome_type = OutcomeType(name)
        except ValueError:
            raise ValidationError(
                f"Unknown outcome type {name!r} in multipliers; use one of {[t.value for t in OutcomeType]}."
            ) from None
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValidationError(f"Multiplier for {outcome_type.value} must be a finite number > 0, got {value!r}.")
        resolved[outcome_type] = float(value)
    return resolved


def apply_outcome(confidence: float, multiplier: float) -> float:
    """The one place outcomes change confidence: capped at MAX_CONFIDENCE so no chain of failures overflows."""
    return bounded_confidence(bounded_confidence(confidence) * multiplier)


def bounded_confidence(confidence: float) -> float:
    """A stored confidence brought into [0, MAX_CONFIDENCE]: stores written before the cap may hold larger
    values or infinity, which JSON cannot carry (MCP clients would see null where a number is declared)."""
    if math.isnan(confidence):
        return 0.0
    return min(max(confidence, 0.0), MAX_CONFIDENCE)


def effective_half_life_days(
    base_half_life_days: float, memory_type: MemoryType, recall_count: int, outcome_count: int
) -> float:
    return (
        base_half_life_days
        * TYPE_HALF_LIFE_MULTIPLIER[memory_type]
        * (1.0 + math.log1p(recall_count))
        * (2.0 if outcome_count > 0 else 1.0)
    )


def effective_confidence(entry: MemoryEntry, now: datetime, base_half_life_days: float | None) -> float:
    """Confidence after decay with age at the entry's effective half-life; no decay when unset."""
    if base_half_life_days is None:
        return entry.confidence
    half_life = effective_half_life_days(
        base_half_life_days, entry.memory_type, entry.recall_count, entry.outcome_count
    )
    age_days = max(0.0, (now - entry.provenance.written_at).total_seconds() / SECONDS_PER_DAY)
    decay: float = 0.5 ** (age_days / half_life)
    return entry.confidence * decay
