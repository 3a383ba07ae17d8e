"""Probe: does mixing a second bundled embedder's semantic score into chat-mpnet's pay? (research;
docs/retrieval-record.md, "After 0.7.8")

Each turn of a conversation split is embedded as the server embeds it (`entry_texts`: its vector is the normalised
sum of its whole text's embedding and its sentences' mean; the second look's passages are its sentences and its
context passage) by chat-mpnet and by chat-MiniLM-L6. Every turn is scored for every question by
`entry_similarity` (half the vector's cosine, half the best passage's) under each embedder, and the two scores are
mixed, `(1 - s) x chat-mpnet + s x chat-MiniLM-L6`, for several shares `s`; recall@10 / MRR@10 of semantic search
alone are printed per share (s = 0 is chat-mpnet alone). Every turn of the conversation is scored, not only the
50 nearest, so s = 0 differs slightly from the benchmark's semantic row.

    python scripts/probe_embedder_mix.py session_bench/data/conversations_annotated.json \\
        session_bench/data/conversations_eval.json

Tuning splits only (a test split is for reporting a choice already made). About 6 minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from amfs_server.adapters.embedders import load_embedder
from amfs_server.core.embedding import context_passage, entry_similarity, entry_texts
from amfs_server.session_bench.conversation_bench import load_conversations, score_question, turn_value, turns_of

SHARES = (0.0, 0.2, 0.3, 0.4, 0.5)  # chat-MiniLM-L6's share of the mixed score
EMBEDDERS = ("chat-mpnet", "chat-minilm")


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


def turn_scores(embedder, conversation: dict) -> np.ndarray:
    """Question x turn matrix of the semantic strategy's score under one embedder."""
    cid = conversation["conversation_id"]
    turns = turns_of(conversation)
    values = [turn_value(turn) for turn in turns]
    texts: list[str] = []
    spans = []  # per turn: (whole row, sentence rows, context rows)
    for i, (turn, value) in enumerate(zip(turns, values)):
        made = entry_texts(cid, turn["key"], value)
        context = context_passage(cid, turn["key"], values[i - 1], value) if i else None
        start = len(texts)
        texts += [made.whole, *made.sentences] + ([context] if context else [])
        sentence_rows = list(range(start + 1, start + 1 + len(made.sentences))) or [start]
        spans.append((start, sentence_rows, [start + 1 + len(made.sentences)] if context else []))
    embedded = embedder.embed(texts)
    asked = embedder.embed([question["question"] for question in conversation["questions"]])
    vectors = np.array([unit(embedded[w] + unit(embedded[s].mean(axis=0))) for w, s, _ in spans])
    looks = [np.vstack([embedded[s], embedded[c]]) for _, s, c in spans]
    return np.array([[entry_similarity(float(cosine), looks[j], query) for j, cosine in enumerate(vectors @ query)]
                     for query in asked])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("datasets", type=Path, nargs="+", help="conversation sets; their tuning split is scored")
    args = parser.parse_args(argv)
    embedders = {name: load_embedder(name) for name in EMBEDDERS}
    for dataset in args.datasets:
        rows: dict[float, list[dict[str, float]]] = {share: [] for share in SHARES}
        for conversation in load_conversations(dataset, "tuning"):
            keys = [turn["key"] for turn in turns_of(conversation)]
            scores = {name: turn_scores(embedder, conversation) for name, embedder in embedders.items()}
            for share in SHARES:
                mixed = (1 - share) * scores["chat-mpnet"] + share * scores["chat-minilm"]
                for question, row in zip(conversation["questions"], mixed):
                    ranked = [keys[j] for j in np.argsort(-row, kind="stable")[:10]]
                    rows[share].append(score_question(ranked, question["evidence"]))
            print(f"{conversation['conversation_id']} done", flush=True)
        print(f"\n{dataset.name}, tuning split, semantic search alone, recall@10 / MRR@10")
        for share, scored in rows.items():
            print(f"  chat-MiniLM-L6 share {share:.1f}: {np.mean([r['recall@10'] for r in scored]):.3f} / "
                  f"{np.mean([r['mrr@10'] for r in scored]):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
