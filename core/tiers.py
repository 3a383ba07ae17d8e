"""Tiers: a priority score from recency, confidence, recall frequency and importance, and the tier it implies.

Tiers are recomputed whenever an entry is written, read or hit by an outcome, and again whenever an
entry is returned, so progressive retrieval never depends on a manual re-tiering step.
"""

from __future__ import annotations

import math
from datetime import datetime

from .models import Tier

RECENCY_HALF_LIFE_DAYS = 7.0
DEFAULT_IMPORTANCE = 0.5
WEIGHTS = {"recency": 0.35, "confidence": 0.25, "recall": 0.20, "importance": 0.20}
HOT_THRESHOLD = 0.6
WARM_THRESHOLD = 0.35


def priority_score(
    written_at: datetime, now: datetime, confidence: float, recall_count: int, importance_score: float | None
) -> float:
    age_days = max(0.0, (now - written_at).total_seconds() / 86_400.0)
    recency: float = 0.5 ** (age_days / RECENCY_HALF_LIFE_DAYS)
    confidence_signal = min(max(confidence, 0.0), 1.0)
    recall_signal = 1.0 - 1.0 / (1.0 + math.log1p(recall_count))
    importance = DEFAULT_IMPORTANCE if importance_score is None else importance_score
    score = (
        WEIGHTS["recency"] * recency
        + WEIGHTS["confidence"] * confidence_signal
        + WEIGHTS["recall"] * recall_signal
        + WEIGHTS["importance"] * importance
    )
    return round(score, 6)


def tier_for(score: float) -> Tier:
    if score >= HOT_THRESHOLD:
        return Tier.HOT
    if score >= WARM_THRESHOLD:
        return Tier.WARM
    return Tier.ARCHIVE
