"""The learned retrieval ranker: gradient boosting (LightGBM) on the outcome history.

Labels, as the product document defines them: an entry read before a clean outcome (SUCCESS) is a
positive sample; an entry read before an incident is a negative one; entries never linked to any
outcome are negatives too (a bounded, deterministic sample of at most half as many as the
outcome-linked samples, so they cannot swamp the real signal). Each sample carries the entry's
features as they were when the session saw it (`OutcomeHistory.as_of`) and the strategy ranks the
retrieval gave it then.

Once a model exists, `install` makes it the service's learned scorer: the `learned` strategy then
takes 30% of the RRF fusion. With no model the scorer stays unset and retrieval is exactly the fixed-
weight fusion. Training below 20 outcome-linked samples is refused (`InsufficientDataError`) and
leaves any existing model and the retrieval behaviour untouched.

Models live with the data they were trained on: in the store's shared state (`ml.shared`), as
LightGBM's text format, never pickle (loading a pickle can execute code), one per scope (global, or
an entity path) with its metrics and feature names. Every process on the same store picks up a newer
model within seconds (`ml.shared.SharedStateWatcher`). Fitting runs in a worker thread with one
LightGBM thread and OMP_WAIT_POLICY=PASSIVE, so it neither blocks the event loop nor spins the CPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before LightGBM's OpenMP runtime starts

import asyncio
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..core.ports import MemoryStore
from ..core import validation as v
from ..core.errors import InsufficientDataError, MissingExtraError, install_extra
from ..core.models import MemoryEntry, OutcomeType, utcnow
from ..core.service import MemoryService
from ._common import Progress, no_progress, resolve_service
from .features import FEATURE_NAMES, feature_matrix, feature_row
from .shared import RANKER_MODELS, save_ranker_models
from .traces import OutcomeHistory, under

logger = logging.getLogger("amfs_server.ml")

MIN_OUTCOME_LINKED_SAMPLES = 20
# Samples are counted per entry read, so one outcome blaming 20 entries made 20 of them: a model was installed at
# 30% of every retrieval from a single incident, its held-out figures made of that same incident (red-team repro).
MIN_OUTCOMES = 5
NEVER_LINKED_SHARE = 0.5
HOLDOUT_SHARE = 0.2
EARLY_STOPPING_ROUNDS = 20
NEUTRAL_SCORE = 0.5
"""Score for a candidate no model covers (a per-entity model exists, but not for its entity, and no global one)."""
MODEL_FORMAT = 2
LIGHTGBM_INSTALL_HINT = f"{install_extra('ml')}, or: pip install 'lightgbm>=4.3'"


def _import_lightgbm() -> Any:
    """lightgbm, imported on use: it is the [ml] extra, not a default dependency."""
    try:
        import lightgbm
    except ImportError as error:
        raise MissingExtraError(
            f"The learned ranker needs LightGBM, which is not installed ({error}). Install it with: {LIGHTGBM_INSTALL_HINT}"
        ) from None
    return lightgbm


@dataclass(frozen=True)
class RankerMetrics:
    """What `train` returns: the document's shape, plus how the held-out split looked."""

    num_samples: int
    num_positive: int
    num_negative: int
    accuracy: float
    """Held-out accuracy: a model fitted on the older outcomes' samples, scored on those of the newest (`_newest`)."""
    feature_importances: dict[str, float]
    trained_at: str
    entity_path: str | None = None
    num_outcome_linked: int = 0
    num_never_linked: int = 0
    num_holdout: int = 0
    holdout_baseline_accuracy: float = 0.0
    """Accuracy of always predicting the training majority class on the same held-out samples."""
    holdout_auc: float | None = None
    num_boost_rounds: int = 0
    """Chosen by early stopping on the newest part of the training samples."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankerMetrics:
        known = {name for name in cls.__dataclass_fields__}
        return cls(**{name: value for name, value in data.items() if name in known})


@dataclass
class _Samples:
    rows: list[list[float]] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    linked_mask: list[bool] = field(default_factory=list)
    """Outcome-linked samples come first, oldest first; never-linked negatives after them."""
    outcome_of: list[tuple[float, str] | None] = field(default_factory=list)
    """Each outcome-linked sample's outcome, as (commit time, ref), so that a cut keeps an outcome's samples together."""
    outcomes: int = 0

    def add(self, row: list[float], label: int, linked: bool, outcome: tuple[float, str] | None = None) -> None:
        self.rows.append(row)
        self.labels.append(label)
        self.linked_mask.append(linked)
        self.outcome_of.append(outcome)

    @property
    def linked(self) -> int:
        return sum(self.linked_mask)

    @property
    def never_linked(self) -> int:
        return len(self.linked_mask) - self.linked


@dataclass
class _Model:
    booster: Any
    metrics: RankerMetrics


class LearnedRanker:
    """Trains, persists, loads and serves the learned retrieval strategy.

    `service_or_store`: a MemoryService (then `train` also installs the new model into it) or a bare
    MemoryStore (read-only use: train, save, score).
    """

    def __init__(
        self,
        service_or_store: MemoryService | MemoryStore,
        *,
        min_samples: int = MIN_OUTCOME_LINKED_SAMPLES,
        num_boost_round: int = 150,
        seed: int = 0,
        clock: Callable[[], datetime] = utcnow,
        never_linked_share: float = NEVER_LINKED_SHARE,
        ignored_features: Sequence[str] = (),
    ) -> None:
        self.service, self._owns_service = resolve_service(service_or_store)
        self.min_samples = min_samples
        self.num_boost_round = num_boost_round
        self.seed = seed
        self.clock = clock
        self.never_linked_share = never_linked_share
        unknown = set(ignored_features) - set(FEATURE_NAMES)
        if unknown:
            raise ValueError(f"ignored_features names unknown features {sorted(unknown)}; see FEATURE_NAMES.")
        # Ignored features are held constant in training and scoring, so no tree can split on them (ablations).
        self._ignored = [FEATURE_NAMES.index(name) for name in ignored_features]
        self._models: dict[str | None, _Model] = {}
        self._train_lock = asyncio.Lock()

    # -- serving ------------------------------------------------------------------------------

    @property
    def trained(self) -> bool:
        return bool(self._models)

    def metrics(self, entity_path: str | None = None) -> RankerMetrics | None:
        model = self._models.get(entity_path)
        return model.metrics if model else None

    def all_metrics(self) -> list[RankerMetrics]:
        """Metrics of every model being served (the global one first), for status displays."""
        models = self._models
        return [models[scope].metrics for scope in sorted(models, key=lambda s: (s is not None, s or ""))]

    def install(self, service: MemoryService | None = None) -> bool:
        """Make this ranker the service's learned strategy when a model exists; unset it otherwise."""
        target = service or (self.service if self._owns_service else None)
        if target is None:
            raise ValueError("install() needs a MemoryService: this ranker was built on a bare store.")
        target.install_learned_scorer(self.score if self._models else None, self.covers)
        return bool(self._models)

    def covers(self, entity_path: str | None) -> bool:
        """Whether a retrieval filtered to `entity_path` (None: the whole store) is one a model was trained for: a
        whole-store model covers every retrieval, an entity's model those at or under its entity. Elsewhere the
        learned strategy stays out, so training for one team never shifts another's ranking."""
        return self._model_for(entity_path, self._models) is not _NO_MODEL

    def score(self, entries: Sequence[MemoryEntry], ranks: Mapping[str, Mapping[str, int]],
              entity_path: str | None = None) -> list[float]:
        """P(useful) per entry (the `LearnedScorer`) from the one model that covers a retrieval filtered to
        `entity_path`: the most specific entity model at or above the filter, else the whole-store model. One model
        per retrieval: scoring each entry by its own entity's model let a team's retrain move whole-store rankings
        that every other team sees (red-team repro)."""
        models = self._models  # one read: training may swap the dict meanwhile
        scope = self._model_for(entity_path, models)
        if not entries or scope is _NO_MODEL:
            return [NEUTRAL_SCORE] * len(entries)
        matrix = feature_matrix(list(entries), [ranks.get(e.entry_key) for e in entries], self.clock())
        matrix[:, self._ignored] = 0.0
        return [float(p) for p in models[scope].booster.predict(matrix, num_threads=1)]  # type: ignore[index]

    @staticmethod
    def _model_for(entity_path: str | None, models: Mapping[str | None, _Model]) -> str | None | object:
        specific = [scope for scope in models
                    if scope is not None and entity_path is not None and under(entity_path, scope)]
        if specific:
            return max(specific, key=len)
        return None if None in models else _NO_MODEL

    # -- persistence --------------------------------------------------------------------------

    async def load(self) -> list[RankerMetrics]:
        """Load every model persisted in the store (replacing those in memory); returns their metrics."""
        state = await self.service.get_shared_state(RANKER_MODELS)
        self._models = await asyncio.to_thread(_parse_models, state)  # parsing a booster is CPU work
        return [model.metrics for model in self._models.values()]

    async def _save(self, booster: Any, metrics: RankerMetrics) -> None:
        """Store the model beside the data it was trained on, with the version mark other processes watch."""
        text = await asyncio.to_thread(booster.model_to_string, num_iteration=-1)

        def with_this_model(state: Any) -> dict[str, Any]:
            models = dict(state.get("models", {})) if _readable(state) else {}
            models[_scope_name(metrics.entity_path)] = {"metrics": metrics.to_dict(), "model": text}
            return {"format": MODEL_FORMAT, "feature_names": list(FEATURE_NAMES), "models": models}

        await save_ranker_models(self.service, with_this_model)

    # -- training -----------------------------------------------------------------------------

    async def train(self, entity_path: str | None = None, progress: Progress | None = None) -> RankerMetrics:
        """Fit a model on the outcome history (of `entity_path`, or all), persist it and serve it."""
        entity_path = v.validate_entity_prefix(entity_path)
        _import_lightgbm()  # a missing [ml] extra is reported before any work, not after reading the history
        report = progress or no_progress
        total = 3 + 2 * self.num_boost_round
        async with self._train_lock:
            report(0, total, "reading the outcome history")
            history = await OutcomeHistory.load(self.service, entity_path, values=False)  # features read no value
            current = await self.service.current_entries(entity_path, values=False)
            report(1, total, "building samples")
            samples = await asyncio.to_thread(self._samples, history, current, entity_path)
            self._check_enough(samples, entity_path)
            booster, metrics = await asyncio.to_thread(self._fit, samples, entity_path, report, total)
            await self._save(booster, metrics)
            self._models = {**self._models, entity_path: _Model(booster, metrics)}
            if self._owns_service:
                self.install()
            report(total, total, "trained")
            return metrics

    async def training_samples(self, entity_path: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The feature rows and labels `train` would fit on (benchmarks pick baseline rules on them)."""
        history = await OutcomeHistory.load(self.service, entity_path, values=False)
        current = await self.service.current_entries(entity_path, values=False)
        samples = await asyncio.to_thread(self._samples, history, current, entity_path)
        x = np.asarray(samples.rows, dtype=np.float64).reshape(len(samples.rows), len(FEATURE_NAMES))
        return x, np.asarray(samples.labels, dtype=np.float64)

    def _samples(self, history: OutcomeHistory, current: list[MemoryEntry], entity_path: str | None) -> _Samples:
        samples = _Samples()
        linked: list[tuple[float, list[float], int, tuple[float, str]]] = []
        counted_outcomes = set()
        for record in history.outcomes:
            label = int(record.outcome_type is OutcomeType.SUCCESS)
            for effect in record.effects:
                if not under(effect.entity_path, entity_path):
                    continue
                seen = history.read_event_for(record.session_id, effect, record.committed_at)
                version = seen.version if seen else (effect.version_read or effect.version_updated)
                at = seen.at if seen else record.committed_at
                stored = history.version(effect.entity_path, effect.key, version)
                if stored is None:  # forgotten since
                    continue
                then = self.service.with_current_tier(history.as_of(stored, at), at)
                linked.append((at.timestamp(), feature_row(then, seen.ranks if seen else None, at), label,
                               (record.committed_at.timestamp(), record.outcome_ref)))
                counted_outcomes.add(record.outcome_ref)
        linked.sort(key=lambda item: item[0])
        for _, row, label, outcome in linked:
            samples.add(row, label, linked=True, outcome=outcome)
        samples.outcomes = len(counted_outcomes)

        never = [e for e in current if e.entry_key not in history.effects_by_entry]
        never.sort(key=lambda e: hashlib.sha256(f"{self.seed}:{e.entry_key}".encode()).digest())
        now = self.clock()
        for entry in never[: int(len(linked) * self.never_linked_share)]:
            seen = history.last_retrieve_of(entry.entity_path, entry.key)
            stored = history.version(entry.entity_path, entry.key, seen.version) if seen else None
            if seen is not None and stored is not None:
                then = self.service.with_current_tier(history.as_of(stored, seen.at), seen.at)
                row = feature_row(then, seen.ranks, seen.at)
            else:
                row = feature_row(self.service.with_current_tier(entry, now), None, now)
            samples.add(row, 0, linked=False)
        return samples

    def _check_enough(self, samples: _Samples, entity_path: str | None) -> None:
        scope = f" under '{entity_path}'" if entity_path else ""
        if samples.linked < self.min_samples:
            raise InsufficientDataError(
                f"Learned ranking needs at least {self.min_samples} outcome-linked samples (an entry read before a "
                f"committed outcome){scope}; found {samples.linked} from {samples.outcomes} outcomes. Retrieval keeps "
                "its confidence-based fusion (no learned strategy) until then. Commit outcomes with "
                "amfs_commit_outcome after sessions that read or retrieve entries (100+ with mixed results is "
                "better), then call amfs_retrain again."
            )
        if samples.outcomes < MIN_OUTCOMES:
            raise InsufficientDataError(
                f"Learned ranking needs outcome-linked samples from at least {MIN_OUTCOMES} committed outcomes{scope}; "
                f"found {samples.linked} samples from {samples.outcomes}, too few to learn from or to hold any out. "
                "Retrieval keeps its fusion without a learned strategy. Commit more outcomes with amfs_commit_outcome, "
                "then call amfs_retrain again."
            )
        positives = sum(samples.labels)
        if positives == 0 or positives == len(samples.labels):
            missing = "clean (success)" if positives == 0 else "incident (failure) or never-linked"
            raise InsufficientDataError(
                f"Learned ranking needs both clean and incident outcomes{scope}: all {len(samples.labels)} samples are "
                f"{'negative' if positives == 0 else 'positive'}, none {missing}. Commit outcomes of the missing "
                "kind, then call amfs_retrain again."
            )

    def _params(self, rows: int) -> dict[str, Any]:
        return {
            "objective": "binary",
            "learning_rate": 0.05,
            "num_leaves": 7,
            "min_data_in_leaf": max(3, min(50, rows // 20)),
            "feature_fraction": 0.9,
            "lambda_l2": 1.0,
            "num_threads": 1,
            "deterministic": True,
            "force_row_wise": True,
            "seed": self.seed,
            "verbose": -1,
        }

    def _fit(
        self, samples: _Samples, entity_path: str | None, report: Progress, total: int
    ) -> tuple[Any, RankerMetrics]:
        """Hold out the newest 20%; pick the number of boosting rounds by early stopping on the newest 20% of
        the rest; report accuracy on the held-out part; then fit the served model on everything."""
        x = np.asarray(samples.rows, dtype=np.float64).reshape(len(samples.rows), len(FEATURE_NAMES))
        x[:, self._ignored] = 0.0
        y = np.asarray(samples.labels, dtype=np.float64)
        linked = np.asarray(samples.linked_mask, dtype=bool)
        held = _newest(linked, np.ones(len(y), dtype=bool), samples.outcome_of)
        fit_part = ~held
        valid = _newest(linked, fit_part, samples.outcome_of)
        inner = fit_part & ~valid
        rounds = self.num_boost_round
        evaluated = _both_classes(y[inner]) and valid.any() and held.any()
        accuracy = baseline = 0.0
        holdout_auc = None
        if evaluated:
            evaluator = self._boost(
                x[inner], y[inner], rounds, lambda i: report(2 + i, total, "held-out evaluation"), (x[valid], y[valid])
            )
            rounds = max(10, evaluator.best_iteration or rounds)
            predicted = evaluator.predict(x[held], num_iteration=rounds, num_threads=1)
            accuracy = float(np.mean((predicted >= 0.5) == (y[held] == 1)))
            majority = float(y[inner].mean() >= 0.5)
            baseline = float(np.mean(y[held] == majority))
            holdout_auc = auc(y[held], predicted)
        report(2 + self.num_boost_round, total, "fitting the model on all samples")
        booster = self._boost(
            x, y, rounds, lambda i: report(2 + self.num_boost_round + i, total, "fitting the model on all samples")
        )
        if not evaluated:  # too little data to hold any out: training accuracy, flagged by num_holdout=0
            accuracy = float(np.mean((booster.predict(x, num_threads=1) >= 0.5) == (y == 1)))
            baseline = float(max(y.mean(), 1 - y.mean()))
        gains = booster.feature_importance(importance_type="gain")
        total_gain = float(np.sum(gains)) or 1.0
        importances = {
            name: round(float(gain) / total_gain, 4)
            for name, gain in sorted(zip(FEATURE_NAMES, gains), key=lambda item: -item[1])
            if gain > 0
        }
        metrics = RankerMetrics(
            num_samples=len(y), num_positive=int(y.sum()), num_negative=int(len(y) - y.sum()),
            accuracy=round(accuracy, 4), feature_importances=importances,
            trained_at=self.clock().strftime("%Y-%m-%dT%H:%M:%SZ"), entity_path=entity_path,
            num_outcome_linked=samples.linked, num_never_linked=samples.never_linked,
            num_holdout=int(held.sum()) if evaluated else 0,
            holdout_baseline_accuracy=round(baseline, 4),
            holdout_auc=None if holdout_auc is None else round(holdout_auc, 4),
            num_boost_rounds=rounds,
        )
        return booster, metrics

    def _boost(
        self, x: np.ndarray, y: np.ndarray, rounds: int, on_iteration: Any,
        valid: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> Any:
        lgb = _import_lightgbm()

        def progress(env: Any) -> None:
            if (env.iteration + 1) % 25 == 0:
                on_iteration(env.iteration + 1)

        params = self._params(len(y))
        dataset = lgb.Dataset(x, label=y, feature_name=list(FEATURE_NAMES), params={"verbose": -1})
        callbacks = [progress]
        valid_sets = None
        if valid is not None:
            valid_sets = [lgb.Dataset(valid[0], label=valid[1], reference=dataset, params={"verbose": -1})]
            callbacks.append(lgb.early_stopping(EARLY_STOPPING_ROUNDS, verbose=False))
        booster = lgb.train(params, dataset, num_boost_round=rounds, valid_sets=valid_sets, callbacks=callbacks)
        if tuple(booster.feature_name()) != FEATURE_NAMES:
            raise RuntimeError(
                "LightGBM lost the feature names: the C++ runtime's locale was clobbered (see adapters/_cxx_runtime)."
            )
        return booster


def _newest(linked: np.ndarray, among: np.ndarray, outcome_of: Sequence[tuple[float, str] | None]) -> np.ndarray:
    """The outcome-linked samples in `among` of the newest outcomes, whole outcomes until they make HOLDOUT_SHARE of
    them (a cut by sample put one outcome's samples on both sides, so the held-out figures were partly seen in
    training), and every 1/HOLDOUT_SHARE-th never-linked one (those have no common clock)."""
    chosen = np.zeros(len(linked), dtype=bool)
    linked_idx = np.flatnonzero(linked & among)
    if len(linked_idx) >= 5:
        sizes = Counter(outcome_of[i] for i in linked_idx)
        wanted, taken, held_outcomes = max(1, round(len(linked_idx) * HOLDOUT_SHARE)), 0, set()
        for outcome in sorted(sizes, key=lambda o: o or (0.0, ""), reverse=True):
            if taken >= wanted:
                break
            held_outcomes.add(outcome)
            taken += sizes[outcome]
        chosen[[i for i in linked_idx if outcome_of[i] in held_outcomes]] = True
        never_idx = np.flatnonzero(~linked & among)
        chosen[never_idx[:: round(1 / HOLDOUT_SHARE)]] = True
    return chosen


def _both_classes(y: np.ndarray) -> bool:
    return len(y) > 0 and 0 < y.sum() < len(y)


_NO_MODEL = object()


def auc(labels: np.ndarray, scores: np.ndarray) -> float | None:
    """Rank-based ROC AUC (ties count half); None when only one class is present."""
    positives, negatives = scores[labels == 1], scores[labels == 0]
    if len(positives) == 0 or len(negatives) == 0:
        return None
    wins = (positives[:, None] > negatives[None, :]).sum() + 0.5 * (positives[:, None] == negatives[None, :]).sum()
    return float(wins / (len(positives) * len(negatives)))


def _scope_name(entity_path: str | None) -> str:
    return "" if entity_path is None else entity_path


def _readable(state: Any) -> bool:
    return (
        isinstance(state, dict) and state.get("format") == MODEL_FORMAT
        and tuple(state.get("feature_names", ())) == FEATURE_NAMES and isinstance(state.get("models"), dict)
    )


def _parse_models(state: Any) -> dict[str | None, _Model]:
    if state is None:
        return {}
    if not _readable(state):
        logger.warning("The stored ranker models were trained on other features; run amfs_retrain to replace them")
        return {}
    # lightgbm (with scipy, ~150 MB) is the [ml] extra: a store with no trained model never imports it, and a
    # server without it says so and serves without the learned strategy.
    try:
        lgb = _import_lightgbm()
    except MissingExtraError as error:
        logger.warning("Not serving the %d stored ranker model(s): %s", len(state["models"]), error)
        return {}
    models: dict[str | None, _Model] = {}
    for scope, stored in state["models"].items():
        try:
            models[scope or None] = _Model(lgb.Booster(model_str=stored["model"]), RankerMetrics.from_dict(stored["metrics"]))
        except Exception as error:  # one unreadable model must not keep the server from starting
            logger.warning("Skipping the stored ranker model for %r (%s); run amfs_retrain to replace it", scope or "global", error)
    return models


async def load_installed_models(service: MemoryService) -> LearnedRanker:
    """At start-up: load the models persisted in the service's store and install them into `service`.

    Returns the ranker, which the ML tools keep using so `amfs_retrain` replaces what retrieval serves.
    """
    ranker = LearnedRanker(service)
    loaded = await ranker.load()
    ranker.install()
    if loaded:
        logger.info("Loaded %d learned ranker model(s) from the store", len(loaded))
    return ranker
