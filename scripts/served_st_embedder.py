"""A sentence-transformers model (e.g. EmbeddingGemma-300M) as the server's embedder, scored in the served pipeline
(SQLite, in process) on tuning conversations: the turns written with the shipped `write_conversation`, the questions
asked with the shipped `retrieve`, the fusion as configured and semantic search alone, beside the shipped default
on the same conversations. The model's `document` prompt goes before every text written, its `query` prompt before
every question (the embedder port's `embed` and `embed_query`). Research: the model on torch in float, as it ships;
the server's own EmbeddingGemma is the int8 export (`AMFS_EMBEDDER=embeddinggemma`, docs/retrieval-record.md).

    python scripts/served_st_embedder.py --st-dir DIR --conversations ann-01,ann-02

Refuses conversations outside the tuning split.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import numpy as np

from amfs_server.session_bench import alone
from amfs_server.session_bench.conversation_bench import (FUSION, load_conversations, mean_scores, run_in_process,
                                                          service_ranker)

ANNOTATED = Path(__file__).resolve().parent.parent / "session_bench" / "data" / "conversations_annotated.json"


class PromptedEmbedder:
    """The Embedder port over a sentence-transformers model: stored texts after its `document` prompt, questions
    after its `query` prompt."""

    def __init__(self, model_dir: Path):
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(1)  # two threads fight over these two shared cores (README)
        self.model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
        self.name = f"st:{model_dir.name}"
        self.dimension = self.model.get_sentence_embedding_dimension()

    def check_available(self) -> None:
        pass

    def load(self) -> None:
        pass

    def embed(self, texts) -> np.ndarray:
        return self._encode("document", texts)

    def embed_query(self, texts) -> np.ndarray:
        return self._encode("query", texts)

    def _encode(self, kind: str, texts) -> np.ndarray:
        if not len(texts):
            return np.zeros((0, self.dimension), dtype=np.float32)
        prompt = self.model.prompts.get(kind, "")
        return self.model.encode([prompt + text for text in texts], normalize_embeddings=True,
                                 batch_size=32).astype(np.float32)


def score(embedder, conversations: list[dict]) -> dict[str, dict[str, float]]:
    """The shipped in-process benchmark run (`run_in_process`, SQLite): the fusion as configured and semantic alone."""
    selected = {FUSION: service_ranker(None), "semantic alone": service_ranker(alone("semantic"))}
    rows = asyncio.run(run_in_process(conversations, "sqlite", embedder=embedder, selected=selected))
    return {name: mean_scores(got) for name, got in rows.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--st-dir", type=Path, required=True, help="a sentence-transformers model folder")
    parser.add_argument("--dataset", type=Path, default=ANNOTATED)
    parser.add_argument("--conversations", required=True, help="comma-separated conversation ids (tuning split)")
    args = parser.parse_args(argv)
    wanted = args.conversations.split(",")
    tuning = {c["conversation_id"]: c for c in load_conversations(args.dataset, "tuning")}
    outside = [cid for cid in wanted if cid not in tuning]
    if outside:
        parser.error(f"not in the tuning split of {args.dataset.name}: {', '.join(outside)}")
    if not (args.st_dir / "modules.json").is_file():
        parser.error(f"--st-dir {args.st_dir}: no sentence-transformers model folder (modules.json) there")
    from amfs_server.adapters.embedders import load_embedder

    conversations = [tuning[cid] for cid in wanted]
    shipped = load_embedder()
    for label, embedder in ((shipped.name, shipped), (args.st_dir.name, PromptedEmbedder(args.st_dir))):
        for name, means in score(embedder, conversations).items():
            print(f"{label}, {name}: recall@10 {means['recall@10']:.3f} / MRR@10 {means['mrr@10']:.3f} "
                  f"({', '.join(wanted)})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
