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

Protocol: simulate the training sessions with fixed-weight fusion; train the ranker on that store;
copy the store and replay the same held-out sessions (same topics, queries and random draws) with
(a) fixed-weight fusion, (b) the learned fusion, (c) a ranker with no model, (d) the hidden quality
itself as the learned score (the ceiling). Relevance is on-topic AND good; NDCG@10 and precision@5
are measured on each session's retrieval. The calibrator runs on the fixed-fusion store after all
sessions; its relative signal strengths are compared with the planted ones.

Retrieval runs without an embedder (keyword + temporal + confidence, + learned): the semantic
strategy would cost a MiniLM pass per write and query on two shared cores and is not what is being
measured here.

    python -m amfs_server.session_bench.ml_bench --sessions 1200 --seed 0
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

from ..adapters.sqlite import SQLiteStore
from ..core.errors import InsufficientDataError
from ..core.models import Actor, MemoryType, OutcomeType
from ..core.service import MemoryService, ServiceConfig, WriteRequest
from ..ml.calibrator import ConfidenceCalibrator
from ..ml.ranker import LearnedRanker

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


@dataclass
class SimConfig:
    sessions: int = 1200
    seed: int = 0
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
    """The hidden truth: each entry's topic and quality."""

    topic_of: dict[str, int] = field(default_factory=dict)
    good: dict[str, bool] = field(default_factory=dict)

    def copy(self) -> World:
        return World(dict(self.topic_of), dict(self.good))

    def relevant(self, key: str, topic: int) -> bool:
        return self.topic_of.get(key) == topic and self.good.get(key, False)


class OutcomeSimulator:
    def __init__(self, config: SimConfig, clock: SimClock | None = None) -> None:
        self.config = config
        self.world = World()
        self.clock = clock or SimClock()

    def topic_words(self, topic: int) -> list[str]:
        return TOPIC_WORDS[3 * topic : 3 * topic + 3]

    def entity(self, topic: int) -> str:
        return f"svc-{topic % self.config.services}"

    def _draft(self, rng: random.Random, topic: int, key: str, writer: str) -> tuple[WriteRequest, bool]:
        memory_type = rng.choice(list(MemoryType))
        good = rng.random() < min(0.95, max(0.05, WRITERS[writer] + TYPE_SHIFT[memory_type]))
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
            self._remember(request, topic, good)

    def _remember(self, request: WriteRequest, topic: int, good: bool) -> None:
        key = f"{request.entity_path}/{request.key}"
        self.world.topic_of[key] = topic
        self.world.good[key] = good

    async def run_session(self, service: MemoryService, index: int) -> SessionResult:
        """One session. Every random draw comes from a per-session stream, consumed in the same order
        whatever the ranking was, so replays under different rankers differ only by the ranking."""
        config = self.config
        rng = random.Random(f"{config.seed}:session:{index}")
        topic = rng.randrange(config.topics)
        agent = rng.choice(list(WRITERS))
        query = " ".join(rng.sample(self.topic_words(topic), 2) + [rng.choice(FILLER_WORDS)])
        writes = rng.random() < config.write_prob
        decision, decision_good = self._draft(rng, topic, f"t{topic}-decision-{index}", agent)
        hits = [rng.random() for _ in range(config.read_k)]
        noise_draw, type_draw = rng.random(), rng.random()

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
            self._remember(decision, topic, decision_good)
        bad_used = [key for key in used if self.world.topic_of.get(key) == topic and not self.world.good.get(key, True)]
        caused = any(hits[i] < config.hazard for i in range(len(bad_used)))
        if caused:
            outcome = _pick(CAUSED_TYPES, type_draw)
        elif noise_draw < config.noise:
            outcome = _pick(NOISE_TYPES, type_draw)
        else:
            outcome = OutcomeType.SUCCESS
        self.clock.session(index, 3)
        if used:
            await service.commit_outcome(actor, f"sim-{index}", outcome, causal_entry_keys=used)
        return SessionResult(index, topic, ranked, self.ndcg(ranked, topic), self.precision(ranked, topic, 5),
                             outcome.value, caused)

    def ndcg(self, ranked: list[str], topic: int, k: int = 10) -> float:
        gains = [1.0 if self.world.relevant(key, topic) else 0.0 for key in ranked[:k]]
        dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains))
        available = sum(1 for key in self.world.topic_of if self.world.relevant(key, topic))
        ideal = sum(1 / math.log2(i + 2) for i in range(min(k, available)))
        return dcg / ideal if ideal else 0.0

    def precision(self, ranked: list[str], topic: int, k: int) -> float:
        return sum(1 for key in ranked[:k] if self.world.relevant(key, topic)) / k


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


async def _run(config: SimConfig, workdir: Path, clock: SimClock, progress: bool) -> dict[str, Any]:
    started = time.monotonic()
    n_train = int(config.sessions * config.train_share)
    simulator = OutcomeSimulator(config, clock)
    train_service = await open_service(workdir / "train.db")
    await simulator.seed_world(train_service)

    refusal = None
    early = await simulate(train_service, simulator, range(0, 3))
    try:
        await LearnedRanker(train_service, workdir / "models-early", clock=clock).train()
    except InsufficientDataError as error:
        refusal = str(error)
    train_results = early + await simulate(train_service, simulator, range(3, n_train))
    if progress:
        print(f"[ml_bench] simulated {n_train} training sessions in {time.monotonic() - started:.1f}s", flush=True)

    ranker = LearnedRanker(train_service, workdir / "models", clock=clock)
    train_started = time.monotonic()
    metrics = await ranker.train()
    train_seconds = time.monotonic() - train_started
    snapshot = await train_service.export_snapshot()
    train_service.learned_scorer = None
    await train_service.close()

    held_out = range(n_train, config.sessions)
    variants: dict[str, list[SessionResult]] = {}
    for name in ("fixed", "learned", "untrained", "oracle"):
        service = await open_service(workdir / f"eval-{name}.db")
        await service.import_snapshot(snapshot)
        if name == "learned":
            loaded = LearnedRanker(service, workdir / "models", clock=clock)
            loaded.load()
            loaded.install()
        elif name == "untrained":
            empty = LearnedRanker(service, workdir / "models-none", clock=clock)
            empty.load()
            empty.install()  # no model: leaves the learned strategy off
        replay = OutcomeSimulator(config, clock)
        replay.world = simulator.world.copy()
        if name == "oracle":
            # The ceiling: the hidden quality itself as the learned strategy's score, at the same 30% weight.
            service.learned_scorer = lambda entries, ranks, world=replay.world: [
                1.0 if world.good.get(e.entry_key, False) else 0.0 for e in entries
            ]
        variants[name] = await simulate(service, replay, held_out)
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
    report = {
        "config": asdict(config),
        "embedder": None,
        "retrieval": {name: summarize(results) for name, results in variants.items()},
        "learned_vs_fixed": {
            "ndcg@10": paired(variants["fixed"], variants["learned"], "ndcg10"),
            "p@5": paired(variants["fixed"], variants["learned"], "p5"),
        },
        "untrained_identical_to_fixed": all(
            a.ranked == b.ranked for a, b in zip(variants["fixed"], variants["untrained"])
        ),
        "ranker_metrics": metrics.to_dict(),
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
            "signals": {k: asdict(s) for k, s in signals.items()},
            "decay_half_life_days": calibration.global_multipliers.decay_half_life_days,
            "entity_overrides": len(calibration.entity_multipliers),
        },
        "seconds": round(time.monotonic() - started, 1),
    }
    return report


def markdown(report: dict[str, Any], command: str) -> str:
    r, cal = report["retrieval"], report["calibration"]
    lines = [
        "# ML benchmark: learned ranking and outcome calibration",
        "",
        f"`{command}` ({report['seconds']}s; embedder: none, so fusion is keyword + temporal + confidence"
        " (+ learned at 30%))",
        "",
        f"Held-out sessions: {r['fixed']['sessions']} (trained on the first "
        f"{int(report['config']['sessions'] * report['config']['train_share'])})",
        "",
        "| ranking | NDCG@10 | P@5 | incident rate |",
        "|---|---|---|---|",
    ]
    for name, label in (("fixed", "fixed-weight fusion"), ("learned", "learned fusion (trained)"),
                        ("untrained", "ranker without a model"),
                        ("oracle", "ceiling: hidden quality as the learned score")):
        lines.append(f"| {label} | {r[name]['ndcg@10']:.4f} | {r[name]['p@5']:.4f} | {r[name]['incident_rate']:.3f} |")
    lv = report["learned_vs_fixed"]
    m = report["ranker_metrics"]
    lines += [
        "",
        f"Learned - fixed, paired per session: NDCG@10 {lv['ndcg@10']['mean_diff']:+.4f} "
        f"(± {lv['ndcg@10']['stderr']:.4f} s.e., z={lv['ndcg@10']['z']}), P@5 {lv['p@5']['mean_diff']:+.4f} "
        f"(± {lv['p@5']['stderr']:.4f}, z={lv['p@5']['z']}).",
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
        "| type | outcomes | planted (share caused by bad entries) | recovered strength | planted relative | recovered relative | calibrated multiplier |",
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
        f"{cal['decay_half_life_days']} days (median age of the versions sessions read; the simulated seed entries span "
        "30 days and sessions run hourly after them).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m amfs_server.session_bench.ml_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=SimConfig.sessions)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("reports/ml_bench"))
    args = parser.parse_args(argv)
    config = SimConfig(sessions=args.sessions, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="amfs-ml-bench-") as tmp:
        report = asyncio.run(run(config, Path(tmp)))
    command = f"python -m amfs_server.session_bench.ml_bench --sessions {args.sessions} --seed {args.seed}"
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"ml_bench-s{args.sessions}-seed{args.seed}"
    stem.with_suffix(".json").write_text(json.dumps({"command": command, **report}, indent=2, default=str))
    text = markdown(report, command)
    stem.with_suffix(".md").write_text(text)
    print(text)
    print(f"[ml_bench] wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
