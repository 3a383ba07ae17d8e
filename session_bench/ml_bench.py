"""Proof that the ML layer learns: an outcome simulator, the learned ranker against fixed-weight fusion,
and the calibrator against planted per-type signal strengths.

The world: topics (three keywords each) owned by services; entries on each topic written by three
kinds of agent (production, development, manual) as facts, beliefs or experiences. Every entry has a
hidden quality (good or bad) whose odds depend on who wrote it and its memory type: which the ranker
can only learn from outcomes. A session picks a topic, retrieves 10 entries for a keyword query (the
measured ranking), reads the top 5, sometimes writes a decision, and commits an outcome naming what
it read. Each bad entry read may cause an incident (hazard 0.5 each), whose type leans critical;
otherwise, by chance, an unrelated incident (20%) whose type leans minor; otherwise a clean outcome.
So each incident type carries a different, known share of real signal: the *planted* strength is the
share of that type's outcomes that bad entries caused.

Two scenarios. `static` (the easy case): entry quality never changes and every read entry shares
every outcome. `drift` (the default; its parameters, `DriftStory`, come from a team's story and were
fixed before any drift result was seen): risky patterns get fixed and dependency upgrades break good
ones during the run, including the held-out part; new entries keep appearing; a post-mortem names the
culprit of a caused incident 60% of the time; and each writer's reliability differs per service.

Protocol: simulate the training sessions with fixed-weight fusion; train on that store; copy the
store and replay the same held-out sessions (same topics, queries and random draws) with (a) fixed-
weight fusion, (b) the best one-feature rule in the learned slot (each ranker feature, either sign,
picked by AUC on the TRAINING samples only), (c) the learned fusion (global LightGBM), (d) global +
per-service models, (e, f) two diagnostics (no never-linked negatives; also no strategy ranks),
(g) a ranker with no model, (h) the hidden current quality as the learned score (the ceiling).
Relevance is on-topic AND good at that session; NDCG@10 and precision@5 are measured on each
session's retrieval, and differences carry paired-bootstrap 95% intervals. The calibrator runs on the
fixed-fusion store after all sessions; its relative signal strengths are compared with the planted ones.

Retrieval runs without an embedder (keyword + temporal + confidence, + learned): the semantic
strategy would cost a MiniLM pass per write and query on two shared cores and is not what is being
measured here.

    python -m amfs_server.session_bench.ml_bench --sessions 1200 --seeds 0 3 4 5 --scenarios drift static
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import asyncio
import json
import math
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np

from ..adapters.sqlite import SQLiteStore
from ..core.errors import InsufficientDataError
from ..core.models import Actor, MemoryType, OutcomeType
from ..core.service import MemoryService, ServiceConfig, WriteRequest
from ..ml.calibrator import ConfidenceCalibrator
from ..ml.features import FEATURE_NAMES, RANK_STRATEGIES, feature_row
from ..ml.ranker import LearnedRanker, auc

TOPIC_WORDS = (
    "payments retry idempotency checkout cart coupon auth token refresh queue consumer backlog deploy canary "
    "rollback schema migration lock latency timeout budget cache eviction warmup replica failover quorum "
    "billing invoice proration webhook signature replay"
).split()
FILLER_WORDS = "service config error handling note update guidance production incident team".split()
WRITERS: dict[str, float] = {"agent/prod-deployer": 0.9, "dev-assistant": 0.55, "manual-ops": 0.75}
"""Agent id -> base probability that what it writes is good (its provenance tier is a learnable feature)."""
TYPE_SHIFT: dict[MemoryType, float] = {MemoryType.FACT: 0.08, MemoryType.BELIEF: -0.2, MemoryType.EXPERIENCE: 0.0}
CAUSED_TYPES: dict[OutcomeType, float] = {
    OutcomeType.CRITICAL_FAILURE: 0.8, OutcomeType.FAILURE: 0.15, OutcomeType.MINOR_FAILURE: 0.05,
}
NOISE_TYPES: dict[OutcomeType, float] = {
    OutcomeType.CRITICAL_FAILURE: 0.02, OutcomeType.FAILURE: 0.38, OutcomeType.MINOR_FAILURE: 0.6,
}
INCIDENTS = tuple(CAUSED_TYPES)
START = datetime(2026, 1, 1, tzinfo=timezone.utc)
SEED_SPAN = timedelta(days=30)
SESSION_GAP = timedelta(hours=1)


class SimClock:
    """Simulated time: the seed entries are written over 30 days, then one session per hour. Real time would
    make entry ages (a ranker feature) mean seconds of benchmark run time, and differ from run to run."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now

    def session(self, index: int, step: int = 0) -> None:
        self.now = START + index * SESSION_GAP + timedelta(minutes=step)


@contextmanager
def simulated_time(clock: SimClock) -> Iterator[None]:
    """Run the service on `clock` (the service reads time through `core.service.utcnow`)."""
    from ..core import service as service_module

    original = service_module.utcnow
    service_module.utcnow = clock
    try:
        yield
    finally:
        service_module.utcnow = original


SCENARIOS = ("drift", "static")


@dataclass(frozen=True)
class DriftStory:
    """The drift scenario's parameters, set from what a real team sees over a seven-week run (not from
    benchmark results; they were fixed before the first drift run):

    - a third of the risky patterns the memory describes get fixed at some point in the run (the code
      changes; the note stays as written, so it is now safe to follow);
    - every service takes one dependency upgrade at a random moment, and it breaks 30% of the
      service's good notes written before it;
    - a post-mortem names the entry that caused an incident 60% of the time; otherwise the whole
      session's reads share the blame (chance incidents and clean outcomes always blame/credit all);
    - how reliable each writer is differs per service (a team's own deployer knows its service):
      a per-(service, writer) shift of up to +-0.25 on the odds that what it writes is good, so no
      single global rule over writer or confidence fits every entity.
    """

    fix_share: float = 1 / 3
    upgrade_break_share: float = 0.3
    culprit_named_share: float = 0.6
    writer_service_spread: float = 0.25


@dataclass
class SimConfig:
    sessions: int = 1200
    seed: int = 0
    scenario: str = "drift"
    train_share: float = 0.7
    topics: int = 10
    services: int = 5
    entries_per_topic: int = 16
    limit: int = 10
    read_k: int = 5
    hazard: float = 0.5
    noise: float = 0.2
    write_prob: float = 0.35


@dataclass
class SessionResult:
    index: int
    topic: int
    ranked: list[str]
    ndcg10: float
    p5: float
    outcome: str
    caused: bool


@dataclass
class World:
    """The hidden truth: each entry's topic and quality, and (drift) the session at which its quality flips."""

    topic_of: dict[str, int] = field(default_factory=dict)
    good: dict[str, bool] = field(default_factory=dict)
    fix_at: dict[str, int] = field(default_factory=dict)
    """Bad entries that become safe at this session (the risky pattern was fixed)."""
    break_at: dict[str, int] = field(default_factory=dict)
    """Good entries that a dependency upgrade breaks at this session."""
    outcomes_of: dict[str, list[bool]] = field(default_factory=dict)
    """Per entry, whether each outcome that named it was clean, in order (what the store's outcome records say;
    kept here so a diagnostic can score by recent outcomes, which no ranker feature carries)."""

    def copy(self) -> World:
        return World(dict(self.topic_of), dict(self.good), dict(self.fix_at), dict(self.break_at),
                     {key: list(flags) for key, flags in self.outcomes_of.items()})

    def good_at(self, key: str, session: int) -> bool:
        good = self.good.get(key, False)
        if good:
            return not self.break_at.get(key, NEVER) <= session
        return self.fix_at.get(key, NEVER) <= session

    def relevant(self, key: str, topic: int, session: int = -1) -> bool:
        return self.topic_of.get(key) == topic and self.good_at(key, session)


NEVER = 1 << 60


class OutcomeSimulator:
    def __init__(self, config: SimConfig, clock: SimClock | None = None, story: DriftStory | None = None) -> None:
        if config.scenario not in SCENARIOS:
            raise ValueError(f"scenario must be one of {SCENARIOS}, got {config.scenario!r}")
        self.config = config
        self.world = World()
        self.clock = clock or SimClock()
        self.drift = config.scenario == "drift"
        self.session_index = -1
        self.story = story or DriftStory()
        # Drift draws come from their own streams, so the static scenario's draws are exactly as before.
        upgrades = random.Random(f"{config.seed}:upgrades")
        self.upgrade_at = {f"svc-{s}": upgrades.randrange(config.sessions) for s in range(config.services)}
        shifts = random.Random(f"{config.seed}:writer-shift")
        spread = self.story.writer_service_spread
        self.writer_shift = {
            (f"svc-{s}", writer): shifts.uniform(-spread, spread) for s in range(config.services) for writer in WRITERS
        }

    def topic_words(self, topic: int) -> list[str]:
        return TOPIC_WORDS[3 * topic : 3 * topic + 3]

    def entity(self, topic: int) -> str:
        return f"svc-{topic % self.config.services}"

    def _draft(self, rng: random.Random, topic: int, key: str, writer: str) -> tuple[WriteRequest, bool]:
        memory_type = rng.choice(list(MemoryType))
        odds = WRITERS[writer] + TYPE_SHIFT[memory_type]
        if self.drift:
            odds += self.writer_shift[(self.entity(topic), writer)]
        good = rng.random() < min(0.95, max(0.05, odds))
        words = rng.sample(self.topic_words(topic), 2) + rng.sample(FILLER_WORDS, 2)
        rng.shuffle(words)
        value = f"{' '.join(words)} guidance {key}"
        # Most agents keep the default confidence (1.0); some state their own.
        confidence = 1.0 if rng.random() < 0.7 else round(rng.uniform(0.6, 1.0), 3)
        return WriteRequest(self.entity(topic), key, value, confidence=confidence, memory_type=memory_type), good

    async def seed_world(self, service: MemoryService) -> None:
        rng = random.Random(f"{self.config.seed}:world")
        total = self.config.topics * self.config.entries_per_topic
        for n in range(total):
            topic = n % self.config.topics
            writer = rng.choice(list(WRITERS))
            request, good = self._draft(rng, topic, f"t{topic}-note-{n // self.config.topics}", writer)
            self.clock.now = START - SEED_SPAN + n * (SEED_SPAN / total)
            await service.write(Actor(writer, f"seed-{n}"), request)
            self._remember(request, topic, good, written=-1)

    def _remember(self, request: WriteRequest, topic: int, good: bool, written: int) -> None:
        key = f"{request.entity_path}/{request.key}"
        self.world.topic_of[key] = topic
        self.world.good[key] = good
        if not self.drift:
            return
        rng = random.Random(f"{self.config.seed}:drift:{key}")
        fix_draw, fix_time, break_draw = rng.random(), rng.random(), rng.random()
        first = written + 1
        if not good and fix_draw < self.story.fix_share and first < self.config.sessions:
            self.world.fix_at[key] = first + int(fix_time * (self.config.sessions - first))
        upgrade = self.upgrade_at[request.entity_path]
        if good and upgrade >= first and break_draw < self.story.upgrade_break_share:
            self.world.break_at[key] = upgrade

    async def run_session(self, service: MemoryService, index: int) -> SessionResult:
        """One session. Every random draw comes from a per-session stream, consumed in the same order
        whatever the ranking was, so replays under different rankers differ only by the ranking."""
        config = self.config
        self.session_index = index
        rng = random.Random(f"{config.seed}:session:{index}")
        topic = rng.randrange(config.topics)
        agent = rng.choice(list(WRITERS))
        query = " ".join(rng.sample(self.topic_words(topic), 2) + [rng.choice(FILLER_WORDS)])
        writes = rng.random() < config.write_prob
        decision, decision_good = self._draft(rng, topic, f"t{topic}-decision-{index}", agent)
        hits = [rng.random() for _ in range(config.read_k)]
        noise_draw, type_draw = rng.random(), rng.random()
        blame_draw = rng.random()

        actor = Actor(agent, f"sim-{index}")
        self.clock.session(index, 0)
        results = await service.retrieve(actor, query, limit=config.limit)
        ranked = [r.entry.entry_key for r in results]
        used = ranked[: config.read_k]
        self.clock.session(index, 1)
        for key in used:
            entity_path, _, name = key.rpartition("/")
            await service.read(actor, entity_path, name)
        if writes:
            self.clock.session(index, 2)
            await service.write(actor, decision)
            self._remember(decision, topic, decision_good, written=index)
        bad_used = [key for key in used if self.world.topic_of.get(key) == topic and not self.world.good_at(key, index)]
        culprits = [key for i, key in enumerate(bad_used) if hits[i] < config.hazard]
        caused = bool(culprits)
        blamed = used
        if caused and self.drift and blame_draw < self.story.culprit_named_share:
            blamed = culprits[:1]  # the post-mortem found the entry that caused it
        if caused:
            outcome = _pick(CAUSED_TYPES, type_draw)
        elif noise_draw < config.noise:
            outcome = _pick(NOISE_TYPES, type_draw)
        else:
            outcome = OutcomeType.SUCCESS
        self.clock.session(index, 3)
        if used:
            await service.commit_outcome(actor, f"sim-{index}", outcome, causal_entry_keys=blamed)
            for key in blamed:
                self.world.outcomes_of.setdefault(key, []).append(outcome is OutcomeType.SUCCESS)
        return SessionResult(index, topic, ranked, self.ndcg(ranked, topic, index),
                             self.precision(ranked, topic, 5, index), outcome.value, caused)

    def ndcg(self, ranked: list[str], topic: int, session: int = -1, k: int = 10) -> float:
        """Relevance is on-topic and good *at this session* (drift changes what good means over time)."""
        gains = [1.0 if self.world.relevant(key, topic, session) else 0.0 for key in ranked[:k]]
        dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains))
        available = sum(1 for key in self.world.topic_of if self.world.relevant(key, topic, session))
        ideal = sum(1 / math.log2(i + 2) for i in range(min(k, available)))
        return dcg / ideal if ideal else 0.0

    def precision(self, ranked: list[str], topic: int, k: int, session: int = -1) -> float:
        return sum(1 for key in ranked[:k] if self.world.relevant(key, topic, session)) / k


def _pick(weights: dict[OutcomeType, float], draw: float) -> OutcomeType:
    total, cumulative = sum(weights.values()), 0.0
    for outcome_type, weight in weights.items():
        cumulative += weight / total
        if draw < cumulative:
            return outcome_type
    return next(reversed(weights))


async def open_service(path: Path) -> MemoryService:
    service = MemoryService(SQLiteStore(path), ServiceConfig(), embedder=None)
    await service.open()
    return service


async def simulate(service: MemoryService, simulator: OutcomeSimulator, indexes: range) -> list[SessionResult]:
    return [await simulator.run_session(service, i) for i in indexes]


async def fill_with_simulated_history(
    service: MemoryService, sessions: int = 200, seed: int = 0, scenario: str = "static"
) -> list[SessionResult]:
    """Seed `service` with the simulator's world and `sessions` sessions of outcome history (for examples)."""
    config = SimConfig(sessions=sessions, seed=seed, scenario=scenario)
    clock = SimClock()
    with simulated_time(clock):
        simulator = OutcomeSimulator(config, clock)
        await simulator.seed_world(service)
        return await simulate(service, simulator, range(sessions))


def summarize(results: list[SessionResult]) -> dict[str, float]:
    n = len(results)
    return {
        "sessions": n,
        "ndcg@10": round(statistics.fmean(r.ndcg10 for r in results), 4) if n else 0.0,
        "p@5": round(statistics.fmean(r.p5 for r in results), 4) if n else 0.0,
        "incident_rate": round(sum(r.outcome != "success" for r in results) / n, 4) if n else 0.0,
    }


def paired(a: list[SessionResult], b: list[SessionResult], metric: str) -> dict[str, float]:
    """Mean per-session difference b - a with its standard error (the sessions are the same draws)."""
    diffs = [getattr(y, metric) - getattr(x, metric) for x, y in zip(a, b)]
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return {"mean_diff": round(mean, 4), "stderr": round(se, 4), "z": round(mean / se, 2) if se else float("nan")}


def planted_strengths(results: list[SessionResult]) -> dict[str, dict[str, float]]:
    """Per incident type: the share of its outcomes that bad entries caused (the planted signal)."""
    planted: dict[str, dict[str, float]] = {}
    for outcome_type in INCIDENTS:
        of_type = [r for r in results if r.outcome == outcome_type.value]
        caused = sum(r.caused for r in of_type)
        planted[outcome_type.value] = {"outcomes": len(of_type), "caused_share": round(caused / len(of_type), 4) if of_type else 0.0}
    return planted


def _relative(values: dict[str, float]) -> dict[str, float]:
    total = sum(values.values())
    return {k: round(v / total, 4) if total else 0.0 for k, v in values.items()}


def _spearman(a: list[float], b: list[float]) -> float:
    def ranks(xs: list[float]) -> list[float]:
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        out = [0.0] * len(xs)
        for r, i in enumerate(order):
            out[i] = float(r)
        return out

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1)) if n > 1 else 1.0


async def run(config: SimConfig, workdir: Path, progress: bool = True) -> dict[str, Any]:
    clock = SimClock()
    with simulated_time(clock):
        return await _run(config, workdir, clock, progress)


RECENT_OUTCOMES = 3
RULE_FEATURES: tuple[str, ...] = (
    "confidence", "outcome_count", "log_age_hours", "recall_count", "version", "importance", "tier",
    "log_confidence_per_outcome",
)
"""The one-feature rules searched for the best baseline: each feature, either sign, in the learned slot."""


def pick_rule(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """The best one-feature rule by AUC on the TRAINING samples only (the ranker's own), with every candidate's AUC."""
    candidates = {}
    for name in RULE_FEATURES:
        column = x[:, FEATURE_NAMES.index(name)]
        for sign in (1.0, -1.0):
            candidates[f"{'+' if sign > 0 else '-'}{name}"] = auc(y, sign * column) or 0.5
    best = max(candidates, key=lambda rule: candidates[rule])
    return {"rule": best, "train_auc": round(candidates[best], 4), "candidates": {k: round(v, 4) for k, v in candidates.items()}}


def rule_scorer(rule: str, clock: SimClock) -> Any:
    sign, name = (1.0 if rule[0] == "+" else -1.0), rule[1:]
    column = FEATURE_NAMES.index(name)

    def score(entries: list[Any], ranks: dict[str, dict[str, int]], _entity_path: str | None = None) -> list[float]:
        now = clock()
        return [sign * feature_row(e, ranks.get(e.entry_key), now)[column] for e in entries]

    return score


def bootstrap_diff(a: list[SessionResult], b: list[SessionResult], metric: str, resamples: int = 2000,
                   seed: int = 0) -> dict[str, float]:
    """Mean per-session difference b - a with a paired bootstrap 95% interval (the sessions are the same draws)."""
    diffs = np.asarray([getattr(y, metric) - getattr(x, metric) for x, y in zip(a, b)])
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), size=(resamples, len(diffs)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean_diff": round(float(diffs.mean()), 4), "ci_low": round(float(lo), 4), "ci_high": round(float(hi), 4)}


async def _run(config: SimConfig, workdir: Path, clock: SimClock, progress: bool) -> dict[str, Any]:
    started = time.monotonic()
    n_train = int(config.sessions * config.train_share)
    simulator = OutcomeSimulator(config, clock)
    train_service = await open_service(workdir / "train.db")
    await simulator.seed_world(train_service)

    refusal = None
    early = await simulate(train_service, simulator, range(0, 3))
    try:
        await LearnedRanker(train_service, clock=clock).train()
    except InsufficientDataError as error:
        refusal = str(error)
    train_results = early + await simulate(train_service, simulator, range(3, n_train))
    if progress:
        print(f"[ml_bench] {config.scenario} seed {config.seed}: simulated {n_train} training sessions in "
              f"{time.monotonic() - started:.1f}s", flush=True)

    ranker = LearnedRanker(train_service, clock=clock)
    rule = pick_rule(*await ranker.training_samples())
    train_started = time.monotonic()
    metrics = await ranker.train()
    train_seconds = time.monotonic() - train_started
    per_entity = LearnedRanker(train_service, clock=clock)  # global model plus one per service (entity effects)
    await per_entity.train()
    entity_metrics = [(await per_entity.train(f"svc-{s}")).to_dict() for s in range(config.services)]
    # Diagnostics (why the learner does or does not beat the rule): the same LightGBM without the never-linked
    # negatives, and additionally without the strategy ranks (quality features only).
    linked_only = LearnedRanker(train_service, clock=clock, never_linked_share=0.0)
    await linked_only.train()
    quality_only = LearnedRanker(train_service, clock=clock, never_linked_share=0.0,
                                 ignored_features=[f"rank_{name}" for name in RANK_STRATEGIES])
    await quality_only.train()
    train_service.install_learned_scorer(None)
    snapshot = await train_service.export_snapshot()
    await train_service.close()

    held_out = range(n_train, config.sessions)
    variants: dict[str, list[SessionResult]] = {}
    worlds: dict[str, World] = {}
    for name in ("fixed", "rule", "learned", "learned_entity", "linked_only", "quality_only", "recent_rule", "untrained",
                 "oracle"):
        service = await open_service(workdir / f"eval-{name}.db")
        await service.import_snapshot(snapshot)
        replay = OutcomeSimulator(config, clock)
        replay.world = simulator.world.copy()
        if name == "rule":
            service.install_learned_scorer(rule_scorer(rule["rule"], clock))
        elif name == "learned":
            service.install_learned_scorer(ranker.score)
        elif name == "learned_entity":
            # The diagnostic's meaning: each entry scored by its own service's model (else the global one). The
            # server never mixes models in one retrieval; here the queries are unscoped, so this scorer does.
            service.install_learned_scorer(lambda entries, ranks, _path, r=per_entity: [
                r.score([e], ranks, e.entity_path)[0] for e in entries])
        elif name == "linked_only":
            service.install_learned_scorer(linked_only.score)
        elif name == "quality_only":
            service.install_learned_scorer(quality_only.score)
        elif name == "recent_rule":
            # Diagnostic: the clean share of each entry's last RECENT_OUTCOMES outcomes (0.5 with none), read live.
            service.install_learned_scorer(lambda entries, ranks, _path, sim=replay: [
                statistics.fmean(sim.world.outcomes_of[e.entry_key][-RECENT_OUTCOMES:])
                if sim.world.outcomes_of.get(e.entry_key) else 0.5 for e in entries
            ])
        elif name == "untrained":
            empty = LearnedRanker(service, clock=clock)
            empty.install()  # no model loaded: leaves the learned strategy off
        elif name == "oracle":
            # The ceiling: the hidden quality at this session as the learned strategy's score, at the same 30% weight.
            service.install_learned_scorer(lambda entries, ranks, _path, sim=replay: [
                1.0 if sim.world.good_at(e.entry_key, sim.session_index) else 0.0 for e in entries
            ])
        variants[name] = await simulate(service, replay, held_out)
        worlds[name] = replay.world
        if name == "fixed":  # all sessions, one fusion throughout: the calibrator's input
            calibration = await ConfidenceCalibrator(service).calibrate(per_entity=True)
        await service.close()
        if progress:
            print(f"[ml_bench] replayed {len(held_out)} held-out sessions with {name} ranking", flush=True)

    planted = planted_strengths(train_results + variants["fixed"])
    signals = calibration.global_multipliers.signals
    recovered = {t.value: signals[t.value].signal_strength or 0.0 for t in INCIDENTS}
    planted_share = {t: planted[t]["caused_share"] for t in recovered}
    planted_rel, recovered_rel = _relative(planted_share), _relative({k: max(0.0, v) for k, v in recovered.items()})
    order = [t.value for t in INCIDENTS]
    fixed = variants["fixed"]
    report = {
        "config": asdict(config),
        "story": asdict(simulator.story) if simulator.drift else None,
        "embedder": None,
        "retrieval": {name: summarize(results) for name, results in variants.items()},
        "rule": rule,
        "diffs": {
            "learned-fixed": bootstrap_diff(fixed, variants["learned"], "ndcg10", seed=config.seed),
            "rule-fixed": bootstrap_diff(fixed, variants["rule"], "ndcg10", seed=config.seed),
            "learned-rule": bootstrap_diff(variants["rule"], variants["learned"], "ndcg10", seed=config.seed),
            "learned_entity-fixed": bootstrap_diff(fixed, variants["learned_entity"], "ndcg10", seed=config.seed),
            "learned_entity-rule": bootstrap_diff(variants["rule"], variants["learned_entity"], "ndcg10", seed=config.seed),
            "linked_only-rule": bootstrap_diff(variants["rule"], variants["linked_only"], "ndcg10", seed=config.seed),
            "quality_only-rule": bootstrap_diff(variants["rule"], variants["quality_only"], "ndcg10", seed=config.seed),
            "recent_rule-rule": bootstrap_diff(variants["rule"], variants["recent_rule"], "ndcg10", seed=config.seed),
            "oracle-fixed": bootstrap_diff(fixed, variants["oracle"], "ndcg10", seed=config.seed),
        },
        "learned_vs_fixed": {
            "ndcg@10": paired(fixed, variants["learned"], "ndcg10"),
            "p@5": paired(fixed, variants["learned"], "p5"),
        },
        "untrained_identical_to_fixed": all(a.ranked == b.ranked for a, b in zip(fixed, variants["untrained"])),
        "drift": {
            "fixed_in_training": sum(1 for at in worlds["fixed"].fix_at.values() if at < n_train),
            "broken_in_training": sum(1 for at in worlds["fixed"].break_at.values() if at < n_train),
            "fixed_in_held_out": sum(1 for at in worlds["fixed"].fix_at.values() if n_train <= at < config.sessions),
            "broken_in_held_out": sum(1 for at in worlds["fixed"].break_at.values() if n_train <= at < config.sessions),
            "entries_at_training_end": len(simulator.world.topic_of),
            "entries_new_in_held_out": len(worlds["fixed"].topic_of) - len(simulator.world.topic_of),
        },
        "ranker_metrics": metrics.to_dict(),
        "entity_ranker_metrics": entity_metrics,
        "ranker_train_seconds": round(train_seconds, 2),
        "early_refusal": refusal,
        "calibration": {
            "planted_caused_share": planted,
            "recovered_signal_strength": recovered,
            "planted_relative": planted_rel,
            "recovered_relative": recovered_rel,
            "max_abs_relative_error": round(max(abs(planted_rel[t] - recovered_rel[t]) for t in order), 4),
            "order_planted": sorted(order, key=lambda t: -planted_share[t]),
            "order_recovered": sorted(order, key=lambda t: -recovered[t]),
            "spearman": round(_spearman([planted_share[t] for t in order], [recovered[t] for t in order]), 3),
            "multipliers": calibration.global_multipliers.multipliers,
            "signals": {k: asdict(sig) for k, sig in signals.items()},
            "decay_half_life_days": calibration.global_multipliers.decay_half_life_days,
            "entity_overrides": len(calibration.entity_multipliers),
        },
        "seconds": round(time.monotonic() - started, 1),
    }
    return report


VARIANT_LABELS = (
    ("fixed", "fixed-weight fusion"),
    ("rule", "best one-feature rule (picked on training samples) at 30%"),
    ("learned", "learned fusion (global LightGBM) at 30%"),
    ("learned_entity", "learned fusion (global + per-service models) at 30%"),
    ("linked_only", "diagnostic: LightGBM without never-linked negatives"),
    ("quality_only", "diagnostic: LightGBM without never-linked negatives or strategy ranks"),
    ("recent_rule", "diagnostic: clean share of each entry's last 3 outcomes (not a ranker feature)"),
    ("untrained", "ranker without a model"),
    ("oracle", "ceiling: hidden current quality at 30%"),
)


def _ci(d: dict[str, float]) -> str:
    return f"{d['mean_diff']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]"


def markdown(report: dict[str, Any], command: str) -> str:
    r, cal, cfg = report["retrieval"], report["calibration"], report["config"]
    lines = [
        f"# ML benchmark ({cfg['scenario']} scenario, seed {cfg['seed']}): learned ranking and outcome calibration",
        "",
        f"`{command}` ({report['seconds']}s; embedder: none, so fusion is keyword + temporal + confidence"
        " (+ learned at 30%))",
        "",
        f"Held-out sessions: {r['fixed']['sessions']} (trained on the first {int(cfg['sessions'] * cfg['train_share'])})."
        + (f" Drift: {report['drift']}." if cfg["scenario"] == "drift" else ""),
        "",
        "| ranking | NDCG@10 | P@5 | incident rate |",
        "|---|---|---|---|",
    ]
    for name, label in VARIANT_LABELS:
        lines.append(f"| {label} | {r[name]['ndcg@10']:.4f} | {r[name]['p@5']:.4f} | {r[name]['incident_rate']:.3f} |")
    d = report["diffs"]
    m = report["ranker_metrics"]
    lines += [
        "",
        "NDCG@10 differences, paired per session, with paired-bootstrap 95% intervals: "
        + "; ".join(f"{name} {_ci(diff)}" for name, diff in d.items()) + ".",
        f"Best rule on the training samples: `{report['rule']['rule']}` (training AUC {report['rule']['train_auc']}).",
        f"Without a model the rankings are identical to fixed fusion: {report['untrained_identical_to_fixed']}.",
        "",
        f"Ranker: {m['num_samples']} samples ({m['num_positive']} positive, {m['num_negative']} negative; "
        f"{m['num_outcome_linked']} outcome-linked, {m['num_never_linked']} never linked), held-out accuracy "
        f"{m['accuracy']:.3f} (majority baseline {m['holdout_baseline_accuracy']:.3f}, AUC {m['holdout_auc']}), "
        f"trained in {report['ranker_train_seconds']}s. Top features: "
        + ", ".join(f"{k} {v:.2f}" for k, v in list(m["feature_importances"].items())[:5]) + ".",
        "",
        f"Refusal after 3 sessions: {report['early_refusal']}",
        "",
        "## Calibration: planted vs recovered signal strength per incident type",
        "",
        "| type | outcomes | planted (share caused by bad entries) | recovered strength | planted relative | recovered relative | multiplier (evidence-gated) |",
        "|---|---|---|---|---|---|---|",
    ]
    for t, planted in cal["planted_caused_share"].items():
        lines.append(
            f"| {t} | {planted['outcomes']} | {planted['caused_share']:.3f} | {cal['recovered_signal_strength'][t]:.4f} | "
            f"{cal['planted_relative'][t]:.3f} | {cal['recovered_relative'][t]:.3f} | {cal['multipliers'][t]} |"
        )
    lines += [
        f"| success | {cal['signals']['success']['num_outcomes']} | - | {cal['signals']['success']['signal_strength']} | - | - "
        f"| {cal['multipliers']['success']} |",
        "",
        f"Order planted {cal['order_planted']}, recovered {cal['order_recovered']} (Spearman {cal['spearman']}); "
        f"largest error in relative strength {cal['max_abs_relative_error']:.3f}. Decay half-life estimate "
        f"{cal['decay_half_life_days']} days.",
    ]
    return "\n".join(lines) + "\n"


def summary_table(reports: list[dict[str, Any]]) -> str:
    """Scenarios x seeds: NDCG@10 of each ranking and the paired differences with bootstrap intervals."""
    lines = [
        "| scenario | seed | held-out | fixed | best rule (picked on training) | learned | learned + per-service | "
        "learned - fixed [95% CI] | learned - rule [95% CI] | per-service - rule [95% CI] | "
        "no never-linked - rule [95% CI] | quality-only - rule [95% CI] | last-3-outcomes - rule [95% CI] | "
        "oracle - fixed | ranker acc / majority |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rep in reports:
        r, d, m = rep["retrieval"], rep["diffs"], rep["ranker_metrics"]
        lines.append(
            f"| {rep['config']['scenario']} | {rep['config']['seed']} | {r['fixed']['sessions']} | "
            f"{r['fixed']['ndcg@10']:.4f} | {r['rule']['ndcg@10']:.4f} (`{rep['rule']['rule']}`) | "
            f"{r['learned']['ndcg@10']:.4f} | {r['learned_entity']['ndcg@10']:.4f} | {_ci(d['learned-fixed'])} | "
            f"{_ci(d['learned-rule'])} | {_ci(d['learned_entity-rule'])} | {_ci(d['linked_only-rule'])} | "
            f"{_ci(d['quality_only-rule'])} | {_ci(d['recent_rule-rule'])} | {d['oracle-fixed']['mean_diff']:+.4f} | "
            f"{m['accuracy']:.3f} / {m['holdout_baseline_accuracy']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m amfs_server.session_bench.ml_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=SimConfig.sessions)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=["drift"])
    parser.add_argument("--out", type=Path, default=Path("reports/ml_bench"))
    args = parser.parse_args(argv)
    command = (f"python -m amfs_server.session_bench.ml_bench --sessions {args.sessions} --seeds "
               f"{' '.join(map(str, args.seeds))} --scenarios {' '.join(args.scenarios)}")
    args.out.mkdir(parents=True, exist_ok=True)
    reports = []
    for scenario in args.scenarios:
        for seed in args.seeds:
            config = SimConfig(sessions=args.sessions, seed=seed, scenario=scenario)
            with tempfile.TemporaryDirectory(prefix="amfs-ml-bench-") as tmp:
                report = asyncio.run(run(config, Path(tmp)))
            reports.append(report)
            stem = args.out / f"ml_bench-{scenario}-s{args.sessions}-seed{seed}"
            stem.with_suffix(".json").write_text(json.dumps({"command": command, **report}, indent=2, default=str))
            stem.with_suffix(".md").write_text(markdown(report, command))
            print(summary_table([report]), flush=True)
    table = summary_table(reports)
    (args.out / "summary.md").write_text(f"`{command}`\n\n{table}")
    print(table)
    print(f"[ml_bench] wrote {args.out}/summary.md and one .json/.md per scenario and seed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
