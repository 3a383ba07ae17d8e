"""Probe: does a small cross-encoder, re-ranking the shipped fusion's top 20, pay? (research; docs/retrieval-record.md)

Trains all-MiniLM-L6-v2's first `--layers` layers with a scoring head on (question, turn) pairs read together:
each evidence turn against NEGATIVES non-evidence turns drawn from the fusion's own top 20 for that question
(listwise softmax). Then re-ranks the fused top 20 of the evaluation splits by
`(1 - a) x z(fused score) + a x z(cross-encoder score)` for several `a`, and prints recall@10 / MRR@10 per `a`
(a = 0 is the shipped fusion). The fusion's candidates come from `fusion_lab.dump_conversations`, the shipped
retrieval itself.

    python scripts/probe_cross_encoder.py \\
        --train session_bench/data/conversations_authored.json:tuning \\
        --train session_bench/data/conversations_authored_train.json:train \\
        --train session_bench/data/conversations_annotated_train.json:train \\
        --eval session_bench/data/conversations_annotated.json:tuning \\
        --eval session_bench/data/conversations_eval.json:tuning

Refuses test splits on either side: nothing chosen here may have seen them. About 20 minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import finetune_embedder  # noqa: E402  (sibling scripts)
import fusion_lab  # noqa: E402

TOP = 20  # the fused candidates re-ranked
NEGATIVES = 7  # per evidence turn, from the fused top 20
GROUPS_PER_BATCH = 8
MAX_TOKENS = 112
LEARNING_RATE, HEAD_LEARNING_RATE = 5e-5, 1e-3
MIXES = (0.0, 0.25, 0.5, 0.75, 1.0)


def split_spec(spec: str) -> tuple[Path, str]:
    path, _, split = spec.partition(":")
    if split in ("test", "all") or not split:
        raise SystemExit(f"{spec}: name a tuning or train split (FILE:tuning, FILE:train); test splits are refused")
    return Path(path), split


def candidates(spec: str) -> list[dict]:
    """The fusion's top TOP for every question of FILE:split, with the question's text and every turn's text as the
    server embeds it (the fine-tune's `load_pairs`, which also refuses a test split)."""
    from amfs_server.core.retrieval import fuse_hybrid

    path, split = split_spec(spec)
    conversations = finetune_embedder.load_pairs([spec])
    # The benchmark's loader knows tuning / test / all; a training file is all "train", so it is dumped whole.
    rows = asyncio.run(fusion_lab.dump_conversations(path, split if split == "tuning" else "all", 0.0))
    rows = [row for row in rows if row["conversation"] in {c["id"] for c in conversations}]
    texts = {c["id"] + "/" + key: text for c in conversations for key, text in c["turns"].items()}
    questions = [q["q"] for c in conversations for q in c["questions"]]
    assert len(questions) == len(rows), "the dump follows the file's order"
    for row, question in zip(rows, questions):
        fused = fuse_hybrid(row["rankings"], row["weights"])
        row.update(question=question, keys=[k for k, _, _ in fused[:TOP]], fused=[s for _, s, _ in fused[:TOP]],
                   tail=[k for k, _, _ in fused[TOP:]], texts=texts)
    return rows


def mixed_order(row: dict, scores: np.ndarray, mix: float) -> list[str]:
    """The fused top TOP re-ordered by (1 - mix) x z(fused) + mix x z(scores), then the fused rest unchanged."""
    def z(values) -> np.ndarray:
        values = np.asarray(values, dtype=float)
        return (values - values.mean()) / (values.std() + 1e-9)

    combined = (1 - mix) * z(row["fused"]) + mix * z(scores)
    return [row["keys"][i] for i in np.argsort(-combined, kind="stable")] + row["tail"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", action="append", required=True, metavar="FILE:split")
    parser.add_argument("--eval", action="append", required=True, metavar="FILE:split")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for spec in [*args.train, *args.eval]:
        split_spec(spec)  # refuse before anything runs

    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from amfs_server.adapters.torch_embedder import MiniLMEmbedder

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    base = str(MiniLMEmbedder().model_dir())
    config = AutoConfig.from_pretrained(base, local_files_only=True)
    config.num_hidden_layers = args.layers  # the first layers' weights; the rest are not loaded
    encoder = AutoModel.from_pretrained(base, config=config, local_files_only=True)
    head = torch.nn.Linear(config.hidden_size, 1)
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)

    def score(questions: list[str], turns: list[str]):
        enc = tokenizer(questions, turns, padding=True, truncation="only_second", max_length=MAX_TOKENS,
                        return_tensors="pt")
        hidden = encoder(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return head((hidden * mask).sum(1) / mask.sum(1)).squeeze(-1)  # mean pooling, as the base was trained

    groups = []
    for spec in args.train:
        for row in candidates(spec):
            gold = set(row["gold"])
            negatives = [row["texts"][k] for k in row["keys"] if k not in gold]
            groups += [(row["question"], row["texts"][k], negatives) for k in row["gold"] if len(negatives) >= NEGATIVES]
    optimiser = torch.optim.AdamW([{"params": encoder.parameters(), "lr": LEARNING_RATE},
                                   {"params": head.parameters(), "lr": HEAD_LEARNING_RATE}], weight_decay=0.01)
    steps = args.epochs * (len(groups) // GROUPS_PER_BATCH)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, 1 - s / max(1, steps)))
    print(f"{len(groups)} training groups, {steps} steps", file=sys.stderr, flush=True)
    started, step = time.time(), 0
    for _ in range(args.epochs):
        rng.shuffle(groups)
        for start in range(0, len(groups) - GROUPS_PER_BATCH + 1, GROUPS_PER_BATCH):
            questions, turns = [], []
            for question, positive, negatives in groups[start:start + GROUPS_PER_BATCH]:
                for turn in [positive, *rng.sample(negatives, NEGATIVES)]:
                    questions.append(question)
                    turns.append(turn)
            logits = score(questions, turns).view(GROUPS_PER_BATCH, NEGATIVES + 1)
            loss = torch.nn.functional.cross_entropy(logits, torch.zeros(GROUPS_PER_BATCH, dtype=torch.long))
            loss.backward()
            optimiser.step()
            schedule.step()
            optimiser.zero_grad()
            step += 1
            if step % 50 == 0:
                print(f"step {step}/{steps} loss {loss.item():.3f} ({time.time() - started:.0f} s)", file=sys.stderr,
                      flush=True)

    print("| split | " + " | ".join(f"a = {mix}" for mix in MIXES) + " |")
    for spec in args.eval:
        rows = candidates(spec)
        with torch.inference_mode():
            scores = [score([row["question"]] * len(row["keys"]), [row["texts"][k] for k in row["keys"]]).numpy()
                      for row in rows]
        cells = []
        for mix in MIXES:
            results = [fusion_lab.score(mixed_order(row, s, mix), row["gold"]) for row, s in zip(rows, scores)]
            cells.append(f"{np.mean([r['recall@10'] for r in results]):.3f} / "
                         f"{np.mean([r['mrr'] for r in results]):.3f}")
        print(f"| {spec} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
