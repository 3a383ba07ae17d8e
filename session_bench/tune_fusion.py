"""Choose the hybrid fusion's semantic/keyword weights and the best sentence's share of the semantic score on the
conversation set's tuning split.

Every (passage share, weight) pair is a ranker of the conversation benchmark (`conversation_bench.service_ranker`):
each question is asked through `MemoryService.retrieve` with limit 10, those weights and
`ServiceConfig.passage_share`, temporal and confidence at their defaults, so the sweep measures exactly what a
client would get. The row for the defaults is the default fusion.

    python -m amfs_server.session_bench.tune_fusion                          # the weight sweep, tuning split
    python -m amfs_server.session_bench.tune_fusion --passage-shares 0,0.25,0.5,0.75,1 --semantic-weights 0.3,0.4
    python -m amfs_server.session_bench.tune_fusion --passage-shares 0,0.5 --reattribute-evidence 0.1   # stress
    python -m amfs_server.session_bench.tune_fusion --split test --semantic-weights 0.3   # report the choice once
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..core.embedding import PASSAGE_SHARE
from ..core.retrieval import HYBRID_WEIGHTS
from . import embedder_option
from .conversation_bench import (
    DATASET, SPLITS, Ranker, load_conversations, mean_scores, reattribute_evidence, run_in_process, service_ranker,
)

SEMANTIC_WEIGHTS = (0.2, 0.3, 0.4, 0.5, 0.6)
RELEVANCE = HYBRID_WEIGHTS["semantic"] + HYBRID_WEIGHTS["keyword"]  # what semantic and keyword share


def weights_for(semantic: float) -> dict[str, float]:
    """The default weights with semantic's share of the relevance weight set to `semantic` (keyword the rest)."""
    return {**HYBRID_WEIGHTS, "semantic": semantic * RELEVANCE, "keyword": (1.0 - semantic) * RELEVANCE}


def with_passage_share(share: float, ranker: Ranker) -> Ranker:
    """`ranker` run with `ServiceConfig.passage_share` set to `share` (restored after)."""

    async def rank(service: Any, conversation: dict[str, Any], questions: list[dict[str, Any]]) -> list[list[str]]:
        config = service.config
        service.config = replace(config, passage_share=share)
        try:
            return await ranker(service, conversation, questions)
        finally:
            service.config = config

    return rank


def sweep(conversations: list[dict[str, Any]], semantic_weights: tuple[float, ...],
          passage_shares: tuple[float, ...] = (PASSAGE_SHARE,), embedder: Any = None,
          ) -> dict[tuple[float, float], dict[str, float]]:
    """recall@10 / MRR@10 over all questions of `conversations` for each (passage share, semantic share) pair
    (SQLite, in process; each conversation written once)."""
    pairs = [(share, weight) for share in passage_shares for weight in semantic_weights]
    selected = {str(pair): with_passage_share(pair[0], service_ranker(weights_for(pair[1]))) for pair in pairs}
    rows = asyncio.run(run_in_process(conversations, "sqlite", embedder=embedder, selected=selected))
    return {pair: mean_scores(rows[str(pair)]) for pair in pairs}


def _numbers(parser: argparse.ArgumentParser, text: str, option: str) -> tuple[float, ...]:
    try:
        values = tuple(float(w) for w in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not 0.0 <= w <= 1.0 for w in values):
        parser.error(f"{option} takes numbers between 0 and 1, e.g. 0.3,0.4; got {text!r}")
    return values


def main(argv: list[str] | None = None) -> dict[tuple[float, float], dict[str, float]]:
    parser = argparse.ArgumentParser(prog="python -m amfs_server.session_bench.tune_fusion",
                                     description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--split", choices=SPLITS, default="tuning", help="tuning (default): choose; test: report once")
    parser.add_argument("--semantic-weights", default=",".join(map(str, SEMANTIC_WEIGHTS)),
                        help="comma-separated shares of the relevance weight for semantic; keyword gets the rest")
    parser.add_argument("--passage-shares", default=str(PASSAGE_SHARE),
                        help="comma-separated shares of the semantic score taken from an entry's best sentence "
                             f"(ServiceConfig.passage_share; default {PASSAGE_SHARE}; 0 = mean vector alone)")
    parser.add_argument("--reattribute-evidence", type=float, default=0.0, metavar="SHARE",
                        help="first give this share (0-1) of the evidence turns to the other speaker, as "
                             "`amfs-server bench retrieval conversations` does: a choice that leans on the named "
                             "person being the speaker loses here (default 0)")
    parser.add_argument("--dataset", type=Path, default=DATASET)
    parser.add_argument("--embedder", default=None,
                        help="by name or an exported ONNX file (PATH.onnx[.gz]); default: the server's default")
    args = parser.parse_args(argv)
    embedder = embedder_option(parser, args.embedder)
    if not 0.0 <= args.reattribute_evidence <= 1.0:
        parser.error(f"--reattribute-evidence takes a share between 0 and 1, got {args.reattribute_evidence}")
    weights = _numbers(parser, args.semantic_weights, "--semantic-weights")
    shares = _numbers(parser, args.passage_shares, "--passage-shares")
    conversations = load_conversations(args.dataset, args.split)
    moved = reattribute_evidence(conversations, args.reattribute_evidence) if args.reattribute_evidence else 0
    table = sweep(conversations, weights, shares, embedder)
    default = (PASSAGE_SHARE, HYBRID_WEIGHTS["semantic"] / RELEVANCE)
    stress = f", {moved} evidence turns given to the other speaker" if moved else ""
    print(f"{args.split} split{stress}: hybrid fusion by best-sentence share and semantic share (keyword the rest), "
          "recall@10 / MRR@10")
    for (share, weight), row in table.items():
        mark = "  <- default" if abs(share - default[0]) < 1e-9 and abs(weight - default[1]) < 1e-9 else ""
        print(f"  passage share {share:.2f}, semantic {weight:.2f}: {row['recall@10']:.3f} / {row['mrr@10']:.3f} "
              f"(n={row['n']}){mark}")
    return table


if __name__ == "__main__":
    main()
