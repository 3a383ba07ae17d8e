"""Exact scan against the HNSW graph on real turn vectors: the figures behind `EXACT_SCAN_COMPONENTS` in
adapters/vector_index.py (research; docs/retrieval-record.md, "0.7.20").

Embeds `--turns` turns drawn at random from the conversation sets (as the store embeds a turn) and `--questions` of
their questions (as a retrieve embeds a question), then for each index size times the exact scan and the graph
walk (p50) and gives the graph's recall of the exact scan's `--k` nearest and of its top ten.

    python scripts/exact_scan_threshold.py --turns 6000 --sizes 2000,3000,4000,6000   # 8 minutes of embedding here

With `--retrieve-store DIR` (a SQLite store, e.g. `retrieve_breakdown.py`'s DIR/preloaded-10000-1000) it instead
times whole retrieves in process on that store, the exact scan and the graph walk taking turns (`--rounds` rounds of
200 questions each way, after 16 unmeasured ones), so both meet the same machine load.

    python scripts/exact_scan_threshold.py --retrieve-store /tmp/breakdown/preloaded-10000-1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path

import numpy as np

from amfs_server.adapters.vector_index import DEFAULT_CONNECTIVITY, DEFAULT_EXPANSION_ADD, DEFAULT_EXPANSION_SEARCH
from amfs_server.core.embedding import embed_queries
from amfs_server.core.models import Actor
from amfs_server.server.composition import build_service
from amfs_server.server.settings import load_settings
from amfs_server.session_bench.mcp_latency import bench_questions, server_env

DATA = Path(__file__).resolve().parents[1] / "session_bench" / "data"
SETS = ("annotated", "authored", "fresh", "recurring", "chitchat")


def turns_and_questions(seed: int) -> tuple[list[str], list[str]]:
    turns: list[str] = []
    questions: list[str] = []
    for name in SETS:
        for conversation in json.loads((DATA / f"conversations_{name}.json").read_text())["conversations"]:
            turns += [f"{t['speaker']}: {t['text']}" for s in conversation["sessions"] for t in s["turns"]]
            questions += [q["question"] for q in conversation["questions"]]
    rng = random.Random(seed)
    rng.shuffle(turns)
    rng.shuffle(questions)
    return turns, questions


def compare(vectors: np.ndarray, questions: np.ndarray, sizes: list[int], k: int) -> list[dict[str, float]]:
    from usearch.compiled import MetricKind, ScalarKind  # after vector_index's import: see adapters/_cxx_runtime
    from usearch.index import Index

    rows = []
    for size in sizes:
        index = Index(ndim=vectors.shape[1], metric=MetricKind.Cos, dtype=ScalarKind.F32,
                      connectivity=DEFAULT_CONNECTIVITY, expansion_add=DEFAULT_EXPANSION_ADD,
                      expansion_search=DEFAULT_EXPANSION_SEARCH)
        index.add(np.arange(size, dtype=np.uint64), vectors[:size])
        graph_ms, exact_ms, recall, top_ten = [], [], [], []
        for question in questions:
            started = time.perf_counter()
            graph = index.search(question, k)
            graph_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            exact = index.search(question, k, exact=True)
            exact_ms.append((time.perf_counter() - started) * 1000)
            recall.append(len(set(graph.keys.tolist()) & set(exact.keys.tolist())) / k)
            top_ten.append(len(set(graph.keys[:10].tolist()) & set(exact.keys[:10].tolist())) / 10)
        rows.append({"vectors": size, "exact_p50_ms": round(statistics.median(exact_ms), 2),
                     "graph_p50_ms": round(statistics.median(graph_ms), 2), f"recall@{k}": round(float(np.mean(recall)), 4),
                     "top_ten": round(float(np.mean(top_ten)), 4)})
    return rows


async def paired_retrieves(store: Path, rounds: int, questions: int = 200, embedder: str | None = None
                           ) -> dict[str, list[float]]:
    """p50 ms of `questions` whole retrieves per round, scanning exactly and walking the graph in turn."""
    service = build_service(load_settings(environ=server_env(store, **({"AMFS_EMBEDDER": embedder} if embedder else {}))))
    await service.open()
    actor = Actor("bench/exact-scan", "exact-scan")
    asked = bench_questions(questions)
    try:
        await service.retrieve(actor, asked[0])
        index = service.store._vectors.index  # type: ignore[attr-defined]  # SQLite's, synced by that retrieve
        found: dict[str, list[float]] = {"exact scan": [], "graph": []}
        for _ in range(rounds):
            for label, threshold in (("exact scan", len(index)), ("graph", 0)):
                index.exact_threshold = threshold
                for question in asked[:16]:
                    await service.retrieve(actor, question)
                samples = []
                for question in asked:
                    started = time.perf_counter()
                    await service.retrieve(actor, question)
                    samples.append((time.perf_counter() - started) * 1000)
                found[label].append(round(statistics.median(samples), 2))
        return found
    finally:
        await service.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=6000)
    parser.add_argument("--questions", type=int, default=300)
    parser.add_argument("--sizes", default="2000,3000,4000,6000", help="index sizes, each at most --turns")
    parser.add_argument("--k", type=int, default=64, help="how many nearest a search asks for (the pool: 64-75)")
    parser.add_argument("--embedder", default=None, help="AMFS_EMBEDDER (default: the server's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--retrieve-store", type=Path, help="time whole retrieves on this SQLite store instead")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.retrieve_store is not None:
        if not (args.retrieve_store / "amfs.db").exists():
            parser.error(f"--retrieve-store: no SQLite store (amfs.db) in {args.retrieve_store}")
        for label, medians in asyncio.run(paired_retrieves(args.retrieve_store, args.rounds, embedder=args.embedder)).items():
            print(f"{label}: retrieve p50 per round {medians} ms")
        return 0
    sizes = [int(size) for size in args.sizes.split(",")]
    if not sizes or min(sizes) < 1 or max(sizes) > args.turns:
        parser.error(f"--sizes must be between 1 and --turns ({args.turns}), got {args.sizes}")
    turns, questions = turns_and_questions(args.seed)
    if args.turns > len(turns):
        parser.error(f"--turns: the conversation sets hold {len(turns)} turns")
    extra = {"AMFS_EMBEDDER": args.embedder} if args.embedder else {}
    embedder = build_service(load_settings(environ=server_env(Path("unused"), **extra))).embedder
    assert embedder is not None, "an embedder is needed"
    started = time.perf_counter()
    vectors = np.stack([embedder.embed([turn])[0] for turn in turns[:args.turns]]).astype(np.float32)
    asked = np.stack([embed_queries(embedder, [q])[0] for q in questions[:args.questions]]).astype(np.float32)
    print(f"{embedder.name}: {args.turns} turns and {len(asked)} questions embedded in {time.perf_counter() - started:.0f} s")
    for row in compare(vectors, asked, sizes, args.k):
        print("  ".join(f"{name} {value}" for name, value in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
