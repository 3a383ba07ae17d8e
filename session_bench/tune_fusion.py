"""Choose the hybrid fusion's semantic/keyword weights on the conversation set's tuning split.

Every weight pair is a ranker of the conversation benchmark (`conversation_bench.service_ranker`): each question is
asked through `MemoryService.retrieve` with limit 10 and those weights, temporal and confidence at their defaults,
so the sweep measures exactly what a client would get. The row for the default weights is the default fusion.

    python -m amfs_server.session_bench.tune_fusion                          # the sweep, tuning split
    python -m amfs_server.session_bench.tune_fusion --split test --semantic-weights 0.3   # report the choice once
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from ..core.retrieval import HYBRID_WEIGHTS
from .conversation_bench import DATASET, SPLITS, load_conversations, run_in_process, service_ranker

SEMANTIC_WEIGHTS = (0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6)
RELEVANCE = HYBRID_WEIGHTS["semantic"] + HYBRID_WEIGHTS["keyword"]  # what semantic and keyword share


def weights_for(semantic: float) -> dict[str, float]:
    """The default weights with semantic's share of the relevance weight set to `semantic` (keyword the rest)."""
    return {**HYBRID_WEIGHTS, "semantic": semantic * RELEVANCE, "keyword": (1.0 - semantic) * RELEVANCE}


def sweep(conversations: list[dict[str, Any]], semantic_weights: tuple[float, ...]) -> dict[float, dict[str, float]]:
    """recall@10 / MRR@10 over all questions of `conversations` for each semantic share (SQLite, in process)."""
    selected = {str(weight): service_ranker(weights_for(weight)) for weight in semantic_weights}
    rows = asyncio.run(run_in_process(conversations, "sqlite", selected=selected))
    return {weight: {"recall@10": sum(r["recall@10"] for r in rows[str(weight)]) / len(rows[str(weight)]),
                     "mrr@10": sum(r["mrr@10"] for r in rows[str(weight)]) / len(rows[str(weight)]),
                     "n": len(rows[str(weight)])}
            for weight in semantic_weights}


def main(argv: list[str] | None = None) -> dict[float, dict[str, float]]:
    parser = argparse.ArgumentParser(prog="python -m amfs_server.session_bench.tune_fusion",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=SPLITS, default="tuning", help="tuning (default): choose; test: report once")
    parser.add_argument("--semantic-weights", default=",".join(map(str, SEMANTIC_WEIGHTS)),
                        help="comma-separated shares of the relevance weight for semantic; keyword gets the rest")
    parser.add_argument("--dataset", type=Path, default=DATASET)
    args = parser.parse_args(argv)
    try:
        weights = tuple(float(w) for w in args.semantic_weights.split(","))
    except ValueError:
        weights = ()
    if not weights or any(not 0.0 <= w <= 1.0 for w in weights):
        parser.error(f"--semantic-weights takes numbers between 0 and 1, e.g. 0.3,0.4; got {args.semantic_weights!r}")
    table = sweep(load_conversations(args.dataset, args.split), weights)
    default = HYBRID_WEIGHTS["semantic"] / RELEVANCE
    print(f"{args.split} split: hybrid fusion by semantic share (keyword the rest), recall@10 / MRR@10")
    for weight, row in table.items():
        mark = "  <- default" if abs(weight - default) < 1e-9 else ""
        print(f"  semantic {weight:.2f}: {row['recall@10']:.3f} / {row['mrr@10']:.3f} (n={row['n']}){mark}")
    return table


if __name__ == "__main__":
    main()
