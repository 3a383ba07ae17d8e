"""Where the default retrieval misses: every evidence turn the fused top 10 lacks, by where semantic search alone
and keyword search alone rank it (top 10, 11-25, below 25), per question kind; with `--examples N`, N of the
misses that neither strategy has in its top 25, question and turn side by side.

    python scripts/where_retrieval_misses.py --dataset session_bench/data/conversations_annotated.json --examples 10

Each conversation is written into a fresh SQLite store by the benchmark's own loop (`run_in_process`), then every
question is asked three times: fused (limit 10), semantic alone and keyword alone (limit 25).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
from pathlib import Path

from amfs_server.core.models import Actor
from amfs_server.session_bench import alone
from amfs_server.session_bench.conversation_bench import DATASET, load_conversations, run_in_process, turn_value, turns_of


def band(ranked: list[str], key: str) -> str:
    rank = ranked.index(key) + 1 if key in ranked else None
    return "top 10" if rank is not None and rank <= 10 else "11-25" if rank is not None else "below 25"


async def misses(dataset: Path, split: str) -> tuple[int, list[tuple[str, str, str, str, str]]]:
    """(evidence turns, [(kind, semantic band, keyword band, question, turn) for each one the fusion misses])."""
    missed: list[tuple[str, str, str, str, str]] = []

    async def fused_noting_misses(service, conversation, questions):  # a ranker of `run_in_process`
        reader = Actor("bench/misses", conversation["conversation_id"])
        texts = {turn["key"]: turn_value(turn) for turn in turns_of(conversation)}

        async def ranked(question: dict, limit: int, weights: dict[str, float] | None = None) -> list[str]:
            hits = await service.retrieve(reader, question["question"], entity_path=conversation["conversation_id"],
                                          limit=limit, weights=weights, count_as_read=False)
            return [hit.entry.key for hit in hits]

        out = []
        for question in questions:
            fused = await ranked(question, 10)
            semantic, keyword = await ranked(question, 25, alone("semantic")), await ranked(question, 25, alone("keyword"))
            missed.extend((question["kind"], band(semantic, key), band(keyword, key), question["question"], texts[key])
                          for key in question["evidence"] if key not in fused)
            out.append(fused)
        return out

    conversations = load_conversations(dataset, split)
    await run_in_process(conversations, "sqlite", selected={"fusion": fused_noting_misses})
    total = sum(len(q["evidence"]) for conversation in conversations for q in conversation["questions"])
    return total, missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=DATASET)
    parser.add_argument("--split", default="tuning", choices=("tuning", "test", "all"))
    parser.add_argument("--examples", type=int, default=0, help="print this many deep misses (seeded sample)")
    args = parser.parse_args(argv)
    total, missed = asyncio.run(misses(args.dataset, args.split))
    print(f"{args.dataset.name}, {args.split} split: {len(missed)} of {total} evidence turns not in the fused top 10\n")
    print("| semantic alone | keyword alone | missed | " + " | ".join(sorted({m[0] for m in missed})) + " |")
    kinds = sorted({m[0] for m in missed})
    print("| --- | --- | --- | " + " | ".join("---" for _ in kinds) + " |")
    cells = collections.Counter((m[1], m[2]) for m in missed)
    by_kind = collections.Counter((m[1], m[2], m[0]) for m in missed)
    for (semantic, keyword), count in sorted(cells.items(), key=lambda item: -item[1]):
        print(f"| {semantic} | {keyword} | {count} | " + " | ".join(str(by_kind[semantic, keyword, k]) for k in kinds) + " |")
    deep = [m for m in missed if m[1] == m[2] == "below 25"]
    for kind, _, _, question, turn in random.Random(1).sample(deep, min(args.examples, len(deep))):
        print(f"\n{kind}: {question}\n    evidence: {turn[:160]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
