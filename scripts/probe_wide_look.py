"""Probe: the second look over a wider semantic pool (research; docs/retrieval-record.md, "0.7.19", tried and not
kept).

Semantic search asks the store for the `--wide` turns nearest by the mean vector instead of the pool's 50, scores
all of them by the second look (the best sentence, the context passage: `entry_similarity`) and keeps the best 50
as its pool; everything else is the shipped retrieval. The conversation benchmark is run with that change, in
process, so its rows compare with a plain run of the same command:

    python scripts/probe_wide_look.py --wide 400 -- --dataset session_bench/data/conversations_annotated.json \\
        --split tuning --stores sqlite --rankers fusion,semantic --json wide.json

Tuning splits only (a test split is for reporting a choice already made).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from amfs_server.core import service as service_module


def widen(wide: int) -> None:
    """Make every MemoryService ask for `wide` semantic candidates and keep the pool's size of them."""
    shipped = service_module.MemoryService._semantic_candidates

    async def wider(self: Any, query: str, flt: Any, now: Any, pool_size: int, keep: Any = None) -> Any:
        return (await shipped(self, query, flt, now, max(wide, pool_size), keep))[:pool_size]

    service_module.MemoryService._semantic_candidates = wider  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wide", type=int, default=400, help="semantic candidates given the second look (shipped: 50)")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- then `bench retrieval conversations` options")
    args = parser.parse_args()
    if args.wide < 1:
        parser.error("--wide must be at least 1")
    from amfs_server.session_bench import conversation_bench

    widen(args.wide)
    conversation_bench.main([a for a in args.bench if a != "--"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
