"""Retrieval benchmarks: quality on the committed data set, and latency/ingest at scale on each store.

quality: recall@5, recall@10 and MRR for each single strategy and for the weighted-RRF fusion, on
`data/retrieval_eval.json` (agent memories with questions and gold entry keys), real MiniLM embeddings.

scale: ingest throughput with embeddings (write path, batched) against the embedder's own batch
throughput; retrieve p50/p95 at several store sizes next to the time to embed the query alone, measured
interleaved in the same run (the machine is shared and noisy, so targets are ratios and differences).
Writes JSON, markdown and a PNG under `reports/`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..adapters.embedders import load_embedder
from ..core.embedding import (ENTRY_VECTORS, EntryVectors, embed_entries, embed_queries, entry_texts,
                              embedding_text)
from ..core.models import Actor, MemoryEntry, MemoryType, NewEntry, Provenance, utcnow
from ..core.service import MemoryService, ServiceConfig, WriteRequest
from ..core.tiers import priority_score, tier_for
from ..core.ports import StoreSnapshot
from . import SINGLE_STRATEGIES, add_query_encoder_option, alone, close_store, embedder_option, log, open_store, percentile, pyplot

DATASET = Path(__file__).parent / "data" / "retrieval_eval.json"
QUALITY_FUSION = "fusion: hybrid (the default)"


# -- quality ------------------------------------------------------------------------------------


def dataset_snapshot(dataset: dict[str, Any], embedder) -> StoreSnapshot:
    """Every memory (older versions first) with its real age, embedded by the real model in batches."""
    now = utcnow()
    entries: list[MemoryEntry] = []
    for memory in dataset["memories"]:
        values = [*memory.get("versions", []), memory["value"]]
        age = float(memory["written_days_ago"])
        for version, value in enumerate(values, start=1):
            written = now - timedelta(days=age + (len(values) - version) * 7)
            entries.append(
                MemoryEntry(
                    memory["entity_path"], memory["key"], value, version, float(memory["confidence"]),
                    Provenance(f"agent/session-{memory['session']}", f"s{memory['session']}", written),
                    memory_type=MemoryType(memory["memory_type"]),
                )
            )
    made = embed_entries(embedder.embed, [entry_texts(e.entity_path, e.key, e.value) for e in entries])
    return StoreSnapshot(entries=[
        e.with_changes(embedding=v.tolist(), passage_embeddings=None if p is None else p.tolist())
        for e, v, p in zip(entries, made.vectors, made.passages)])


def score_question(ranked: list[str], gold: list[str]) -> dict[str, float]:
    gold_set = set(gold)
    first = next((i for i, key in enumerate(ranked, start=1) if key in gold_set), None)
    return {
        "recall@5": len(gold_set & set(ranked[:5])) / len(gold_set),
        "recall@10": len(gold_set & set(ranked[:10])) / len(gold_set),
        "mrr": 1.0 / first if first else 0.0,
    }


async def run_quality(stores: list[str], out_dir: Path, embedder=None) -> dict[str, Any]:
    dataset = json.loads(DATASET.read_text())
    embedder = embedder or load_embedder()
    snapshot = dataset_snapshot(dataset, embedder)
    configs: dict[str, tuple[dict[str, float] | None, str | None]] = {
        name: (alone(name), None) for name in SINGLE_STRATEGIES
    }
    configs[QUALITY_FUSION] = (None, None)
    configs["rrf 0.4/0.2/0.2/0.2 (the seed's fusion)"] = (None, "rrf")
    report: dict[str, Any] = {"dataset": {"memories": len(dataset["memories"]), "questions": len(dataset["questions"])},
                              "stores": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in stores:
            store = await open_store(kind, Path(tmp), embedder.dimension)
            try:
                service = MemoryService(store, ServiceConfig(), embedder=embedder)
                await service.open()
                await service.import_snapshot(snapshot)
                table: dict[str, dict[str, float]] = {}
                questions: dict[str, list[dict[str, Any]]] = {}
                halves: dict[str, dict[str, dict[str, float]]] = {}
                by_kind: dict[str, dict[str, dict[str, float]]] = {}
                for name, (weights, fusion) in configs.items():
                    totals: list[dict[str, float]] = []
                    kinds: dict[str, list[dict[str, float]]] = {}
                    for number, question in enumerate(dataset["questions"]):
                        actor = Actor("bench", f"q{number}")
                        results = await service.retrieve(
                            actor, question["question"], entity_path=question.get("entity_path"), limit=10, weights=weights,
                            fusion=fusion,
                        )
                        scores = score_question([r.entry.entry_key for r in results], question["gold"])
                        totals.append(scores)
                        kinds.setdefault(question["kind"], []).append(scores)
                    # Per question, for `bench retrieval intervals`; grouped by the service the answer belongs to.
                    questions[name] = [
                        {"id": f"q{number:03d}", "group": question["gold"][0].split("/", 1)[0], "kind": question["kind"],
                         "half": "odd" if number % 2 else "even", **scores}
                        for number, (question, scores) in enumerate(zip(dataset["questions"], totals))]
                    table[name] = _means(totals)
                    # The pool settings were chosen on the even-numbered questions; the odd ones are held out.
                    halves[name] = {"even (tuning)": _means(totals[0::2]), "odd (held out)": _means(totals[1::2])}
                    by_kind[name] = {
                        k: {"recall@10": statistics.fmean(s["recall@10"] for s in v), "mrr": statistics.fmean(s["mrr"] for s in v),
                            "n": len(v)}
                        for k, v in kinds.items()
                    }
                    log(f"[quality/{kind}] {name}: " + ", ".join(f"{m}={v:.3f}" for m, v in table[name].items()))
                report["stores"][kind] = {"overall": table, "halves": halves, "mrr_by_question_kind": by_kind,
                                          "questions": questions}
            finally:
                await close_store(store)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "quality.json").write_text(json.dumps(report, indent=2))
    (out_dir / "quality.md").write_text(quality_markdown(report))
    print(quality_markdown(report))
    return report


def _means(scores: list[dict[str, float]]) -> dict[str, float]:
    return {m: statistics.fmean(s[m] for s in scores) for m in ("recall@5", "recall@10", "mrr")}


def quality_markdown(report: dict[str, Any]) -> str:
    lines = [f"Retrieval quality: {report['dataset']['memories']} memories, {report['dataset']['questions']} questions\n"]
    for kind, data in report["stores"].items():
        lines += [f"### {kind}\n", "| strategy | recall@5 | recall@10 | MRR |", "| --- | --- | --- | --- |"]
        for name, row in data["overall"].items():
            lines.append(f"| {name} | {row['recall@5']:.3f} | {row['recall@10']:.3f} | {row['mrr']:.3f} |")
        lines += ["", "| strategy | half | recall@5 | recall@10 | MRR |", "| --- | --- | --- | --- | --- |"]
        for name, per_half in data["halves"].items():
            for half, row in per_half.items():
                lines.append(f"| {name} | {half} | {row['recall@5']:.3f} | {row['recall@10']:.3f} | {row['mrr']:.3f} |")
        kinds = sorted(next(iter(data["mrr_by_question_kind"].values())))
        lines += ["", "recall@10 / MRR by question kind:", "", "| strategy | " + " | ".join(kinds) + " |",
                  "| --- |" + " --- |" * len(kinds)]
        for name, per in data["mrr_by_question_kind"].items():
            lines.append(
                f"| {name} | " + " | ".join(f"{per[k]['recall@10']:.3f} / {per[k]['mrr']:.3f} (n={per[k]['n']})" for k in kinds) + " |"
            )
        lines.append("")
    return "\n".join(lines)


# -- scale --------------------------------------------------------------------------------------

SERVICES = ["checkout", "payments", "auth", "search", "inventory", "notifications", "billing", "gateway", "orders",
            "ledger", "catalog", "shipping", "identity", "analytics", "reporting", "web", "mobile", "etl", "k8s", "cdn"]
TEAMS = ["platform", "payments", "growth", "data", "identity", "edge", "storage", "search"]
TOPICS = [
    ("retry policy", "retries failed calls {n} times with exponential backoff starting at {m}ms"),
    ("timeout", "uses a {n}s upstream timeout; p99 latency was {m}ms last week"),
    ("connection pool", "keeps a pool of {n} connections per pod; exhaustion seen at {m} rps"),
    ("cache", "caches lookups in Redis for {n} minutes; hit rate {m}%"),
    ("deploy", "deploys through canary at {n}% traffic for {m} minutes before full rollout"),
    ("incident", "had incident INC-{n}{m} caused by a bad config push; rolled back in {m} minutes"),
    ("feature flag", "ships feature flag ff_{m}_{n} default off until QA signs off"),
    ("rate limit", "rate limits clients at {n} requests per second with a burst of {m}"),
    ("schema migration", "runs schema migration {n} online with batches of {m} rows"),
    ("alerting", "pages on-call when error rate exceeds {n}% for {m} minutes"),
]


def synthetic_notes(count: int, seed: int = 7) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    notes = []
    for i in range(count):
        service = rng.choice(SERVICES)
        topic, template = rng.choice(TOPICS)
        # Two sentences, so every note has passage vectors and the timings include their second look.
        text = (f"The {service} service " + template.format(n=rng.randint(2, 999), m=rng.randint(10, 9999))
                + f". Owned by the {rng.choice(TEAMS)} team.")
        notes.append((f"{service}/{rng.choice(['api', 'worker', 'db', 'infra'])}", f"{topic.replace(' ', '-')}-{i}", text))
    return notes


def cached_vectors(notes: list[tuple[str, str, str]], embedder, cache_dir: Path) -> EntryVectors:
    """Embed the synthetic notes once (the same model, batched) and keep them, so store sizes can be rebuilt quickly."""
    import numpy as np

    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"synthetic-{len(notes)}-{embedder.name}-{ENTRY_VECTORS}.npz"
    if path.exists():
        with np.load(path) as cached:
            return EntryVectors(cached["vectors"], list(cached["passages"]))
    log(f"[scale] embedding {len(notes)} synthetic notes once (cached at {path}) ...")
    vectors, passages = [], []
    step = 2048
    for start in range(0, len(notes), step):
        made = embed_entries(embedder.embed, [entry_texts(p, k, t) for p, k, t in notes[start:start + step]])
        vectors.append(made.vectors)
        passages += made.passages
        log(f"[scale]   {min(start + step, len(notes))}/{len(notes)}")
    made = EntryVectors(np.concatenate(vectors).astype("float32"), passages)
    np.savez(path, vectors=made.vectors, passages=np.stack(passages))  # every note has two sentences
    return made


def real_vectors_problem(real: int, count: int) -> str | None:
    """Why `real` embedded vectors cannot stand for `count` entries through `mixed_vectors`, or None if they can."""
    if real < 2:
        return "takes N >= 2 (a mixture needs two real vectors)"
    if count - real > real * ((real - 1) // 2):
        least = next(n for n in range(2, count + 1) if count - n <= n * ((n - 1) // 2))
        return f"{real} real vectors make at most {real * ((real - 1) // 2)} distinct mixtures; {count} entries need N >= {least}"
    return None


def mixed_vectors(real: EntryVectors, count: int) -> EntryVectors:
    """`count` entry vectors of which the first n = len(real) are the real ones and each later one the normalised sum
    of two of them, a different pair each, with the first one's passages.

    For timing only: embedding 100,000 notes with chat-mpnet takes hours on two cores, while the query path's cost
    depends on how many vectors the index and the second look hold, not on what they say. The mixtures are distinct,
    lie among the real vectors rather than in empty space, and keep the notes' keyword texts real."""
    import numpy as np

    n = len(real.passages)
    if count <= n:
        return EntryVectors(real.vectors[:count], real.passages[:count])
    # Mixture j pairs note j mod n with the note 1 + j // n places on: each unordered pair at most once while
    # that offset stays within (n - 1) / 2.
    if count - n > n * ((n - 1) // 2):
        raise ValueError(f"{n} real vectors make at most {n * ((n - 1) // 2)} distinct mixtures; "
                         f"{count - n} were asked for")
    index = np.arange(count - n)
    first, second = index % n, (index % n + 1 + index // n) % n
    mixed = real.vectors[first] + real.vectors[second]
    mixed /= np.linalg.norm(mixed, axis=1, keepdims=True)
    return EntryVectors(np.concatenate([real.vectors, mixed.astype("float32")]),
                        list(real.passages) + [real.passages[i] for i in first])


async def fill_store(store, notes, vectors: EntryVectors, already: int, target: int) -> None:
    """Insert pre-embedded notes already..target through the store's normal insert path."""
    now = utcnow()
    actor = Actor("agent/bench", "bench-fill")
    score = priority_score(now, now, 1.0, 0, None)
    batch = 2000
    for start in range(already, target, batch):
        drafts = [
            NewEntry(p, k, t, json.dumps(t), 1.0, MemoryType.FACT, actor.agent_id, actor.session_id, now, None, None, None,
                     tier_for(score), score, vectors.vectors[i].tolist(), embedding_text(p, k, t),
                     passage_embeddings=None if vectors.passages[i] is None else vectors.passages[i].tolist())
            for i, (p, k, t) in enumerate(notes[start:min(target, start + batch)], start=start)
        ]
        await store.insert_versions(drafts, actor)


@dataclass
class Timing:
    p50: float
    p95: float


def timing(samples: list[float]) -> Timing:
    return Timing(percentile(samples, 50) * 1000, percentile(samples, 95) * 1000)


async def measure_ingest(store_kind: str, embedder, workdir: Path, count: int) -> dict[str, float]:
    notes = synthetic_notes(count, seed=99)
    texts = [entry_texts(p, k, t) for p, k, t in notes]
    started = time.perf_counter()
    embed_entries(embedder.embed, texts)
    embed_rate = count / (time.perf_counter() - started)
    store = await open_store(store_kind, workdir, embedder.dimension)
    try:
        service = MemoryService(store, ServiceConfig(), embedder=embedder)
        await service.open()
        actor = Actor("agent/bench", "ingest")
        in_flight = asyncio.Semaphore(2)  # a bulk importer keeps two batches going: one embeds while one is stored

        async def batch(start: int) -> None:
            async with in_flight:
                await service.write_many(actor, [WriteRequest(p, k, t) for p, k, t in notes[start:start + 256]])

        started = time.perf_counter()
        await asyncio.gather(*(batch(start) for start in range(0, count, 256)))
        ingest_rate = count / (time.perf_counter() - started)
    finally:
        await close_store(store)
    return {"entries": count, "embedder_batch_rate": embed_rate, "ingest_rate": ingest_rate,
            "ratio": ingest_rate / embed_rate}


async def run_scale(stores: list[str], sizes: list[int], queries: int, ingest_count: int, out_dir: Path,
                    cache_dir: Path, embedder=None, real_vectors: int | None = None) -> dict[str, Any]:
    embedder = embedder or load_embedder()
    embedder.embed(["warm up"])
    dataset = json.loads(DATASET.read_text())
    questions = [q["question"] for q in dataset["questions"]][:queries]
    notes = synthetic_notes(max(sizes))
    embedded = notes if real_vectors is None else notes[:real_vectors]
    vectors = mixed_vectors(cached_vectors(embedded, embedder, cache_dir), len(notes))
    report: dict[str, Any] = {"sizes": sizes, "queries": len(questions), "stores": {}, "ingest": {},
                              "real_vectors": min(len(notes), real_vectors or len(notes))}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in stores:
            log(f"[scale/{kind}] ingest with embeddings: {ingest_count} entries ...")
            report["ingest"][kind] = await measure_ingest(kind, embedder, Path(tmp), ingest_count)
            log(f"[scale/{kind}] ingest {report['ingest'][kind]['ingest_rate']:.0f}/s vs embedder "
                f"{report['ingest'][kind]['embedder_batch_rate']:.0f}/s")
            store = await open_store(kind, Path(tmp), embedder.dimension)
            rows = []
            try:
                service = MemoryService(store, ServiceConfig(), embedder=embedder)
                await service.open()
                filled = 0
                for size in sorted(sizes):
                    log(f"[scale/{kind}] filling to {size} entries ...")
                    await fill_store(store, notes, vectors, filled, size)
                    filled = size
                    actor = Actor("agent/bench", f"scale-{size}")
                    await service.retrieve(actor, "warm up the index")  # syncs/loads the ANN index outside the timing
                    embed_times, retrieve_times, scoped_times = [], [], []
                    for number, question in enumerate(questions):
                        started = time.perf_counter()
                        embed_queries(embedder, [question])
                        embed_times.append(time.perf_counter() - started)
                        started = time.perf_counter()
                        await service.retrieve(actor, question, limit=10)
                        retrieve_times.append(time.perf_counter() - started)
                        # As a conversation benchmark asks: scoped to one of many entity paths in the store.
                        started = time.perf_counter()
                        await service.retrieve(actor, question, entity_path=SERVICES[number % len(SERVICES)], limit=10)
                        scoped_times.append(time.perf_counter() - started)
                    embed_t, retrieve_t, scoped_t = timing(embed_times), timing(retrieve_times), timing(scoped_times)
                    row = {"size": size, "embed_p50_ms": embed_t.p50, "embed_p95_ms": embed_t.p95,
                           "retrieve_p50_ms": retrieve_t.p50, "retrieve_p95_ms": retrieve_t.p95,
                           "overhead_p50_ms": retrieve_t.p50 - embed_t.p50, "overhead_p95_ms": retrieve_t.p95 - embed_t.p95,
                           "scoped_p50_ms": scoped_t.p50, "scoped_p95_ms": scoped_t.p95}
                    rows.append(row)
                    log(f"[scale/{kind}] {size}: retrieve p50 {row['retrieve_p50_ms']:.1f} ms p95 "
                        f"{row['retrieve_p95_ms']:.1f} ms | embed p50 {row['embed_p50_ms']:.1f} ms "
                        f"-> overhead p50 {row['overhead_p50_ms']:.1f} ms p95 {row['overhead_p95_ms']:.1f} ms | "
                        f"scoped to one service p50 {row['scoped_p50_ms']:.1f} ms p95 {row['scoped_p95_ms']:.1f} ms")
            finally:
                await close_store(store)
            report["stores"][kind] = rows
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scale.json").write_text(json.dumps(report, indent=2))
    (out_dir / "scale.md").write_text(scale_markdown(report))
    plot_scale(report, out_dir / "scale.png")
    print(scale_markdown(report))
    return report


def scale_markdown(report: dict[str, Any]) -> str:
    lines = ["| store | entries | retrieve p50 ms | retrieve p95 ms | embed query p50 ms | overhead p50 ms | overhead p95 ms "
             f"| scoped to one of {len(SERVICES)} services, p50 / p95 ms |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    real = report.get("real_vectors")
    for kind, rows in report["stores"].items():
        for r in rows:
            size = f"{r['size']} ({real} real vectors)" if real is not None and r["size"] > real else r["size"]
            lines.append(f"| {kind} | {size} | {r['retrieve_p50_ms']:.1f} | {r['retrieve_p95_ms']:.1f} | "
                         f"{r['embed_p50_ms']:.1f} | {r['overhead_p50_ms']:.1f} | {r['overhead_p95_ms']:.1f} | "
                         f"{r['scoped_p50_ms']:.1f} / {r['scoped_p95_ms']:.1f} |")
    lines += ["", "Ingest: `write_many` batches of 256 with embeddings, two batches in flight.", "",
              "| store | ingest entries/s (with embeddings) | embedder alone, batched | ratio |", "| --- | --- | --- | --- |"]
    for kind, ingest in report["ingest"].items():
        lines.append(f"| {kind} | {ingest['ingest_rate']:.0f} | {ingest['embedder_batch_rate']:.0f} | {ingest['ratio']:.2f} |")
    if len(report["stores"]) == 2 and all(report["stores"].values()):
        sqlite_rows, pg_rows = report["stores"].get("sqlite", []), report["stores"].get("postgres", [])
        lines += ["", "| entries | postgres/sqlite retrieve p50 |", "| --- | --- |"]
        for s, p in zip(sqlite_rows, pg_rows):
            lines.append(f"| {s['size']} | {p['retrieve_p50_ms'] / s['retrieve_p50_ms']:.2f}x |")
    return "\n".join(lines) + "\n"


def plot_scale(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for kind, rows in report["stores"].items():
        sizes = [r["size"] for r in rows]
        axis.plot(sizes, [r["retrieve_p50_ms"] for r in rows], marker="o", label=f"{kind} retrieve p50")
        axis.plot(sizes, [r["retrieve_p95_ms"] for r in rows], marker="^", linestyle="--", label=f"{kind} retrieve p95")
        axis.plot(sizes, [r["scoped_p50_ms"] for r in rows], marker="s", linestyle="-.", label=f"{kind} scoped retrieve p50")
        axis.plot(sizes, [r["embed_p50_ms"] for r in rows], marker=".", linestyle=":", label=f"{kind} embed-only p50")
    axis.set_xscale("log")
    axis.set_xlabel("entries in the store")
    axis.set_ylabel("milliseconds per query")
    axis.set_title("amfs_retrieve latency vs store size (2-core CPU)")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["conversations"]:
        from .conversation_bench import main as conversations_main

        conversations_main(argv[1:])
        return
    if argv[:1] == ["intervals"]:
        from .intervals import main as intervals_main

        intervals_main(argv[1:])
        return
    parser = argparse.ArgumentParser(prog="amfs-server bench retrieval", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("conversations", add_help=False,
                   help="recall@10 / MRR@10 on multi-session conversations (options: conversations --help)")
    sub.add_parser("intervals", add_help=False,
                   help="95%% bootstrap intervals for a `conversations --json` report or a quality.json "
                        "(options: intervals --help)")
    quality = sub.add_parser("quality", help="recall@k / MRR per strategy and for the fusion")
    quality.add_argument("--stores", default="sqlite")
    quality.add_argument("--out", type=Path, default=Path("reports/retrieval"))
    quality.add_argument("--embedder", default=None,
                         help="the embedder, by name or an exported ONNX file (PATH.onnx[.gz]; default: the server's)")
    add_query_encoder_option(quality)
    scale = sub.add_parser("scale", help="ingest throughput and retrieve latency vs store size")
    scale.add_argument("--stores", default="sqlite,postgres")
    scale.add_argument("--sizes", default="1000,10000,100000")
    scale.add_argument("--queries", type=int, default=100)
    scale.add_argument("--ingest-count", type=int, default=2000)
    scale.add_argument("--out", type=Path, default=Path("reports/retrieval"))
    scale.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "amfs-server" / "bench")
    scale.add_argument("--embedder", default=None,
                       help="the embedder, by name or an exported ONNX file (PATH.onnx[.gz]; default: the server's)")
    scale.add_argument("--real-vectors", type=int, default=None, metavar="N",
                       help="embed only the first N notes; later ones carry normalised sums of two real vectors "
                            "(a timing fill for sizes the embedder cannot reach in a session; default: embed all)")
    add_query_encoder_option(scale)
    args = parser.parse_args(argv)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if args.command == "quality":
        embedder = embedder_option(parser, args.embedder, args.query_encoder)
        asyncio.run(run_quality(stores, args.out, embedder))
    else:
        sizes = [int(s) for s in args.sizes.split(",")]
        problem = args.real_vectors is not None and real_vectors_problem(args.real_vectors, max(sizes))
        if problem:
            parser.error(f"--real-vectors: {problem}")
        embedder = embedder_option(parser, args.embedder, args.query_encoder)
        asyncio.run(run_scale(stores, sizes, args.queries, args.ingest_count, args.out, args.cache_dir, embedder,
                              args.real_vectors))


if __name__ == "__main__":
    main()
