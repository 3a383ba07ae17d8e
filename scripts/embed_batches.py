"""Would batching make bulk ingest faster with the default embedder, and would a text's vector stay its own?

The int8 embedders run one text at a time (`OnnxEmbedder.batch_size` 1): with dynamic int8 a vector depended on
its batchmates. This embeds a conversation's turns one at a time and in batches of each size asked for, and prints,
per batch size, the lowest cosine between a turn's vector alone and in a batch, the largest change of any
component, the same against a second batching of the same turns in another order and another size (does a vector
depend on its batchmates, or only on being batched?), and milliseconds per text (best of `--repeats` passes).

    python scripts/embed_batches.py --sizes 8,32 --turns 64
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from amfs_server.adapters.onnx_embedder import OnnxEmbedder
from amfs_server.session_bench.conversation_bench import DATASET, load_conversations, turn_value, turns_of


def per_text_ms(embedder: OnnxEmbedder, texts: list[str], repeats: int) -> float:
    embedder.embed(texts[: embedder.batch_size])  # loads the session and warms it
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        embedder.embed(texts)
        best = min(best, time.perf_counter() - started)
    return best / len(texts) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="chat-mpnet-int8", help="an OnnxEmbedder variant (default: the default's)")
    parser.add_argument("--sizes", default="8,32", help="comma-separated batch sizes to compare with one at a time")
    parser.add_argument("--turns", type=int, default=64, help="turns of the generated set's first conversation")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    if args.turns < 2 or any(size < 2 for size in sizes) or args.repeats < 1:
        parser.error("--turns and every --sizes must be >= 2, --repeats >= 1")

    conversation = load_conversations(DATASET, "all")[0]
    texts = [turn_value(turn) for turn in turns_of(conversation)][: args.turns]
    alone_embedder = OnnxEmbedder(variant=args.variant, batch_size=1)
    alone = alone_embedder.embed(texts)
    print(f"{len(texts)} turns, {args.variant}; one at a time: {per_text_ms(alone_embedder, texts, args.repeats):.1f} ms/text")
    print("| batch size | lowest cosine to alone | largest component change | largest change against another batching | ms/text |")
    print("| --- | --- | --- | --- | --- |")
    order = list(range(len(texts)))
    random.Random(0).shuffle(order)
    for size in sizes:
        embedder = OnnxEmbedder(variant=args.variant, batch_size=size)
        batched = embedder.embed(texts)
        other = OnnxEmbedder(variant=args.variant, batch_size=max(2, size - 3)).embed([texts[i] for i in order])
        regrouped = np.empty_like(other)
        regrouped[order] = other
        cosine = float(np.min(np.sum(alone * batched, axis=1)))
        print(f"| {size} | {cosine:.6f} | {float(np.max(np.abs(alone - batched))):.5f} | "
              f"{float(np.max(np.abs(batched - regrouped))):.5f} | {per_text_ms(embedder, texts, args.repeats):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
