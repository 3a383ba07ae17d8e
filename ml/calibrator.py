"""Outcome calibration: multipliers sized to how much each outcome type actually says about its entries.

For every outcome of type T, each causally linked entry's *later* outcomes (its next 10) show whether
the entry keeps ending up in incidents. Per type:

- `later_incident_rate`: the mean share of incidents among those later outcomes, over T's links;
- `signal_strength`: for an incident type, its later incident rate minus that of entries behind clean
  outcomes (how much worse the entries it blamed really were); for success, the pooled incident
  types' rate minus its own (how much better the entries it credited were). Zero means the outcome
  type is noise as far as the entries are concerned.

Only *relative* strengths are identifiable from outcome data (every read entry is linked, so the
absolute effect is diluted by how many were read), and only relative strengths are needed: each
type's multiplier keeps its default's direction and moves its distance from 1.0 by
`scale = strength / mean incident-type strength`, shrunk towards 1.0 when a type has few outcomes
and bounded to [0.5, 2.0], so no type (and no single noisy entity) can run away. With no
detectable signal the proposal is pulled towards 1.0, and the evidence test keeps it from applying.

The decay half-life estimate is the median age of the entry versions that sessions actually read
(for exponentially fading use, the median age is the half-life).

Apply only on evidence. Outcomes are resampled (a bootstrap over outcomes, `BOOTSTRAP_RESAMPLES`
draws) to give each type's calibrated multiplier a 95% interval. A type's multiplier changes from its
configured value only when it has `MIN_APPLY_OUTCOMES`+ outcomes, the mean incident signal is itself
significantly above zero, and the interval excludes the configured value; otherwise it keeps the
configured one and the report says why. The severity order (critical >= failure >= minor_failure > 1 >
success) is kept unless the bootstrap shows the inversion itself is significant; the report notes each
pair it held or let go. `apply=True` with no type to change refuses (the report's `apply_refused`
says why) and changes nothing: on a pure-noise history nothing is applied.

Per-entity overrides exist for entities with 5+ outcomes of a type; they are measured against the
global signal and shrunk towards the global scale. `apply=True` makes the global multipliers the ones
`commit_outcome` uses (persisted by the service, reported, and reverted with `revert`).
"""

from __future__ import annotations

import bisect
import random
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.ports import MemoryStore
from ..core.errors import InsufficientDataError, ValidationError
from ..core.models import OutcomeRecord, OutcomeType, utcnow
from ..core.service import MemoryService
from ._common import Progress, no_progress, resolve_service
from .traces import INCIDENT_TYPES, OutcomeHistory

MIN_OUTCOMES_PER_TYPE = 5
LATER_WINDOW = 10
MIN_SCALE, MAX_SCALE = 0.5, 2.0
GLOBAL_PRIOR_OUTCOMES = 5.0
"""Shrinkage: a type's scale counts as this many outcomes' worth of evidence for 1.0 (its default)."""
ENTITY_PRIOR_OUTCOMES = 10.0
"""Shrinkage of an entity's scale towards the global one."""
MIN_SIGNAL = 1e-3
MIN_APPLY_OUTCOMES = 20
"""A type's multiplier is changed only with at least this many outcomes of it (and a significant interval)."""
BOOTSTRAP_RESAMPLES = 400
CONFIDENCE_LEVEL = 0.95
SEVERITY_ORDER: tuple[OutcomeType, ...] = (OutcomeType.CRITICAL_FAILURE, OutcomeType.FAILURE, OutcomeType.MINOR_FAILURE)
MIN_READS_FOR_HALF_LIFE = 20
ALL_TYPES: tuple[OutcomeType, ...] = (*INCIDENT_TYPES, OutcomeType.SUCCESS)


@dataclass(frozen=True)
class TypeSignal:
    outcome_type: str
    num_outcomes: int
    num_links: int
    """Causal links of this type whose entry has later outcomes to judge by."""
    later_incident_rate: float | None
    signal_strength: float | None
    scale: float
    multiplier: float
    calibrated: bool
    note: str | None = None
    proposed_multiplier: float | None = None
    """What the point estimate alone would give; `multiplier` is what the evidence supports (global set only)."""
    multiplier_ci: tuple[float, float] | None = None
    strength_ci: tuple[float, float] | None = None
    significant: bool = False
    """The change from the configured multiplier is supported by the evidence (see the module docstring)."""


@dataclass(frozen=True)
class MultiplierSet:
    """The document's shape for the global set (`entity_path` null) and each per-entity override."""

    entity_path: str | None
    multipliers: dict[str, float]
    decay_half_life_days: float | None
    num_outcomes_analyzed: int
    signals: dict[str, TypeSignal] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CalibrationReport:
    global_multipliers: MultiplierSet
    entity_multipliers: list[MultiplierSet]
    total_outcomes: int
    total_entries: int
    applied: bool
    multipliers_in_force: dict[str, float]
    calibrated_at: str
    apply_refused: str | None = None
    """Why `apply=True` applied nothing (no type's change is supported by the evidence)."""
    evidence: list[str] = field(default_factory=list)
    """Per-type and severity-order decisions of the evidence test, in words."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Measured:
    outcomes: dict[OutcomeType, int]
    rates: dict[OutcomeType, list[float]]
    groups: dict[OutcomeType, list[list[float]]] = field(default_factory=dict)
    """The same rates grouped by outcome: the bootstrap resamples outcomes, not links (links of one outcome
    are not independent)."""

    def rate(self, outcome_type: OutcomeType) -> float | None:
        values = self.rates.get(outcome_type) or []
        return sum(values) / len(values) if values else None

    def pooled_incident_rate(self, types: list[OutcomeType]) -> float | None:
        values = [r for t in types for r in self.rates.get(t, [])]
        return sum(values) / len(values) if values else None

    def resample(self, rng: random.Random) -> _Measured:
        groups = {}
        for t, per_outcome in self.groups.items():
            groups[t] = [per_outcome[rng.randrange(len(per_outcome))] for _ in per_outcome]
        return _Measured(
            {t: len(g) for t, g in groups.items()}, {t: [r for g in gs for r in g] for t, gs in groups.items()}, groups
        )


class ConfidenceCalibrator:
    """Learns outcome multipliers and a decay half-life from the outcome history."""

    def __init__(self, service_or_store: MemoryService | MemoryStore, *, min_outcomes: int = MIN_OUTCOMES_PER_TYPE) -> None:
        self.service, self._owns_service = resolve_service(service_or_store)
        self.min_outcomes = min_outcomes

    @property
    def base_multipliers(self) -> dict[OutcomeType, float]:
        """The configured multipliers: calibration always starts from these, so re-calibrating never compounds."""
        return dict(self.service.config.multipliers)

    async def calibrate(
        self, per_entity: bool = False, apply: bool = False, progress: Progress | None = None
    ) -> CalibrationReport:
        report = progress or no_progress
        if apply and not self._owns_service:
            raise ValidationError("apply=True needs a MemoryService: this calibrator was built on a bare store.")
        report(0, 4, "reading the outcome history")
        history = await OutcomeHistory.load(self.service, values=False)  # rates of outcomes: no value is read
        records = history.outcomes
        report(1, 4, "measuring per-type signal")
        measured = _measure(records, None)
        self._check_enough(measured)
        global_signals, reference = self._signals(measured, None, None)
        global_signals, evidence = self._evidence(measured, global_signals)
        global_set = MultiplierSet(
            entity_path=None,
            multipliers={name: signal.multiplier for name, signal in global_signals.items()},
            decay_half_life_days=_half_life(history.read_ages_days()),
            num_outcomes_analyzed=len(records),
            signals=global_signals,
        )
        report(2, 4, "per-entity overrides" if per_entity else "done measuring")
        entity_sets: list[MultiplierSet] = []
        if per_entity:
            for entity in sorted({e.entity_path for r in records for e in r.effects}):
                entity_measured = _measure(records, entity)
                if max(entity_measured.outcomes.values(), default=0) < self.min_outcomes:
                    continue
                signals, _ = self._signals(entity_measured, global_signals, reference, global_measured=measured)
                entity_sets.append(
                    MultiplierSet(
                        entity_path=entity,
                        multipliers={k: s.multiplier for k, s in signals.items()},
                        decay_half_life_days=_half_life(history.read_ages_days(entity)),
                        num_outcomes_analyzed=sum(entity_measured.outcomes.values()),
                        signals=signals,
                    )
                )
        applied = False
        refused = None
        if apply:
            base = {t.value: m for t, m in self.base_multipliers.items()}
            if all(global_set.multipliers[name] == base[name] for name in base):
                refused = (
                    "Nothing applied: no outcome type's calibrated multiplier differs significantly from its configured "
                    "value (each needs " + f"{MIN_APPLY_OUTCOMES}+ outcomes and a {CONFIDENCE_LEVEL:.0%} bootstrap "
                    "interval that excludes the configured multiplier). " + " ".join(evidence)
                    + " Multipliers stay as they are; commit more outcomes and calibrate again."
                )
            else:
                report(3, 4, "applying the global multipliers")
                # Other processes on this store see the stored multipliers change and load them (ml/shared.py).
                await self.service.set_calibrated_multipliers(global_set.multipliers)
                applied = True
        report(4, 4, "calibrated")
        return CalibrationReport(
            global_multipliers=global_set,
            entity_multipliers=entity_sets,
            total_outcomes=len(records),
            total_entries=len({e.entry_key for r in records for e in r.effects}),
            applied=applied,
            multipliers_in_force={t.value: m for t, m in self.service.multipliers.items()},
            calibrated_at=utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
            apply_refused=refused,
            evidence=evidence,
        )

    async def revert(self) -> dict[str, float]:
        """Back to the configured multipliers (undoes `apply=True`); returns those now in force."""
        if not self._owns_service:
            raise ValidationError("revert needs a MemoryService: this calibrator was built on a bare store.")
        restored = await self.service.set_calibrated_multipliers(None)
        return {t.value: m for t, m in restored.items()}

    def _evidence(
        self, measured: _Measured, signals: dict[str, TypeSignal], seed: int = 0
    ) -> tuple[dict[str, TypeSignal], list[str]]:
        """Keep each type's configured multiplier unless the bootstrap supports the change; then hold the
        severity order unless its inversion is itself significant. Returns the gated signals and the reasons."""
        base = self.base_multipliers
        rng = random.Random(seed)
        draws: dict[OutcomeType, list[float]] = {t: [] for t in ALL_TYPES}
        strengths: dict[OutcomeType, list[float]] = {t: [] for t in ALL_TYPES}
        references: list[float] = []
        for _ in range(BOOTSTRAP_RESAMPLES):
            resampled = measured.resample(rng)
            try:
                sample, reference = self._signals(resampled, None, None)
            except ZeroDivisionError:
                continue
            references.append(reference)
            for t in ALL_TYPES:
                draws[t].append(sample[t.value].multiplier)
                if sample[t.value].signal_strength is not None:
                    strengths[t].append(sample[t.value].signal_strength)
        reference_ci = _interval(references)
        signal_exists = reference_ci is not None and reference_ci[0] > 0
        reasons: list[str] = []
        if not signal_exists:
            reasons.append(
                "The mean incident signal is not significantly above zero "
                f"({_fmt(reference_ci)}): outcomes say nothing measurable about the entries they name."
            )
        gated: dict[OutcomeType, float] = {}
        result: dict[str, TypeSignal] = {}
        for t in ALL_TYPES:
            signal = signals[t.value]
            ci = _interval(draws[t])
            n = measured.outcomes.get(t, 0)
            significant = (
                signal_exists and signal.calibrated and n >= MIN_APPLY_OUTCOMES and ci is not None
                and not ci[0] <= base[t] <= ci[1]
            )
            if significant:
                why = f"{t.value}: {n} outcomes, multiplier {signal.multiplier} ({_fmt(ci)}) excludes {base[t]}."
            elif n < MIN_APPLY_OUTCOMES:
                why = f"{t.value}: {n} outcomes (< {MIN_APPLY_OUTCOMES}): kept {base[t]}."
            else:
                why = f"{t.value}: multiplier {signal.multiplier} ({_fmt(ci)}) does not exclude {base[t]}: kept."
            reasons.append(why)
            gated[t] = signal.multiplier if significant else base[t]
            result[t.value] = TypeSignal(
                **{**asdict(signal), "multiplier": gated[t], "proposed_multiplier": signal.multiplier,
                   "multiplier_ci": ci, "strength_ci": _interval(strengths[t]), "significant": significant}
            )
        reasons += self._hold_severity_order(gated, draws, result)
        for t in ALL_TYPES:
            result[t.value] = TypeSignal(**{**asdict(result[t.value]), "multiplier": round(gated[t], 4)})
        return result, reasons

    @staticmethod
    def _hold_severity_order(
        gated: dict[OutcomeType, float], draws: dict[OutcomeType, list[float]], signals: dict[str, TypeSignal]
    ) -> list[str]:
        """critical >= failure >= minor_failure; an inversion stays only when the bootstrap makes it significant.
        Otherwise the type that moved is held at its neighbour's value (both meet in the middle when both moved).
        (minor_failure > 1 > success holds by construction: a multiplier never changes its side of 1.0.)"""
        notes: list[str] = []
        for _ in range(len(SEVERITY_ORDER)):
            inverted = False
            for higher, lower in zip(SEVERITY_ORDER, SEVERITY_ORDER[1:]):
                if gated[lower] <= gated[higher]:
                    continue
                gaps = [b - a for a, b in zip(draws[higher], draws[lower])]
                gap_ci = _interval(gaps)
                if signals[higher.value].significant and signals[lower.value].significant and gap_ci and gap_ci[0] > 0:
                    notes.append(
                        f"Severity order inverted ({lower.value} {gated[lower]} > {higher.value} {gated[higher]}): the "
                        f"bootstrap makes the inversion significant ({_fmt(gap_ci)}), so it stands."
                    )
                    continue
                moved_higher, moved_lower = signals[higher.value].significant, signals[lower.value].significant
                if moved_lower and not moved_higher:
                    gated[lower] = gated[higher]
                elif moved_higher and not moved_lower:
                    gated[higher] = gated[lower]
                else:
                    gated[higher] = gated[lower] = (gated[higher] + gated[lower]) / 2
                notes.append(
                    f"Severity order held: {lower.value} would exceed {higher.value} but the inversion is not "
                    f"significant ({_fmt(gap_ci)}); both now {gated[higher]:.4f}."
                )
                inverted = True
            if not inverted:
                break
        return notes

    def _check_enough(self, measured: _Measured) -> None:
        counts = ", ".join(f"{t.value} {measured.outcomes.get(t, 0)}" for t in ALL_TYPES)
        enough_incidents = [t for t in INCIDENT_TYPES if measured.outcomes.get(t, 0) >= self.min_outcomes]
        if measured.outcomes.get(OutcomeType.SUCCESS, 0) < self.min_outcomes or not enough_incidents:
            raise InsufficientDataError(
                f"Confidence calibration needs at least {self.min_outcomes} outcomes per type: {self.min_outcomes}+ "
                f"clean (success) outcomes as the baseline and {self.min_outcomes}+ of at least one incident type "
                f"(20+ per type is reliable); found {counts}. Multipliers stay as they are. Commit more outcomes "
                "with amfs_commit_outcome, then call amfs_calibrate again."
            )
        if measured.rate(OutcomeType.SUCCESS) is None or all(measured.rate(t) is None for t in enough_incidents):
            raise InsufficientDataError(
                f"Confidence calibration needs entries that appear in more than one outcome (to see what happened to "
                f"them later); outcomes found ({counts}) never share an entry with a later outcome. Multipliers stay "
                "as they are."
            )

    def _signals(
        self,
        measured: _Measured,
        global_signals: Mapping[str, TypeSignal] | None,
        reference: float | None,
        global_measured: _Measured | None = None,
    ) -> tuple[dict[str, TypeSignal], float]:
        """Per-type signal, scale and multiplier. Globally the reference is the mean incident-type signal;
        for an entity it is the global reference and scales shrink towards the global ones."""
        base = self.base_multipliers
        has_data = {t: measured.outcomes.get(t, 0) >= self.min_outcomes and measured.rate(t) is not None for t in ALL_TYPES}
        clean_rate = measured.rate(OutcomeType.SUCCESS) if has_data[OutcomeType.SUCCESS] else None
        if clean_rate is None and global_measured is not None:
            clean_rate = global_measured.rate(OutcomeType.SUCCESS)
        strengths: dict[OutcomeType, float] = {}
        for t in INCIDENT_TYPES:
            rate = measured.rate(t)
            if has_data[t] and rate is not None and clean_rate is not None:
                strengths[t] = rate - clean_rate
        incident_types = [t for t in INCIDENT_TYPES if t in strengths]
        pooled = measured.pooled_incident_rate(incident_types)
        if has_data[OutcomeType.SUCCESS] and pooled is not None and clean_rate is not None:
            strengths[OutcomeType.SUCCESS] = pooled - clean_rate
        if reference is None:
            weights = {t: len(measured.rates[t]) for t in incident_types}
            total = sum(weights.values())
            reference = sum(strengths[t] * weights[t] for t in incident_types) / total if total else 0.0
        prior_outcomes = GLOBAL_PRIOR_OUTCOMES if global_signals is None else ENTITY_PRIOR_OUTCOMES
        signals: dict[str, TypeSignal] = {}
        for t in ALL_TYPES:
            prior = 1.0 if global_signals is None else global_signals[t.value].scale
            n = measured.outcomes.get(t, 0)
            if t in strengths:
                raw = strengths[t] / reference if reference > MIN_SIGNAL else 0.0
                scale = _clamp((n * raw + prior_outcomes * prior) / (n + prior_outcomes))
                if reference <= MIN_SIGNAL:
                    note = "no detectable signal in any incident type: pulled towards 1.0"
                else:
                    note = None
                calibrated = True
            else:
                scale = prior if global_signals is not None else 1.0
                calibrated = False
                note = (
                    f"{n} outcomes (< {self.min_outcomes}): kept the "
                    + ("global multiplier" if global_signals is not None else "configured multiplier")
                    if n < self.min_outcomes
                    else "no entry of these outcomes appears in a later outcome: kept as is"
                )
            multiplier = round(1.0 + (base[t] - 1.0) * scale, 4)
            if not calibrated and global_signals is not None:
                multiplier = global_signals[t.value].multiplier
            rate = measured.rate(t)
            signals[t.value] = TypeSignal(
                outcome_type=t.value,
                num_outcomes=n,
                num_links=len(measured.rates.get(t, [])),
                later_incident_rate=None if rate is None else round(rate, 4),
                signal_strength=round(strengths[t], 4) if t in strengths else None,
                scale=round(scale, 4),
                multiplier=multiplier,
                calibrated=calibrated,
                note=note,
            )
        return signals, reference


def _measure(records: list[OutcomeRecord], entity_path: str | None) -> _Measured:
    """Per type: how many outcomes touch `entity_path` (exactly; all when None), and for each of their
    causal links the share of incidents among that entry's next LATER_WINDOW outcomes."""
    timeline: dict[str, list[tuple[int, bool]]] = defaultdict(list)
    for index, record in enumerate(records):
        incident = record.outcome_type is not OutcomeType.SUCCESS
        for effect in record.effects:
            timeline[effect.entry_key].append((index, incident))
    outcomes: dict[OutcomeType, int] = defaultdict(int)
    rates: dict[OutcomeType, list[float]] = defaultdict(list)
    groups: dict[OutcomeType, list[list[float]]] = defaultdict(list)
    for index, record in enumerate(records):
        effects = [e for e in record.effects if entity_path is None or e.entity_path == entity_path]
        if not effects:
            continue
        outcomes[record.outcome_type] += 1
        group: list[float] = []
        for effect in effects:
            line = timeline[effect.entry_key]
            start = bisect.bisect_right(line, (index, True))
            later = line[start : start + LATER_WINDOW]
            if later:
                group.append(sum(incident for _, incident in later) / len(later))
        rates[record.outcome_type].extend(group)
        groups[record.outcome_type].append(group)
    return _Measured(dict(outcomes), dict(rates), dict(groups))


def _half_life(ages_days: list[float]) -> float | None:
    if len(ages_days) < MIN_READS_FOR_HALF_LIFE:
        return None
    return float(f"{statistics.median(ages_days):.4g}")


def _interval(values: list[float]) -> tuple[float, float] | None:
    """The central CONFIDENCE_LEVEL percentile interval of bootstrap draws."""
    if len(values) < 20:
        return None
    ordered = sorted(values)
    tail = (1 - CONFIDENCE_LEVEL) / 2
    lo = ordered[int(tail * (len(ordered) - 1))]
    hi = ordered[int(round((1 - tail) * (len(ordered) - 1)))]
    return (round(lo, 4), round(hi, 4))


def _fmt(interval: tuple[float, float] | None) -> str:
    return "no interval: too few resamples" if interval is None else f"95% CI {interval[0]}..{interval[1]}"


def _clamp(scale: float) -> float:
    return min(MAX_SCALE, max(MIN_SCALE, scale))
