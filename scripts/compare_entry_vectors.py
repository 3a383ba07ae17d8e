"""Compare ways of making a transcript turn's entry vector, by semantic search alone, on one split of a
conversation set: the comparison behind 0.5.0's entry vectors (docs/retrieval-record.md, "0.5.0: the whole turn back in
the vector").

Each turn is embedded as the server embeds it: its whole text and each of its sentences under the turn header
(`entry_texts`), and its context passage (the turn before it with it). Then every question is ranked as the
semantic strategy ranks: the 50 entries nearest by vector, each scored by half its vector's cosine and half its
best passage's cosine (`entry_similarity`, share 0.5). Only the vector and the look's passages differ by scheme:

    sentence-mean          0.4.0: the normalised mean of the sentences (a one-sentence turn: its embedding)
    whole                  the whole turn's embedding
    whole, in the look     the same, the whole turn also one of the look's passages
    whole + sentence-mean  0.5.0: the normalised sum of the two
    the same, in the look  the same, the whole turn also one of the look's passages
    sentence-mean, whole in the look
    the chosen + context passage x0.5 / x1   the context passage's embedding also in the vector (tried after the
                                             choice, on tuning splits: no gain)
    the chosen + next-turn passage           the turn with the turn after it as one more passage of the look
                                             (tried after 0.7.8, on tuning splits: not built)

    python scripts/compare_entry_vectors.py --dataset session_bench/data/conversations_annotated.json --split tuning

It uses the shipped embedder and text functions, so its sentence-mean row with 0.4.0's code and the whole +
sentence-mean row with 0.5.0's reproduce `amfs-server bench retrieval conversations`'s semantic row. Choose on
a tuning split; a test split is for reporting a choice already made.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from amfs_server.adapters.embedders import load_embedder
from amfs_server.core.embedding import context_passage, entry_similarity, entry_texts
from amfs_server.session_bench.conversation_bench import DATASET, load_conversations, score_question, turn_value, turns_of

CANDIDATES = 50  # the semantic strategy's pool
SCHEMES = ("sentence-mean", "whole", "whole, in the look", "whole + sentence-mean", "the same, in the look",
           "sentence-mean, whole in the look", "the chosen + context passage x0.5", "the chosen + context passage x1",
           "the chosen + next-turn passage")


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


def vectors_and_looks(scheme: str, whole: np.ndarray, sentences: np.ndarray, context: np.ndarray,
                      following: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(entry vector, the look's passages) of one turn: `sentences` has one row per sentence (the whole turn's
    embedding for a one-sentence turn), `context` and `following` (the turn with the next one) zero or one row."""
    mean = unit(sentences.mean(axis=0))
    if scheme.startswith("sentence-mean"):
        vector = mean
    elif scheme.startswith("whole,") or scheme == "whole":
        vector = whole
    else:
        vector = unit(whole + mean)
        if scheme.startswith("the chosen + context") and len(context):
            vector = unit(whole + mean + (0.5 if scheme.endswith("x0.5") else 1.0) * context[0])
    in_look = scheme in ("whole, in the look", "the same, in the look", "sentence-mean, whole in the look")
    look = np.vstack([sentences, whole[None]]) if in_look else sentences
    with_next = scheme.endswith("next-turn passage") and following is not None
    return vector, np.vstack([look, context] + ([following] if with_next else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=DATASET)
    parser.add_argument("--split", default="tuning", choices=("tuning", "test", "all"))
    args = parser.parse_args(argv)
    embedder = load_embedder()
    rows: dict[str, list[tuple[str, dict[str, float]]]] = {scheme: [] for scheme in SCHEMES}
    for conversation in load_conversations(args.dataset, args.split):
        cid = conversation["conversation_id"]
        turns = turns_of(conversation)
        keys = [turn["key"] for turn in turns]
        values = [turn_value(turn) for turn in turns]
        texts: list[str] = []
        spans = []  # per turn: (whole row, sentence rows, context rows, next-turn rows)
        for i, (key, value) in enumerate(zip(keys, values)):
            made = entry_texts(cid, key, value)
            context = context_passage(cid, key, values[i - 1], value) if i else None
            # The next turn's context passage seen from this side: this turn, then the one after it, under this key.
            following = context_passage(cid, key, value, values[i + 1]) if i + 1 < len(values) else None
            start = len(texts)
            texts += [made.whole, *made.sentences] + ([context] if context else []) + ([following] if following else [])
            sentence_rows = list(range(start + 1, start + 1 + len(made.sentences))) or [start]
            context_rows = [start + 1 + len(made.sentences)] if context else []
            following_rows = [len(texts) - 1] if following else []
            spans.append((start, sentence_rows, context_rows, following_rows))
        embedded = embedder.embed(texts)
        questions = conversation["questions"]
        asked = embedder.embed([q["question"] for q in questions])
        for scheme in SCHEMES:
            made = [vectors_and_looks(scheme, embedded[w], embedded[s], embedded[c], embedded[f]) for w, s, c, f in spans]
            vectors = np.array([v for v, _ in made])
            for question, query in zip(questions, asked):
                cosines = vectors @ query
                pool = np.argsort(-cosines)[:CANDIDATES]
                scores = {j: entry_similarity(float(cosines[j]), made[j][1], query) for j in pool}
                ranked = [keys[j] for j in sorted(scores, key=lambda j: -scores[j])]
                rows[scheme].append((question["kind"], score_question(ranked, question["evidence"])))
        print(f"{cid}: " + ", ".join(f"{scheme} {np.mean([r['recall@10'] for _, r in rows[scheme][-len(questions):]]):.3f}"
                                      for scheme in SCHEMES), flush=True)
    kinds = sorted({kind for kind, _ in rows[SCHEMES[0]]})
    print(f"\n{args.dataset.name}, {args.split} split, semantic search alone, recall@10 / MRR@10\n")
    print("| entry vector | overall | " + " | ".join(kinds) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in kinds) + " |")
    for scheme, scored in rows.items():
        def cell(subset: list[dict[str, float]]) -> str:
            return f"{np.mean([r['recall@10'] for r in subset]):.3f} / {np.mean([r['mrr@10'] for r in subset]):.3f}"
        print(f"| {scheme} | {cell([r for _, r in scored])} | "
              + " | ".join(cell([r for k, r in scored if k == kind]) for kind in kinds) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
