"""The learned ranker's features: one function turns a MemoryEntry (plus its retrieval ranks) into a row.

Training (entries as they were when read, `OutcomeHistory.as_of`) and scoring (candidates at
retrieval time) both call `feature_row`, so the two can never drift apart. A rank a strategy did not
give (the entry was not among its hits, or it was read directly) is missing (NaN), which LightGBM
handles natively; the `learned` strategy's own rank is never a feature.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime

import numpy as np

from ..core.models import MemoryEntry, MemoryType, ProvenanceTier
from ..core.tiers import DEFAULT_IMPORTANCE

RANK_STRATEGIES: tuple[str, ...] = ("semantic", "keyword", "temporal", "confidence")

FEATURE_NAMES: tuple[str, ...] = (
    "confidence",
    "outcome_count",
    "log_age_hours",
    "recall_count",
    "version",
    "importance",
    "tier",
    "log_confidence_per_outcome",
    *(f"memory_type_{t.value}" for t in MemoryType),
    *(f"tier_{t.name.lower()}" for t in ProvenanceTier),
    *(f"rank_{name}" for name in RANK_STRATEGIES),
)
"""Stored with every model; a model whose names differ is not loaded (retrain it)."""


def feature_row(entry: MemoryEntry, ranks: Mapping[str, int] | None, now: datetime) -> list[float]:
    age_hours = max(0.0, (now - entry.provenance.written_at).total_seconds() / 3600.0)
    confidence = max(entry.confidence, 1e-9)
    provenance = entry.provenance_tier
    row = [
        entry.confidence,
        float(entry.outcome_count),
        math.log1p(age_hours),
        float(entry.recall_count),
        float(entry.version),
        DEFAULT_IMPORTANCE if entry.importance_score is None else entry.importance_score,
        float(int(entry.tier)),
        # Outcomes multiply confidence (incidents up, clean outcomes down): the drift per outcome says which won.
        math.log(confidence) / max(1, entry.outcome_count),
        *(1.0 if entry.memory_type is t else 0.0 for t in MemoryType),
        *(1.0 if provenance is t else 0.0 for t in ProvenanceTier),
    ]
    for name in RANK_STRATEGIES:
        rank = (ranks or {}).get(name) or 0
        row.append(float(rank) if rank > 0 else math.nan)
    return row


def feature_matrix(
    entries: Sequence[MemoryEntry], ranks: Sequence[Mapping[str, int] | None], now: datetime | Sequence[datetime]
) -> np.ndarray:
    moments = now if isinstance(now, Sequence) else [now] * len(entries)
    rows = [feature_row(entry, rank, moment) for entry, rank, moment in zip(entries, ranks, moments)]
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(FEATURE_NAMES))
