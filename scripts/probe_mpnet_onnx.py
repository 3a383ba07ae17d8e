"""Research script (nothing of it is in the server): a fine-tuned mpnet folder as ONNX files, measured by the
shipped benchmarks. README, Retrieval, "Tried after 0.6.0: a larger model fine-tuned the same way (chat-mpnet)".

    python scripts/probe_mpnet_onnx.py export /tmp/chat-mpnet /tmp/chat-mpnet-onnx            # fp32 + dynamic int8
    python scripts/probe_mpnet_onnx.py export /tmp/chat-mpnet /tmp/chat-mpnet-ffn --fp32-ffn-out  # the FFN output projections kept fp32
    python scripts/probe_mpnet_onnx.py export /tmp/chat-mpnet /tmp/chat-mpnet-ffn --fp32-ffn-out --layers 6,7,8,9
    python scripts/probe_mpnet_onnx.py compare /tmp/chat-mpnet /tmp/chat-mpnet-onnx/model_int8.onnx /tmp/chat-mpnet-ffn/model_int8.onnx
    python scripts/probe_mpnet_onnx.py bench /tmp/chat-mpnet-onnx/model_int8.onnx conversations --split tuning --json X.json
    python scripts/probe_mpnet_onnx.py bench /tmp/chat-mpnet-onnx/model_int8.onnx quality --stores sqlite

`compare FOLDER FILE...` prints, per file, its cosine to the torch model over the first 60 turns of the annotated
tuning split (as the server embeds a turn) and the time to embed a question (p50 / p95 over 200 of its questions,
one thread, each file timed in turn after a warm-up). `bench FILE conversations|quality ARGS` runs `amfs-server bench retrieval conversations|quality ARGS` with that file
as the embedder (questions and turns tokenised by the `tokenizers` library from the folder's tokenizer.json, copied
beside the file; one text per run, as the shipped int8 adapter embeds). It refuses test splits.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
from pathlib import Path

import numpy as np

OPSET = 17


def ffn_output_projections(onnx_path: Path, layers: set[int] | None = None) -> list[str]:
    """The MatMul nodes of the feed-forward output projections (input: the GELU's outliers), in layer order: every
    layer's, or those of `layers` (0-based)."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    found = [node.name for node in graph.node if node.op_type == "MatMul" and "/output/dense/" in node.name]
    if layers is not None and not layers <= set(range(len(found))):
        raise SystemExit(f"layers {sorted(layers)}: the model has layers 0-{len(found) - 1}")
    return [name for layer, name in enumerate(found) if layers is None or layer in layers]


def export(folder: Path, out: Path, fp32_ffn_out: bool = False, layers: set[int] | None = None) -> tuple[Path, Path]:
    """`out`/model.onnx (fp32, inputs input_ids and attention_mask, output last_hidden_state), `out`/model_int8.onnx
    (onnxruntime dynamic int8, per-channel weights; with `fp32_ffn_out` the FFN output projections left fp32, of
    every layer or of `layers`) and
    the folder's tokenizer.json."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel, AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
    sample = tokenizer(["How many times do we retry?", "Alice: I adopted a greyhound last weekend, her name is Juniper."],
                       padding=True, return_tensors="pt")

    class Encoder(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    fp32, int8 = out / "model.onnx", out / "model_int8.onnx"
    with torch.inference_mode():
        torch.onnx.export(Encoder(model), (sample["input_ids"], sample["attention_mask"]), str(fp32),
                          input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                          dynamic_axes={name: {0: "batch", 1: "sequence"}
                                        for name in ("input_ids", "attention_mask", "last_hidden_state")},
                          opset_version=OPSET, do_constant_folding=True, dynamo=False)
    keep = ffn_output_projections(fp32, layers) if fp32_ffn_out else []
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8, per_channel=True, nodes_to_exclude=keep)
    shutil.copy(folder / "tokenizer.json", out / "tokenizer.json")
    return fp32, int8


class OnnxFileEmbedder:
    """An exported file (`export`) as a benchmark's embedder: mean pooling, L2 norm, one text per run."""

    def __init__(self, path: Path, max_length: int = 256) -> None:
        self.path = Path(path)
        self.name = f"probe-onnx:{self.path.parent.name}/{self.path.name}"
        self.max_length = max_length
        self._lock = threading.Lock()
        self._session = None
        self.dimension = 0

    def check_available(self) -> None:
        if not self.path.is_file() or not (self.path.parent / "tokenizer.json").is_file():
            raise SystemExit(f"{self.path}: no such file, or no tokenizer.json beside it (run export first)")

    def load(self) -> "OnnxFileEmbedder":
        with self._lock:
            if self._session is None:
                import onnxruntime as ort
                from tokenizers import Tokenizer

                from amfs_server.adapters.onnx_embedder import cpu_session_options

                self.check_available()
                self._tokenizer = Tokenizer.from_file(str(self.path.parent / "tokenizer.json"))
                self._tokenizer.no_padding()
                self._tokenizer.enable_truncation(self.max_length)
                self._session = ort.InferenceSession(str(self.path), sess_options=cpu_session_options(1),
                                                     providers=["CPUExecutionProvider"])
                self.dimension = int(self._session.get_outputs()[0].shape[-1])
        return self

    def embed(self, texts) -> np.ndarray:
        self.load()
        rows = []
        for text in texts:
            ids = np.array([self._tokenizer.encode(text).ids], dtype=np.int64)
            hidden = self._session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
            vector = hidden.mean(axis=1)[0]
            rows.append(vector / max(float(np.linalg.norm(vector)), 1e-12))
        return np.stack(rows).astype(np.float32) if rows else np.zeros((0, self.dimension), np.float32)


def torch_vectors(folder: Path, texts: list[str]) -> np.ndarray:
    """The fine-tuned folder's own unit vectors for `texts` (transformers, fp32, one text at a time, mean pooling)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
    rows = []
    with torch.inference_mode():
        for text in texts:
            vector = model(**tokenizer([text], truncation=True, max_length=256, return_tensors="pt")).last_hidden_state
            vector = vector.mean(1)[0].numpy()
            rows.append(vector / np.linalg.norm(vector))
    return np.stack(rows)


def compare(folder: Path, files: list[Path], turns: int = 60, questions: int = 200) -> list[str]:
    """Per ONNX file: min / mean cosine to the fine-tuned torch model over annotated tuning turns, and p50 / p95
    milliseconds to embed one question."""
    import json
    import time

    from amfs_server.core.embedding import TURN_HEADER, embedding_text

    data = Path(__file__).resolve().parents[1] / "session_bench" / "data" / "conversations_annotated.json"
    tuning = [c for c in json.loads(data.read_text())["conversations"] if c["split"] == "tuning"]
    texts = [embedding_text(TURN_HEADER, "", f"{t['speaker']}: {t['text']}")
             for c in tuning for session in c["sessions"] for t in session["turns"]][:turns]
    asked = [q["question"] for c in tuning for q in c["questions"]][:questions]
    reference = torch_vectors(folder, texts)
    lines = []
    for path in files:
        embedder = OnnxFileEmbedder(path)
        cosine = (embedder.embed(texts) * reference).sum(axis=1)
        embedder.embed(asked[:5])  # warm-up
        times = []
        for question in asked:
            started = time.perf_counter()
            embedder.embed([question])
            times.append((time.perf_counter() - started) * 1000)
        times.sort()
        lines.append(f"{path}: {path.stat().st_size / 1e6:.0f} MB; cosine to torch over {len(texts)} turns min "
                     f"{cosine.min():.3f} mean {cosine.mean():.3f}; a question {np.percentile(times, 50):.1f} ms p50, "
                     f"{np.percentile(times, 95):.1f} ms p95 ({len(times)} questions, one thread)")
    return lines


def bench(path: Path, which: str, args: list[str]) -> None:
    if which not in ("conversations", "quality"):
        raise SystemExit(f"bench runs 'conversations' or 'quality', not {which!r}")
    if "test" in args or "all" in args:
        raise SystemExit("refusing a test split: this script is for tuning-split measurements")
    import amfs_server.session_bench.conversation_bench as conversations
    import amfs_server.session_bench.retrieval_bench as quality

    embedder = OnnxFileEmbedder(path).load()
    module = conversations if which == "conversations" else quality
    module.embedder_option = lambda parser, spec: embedder  # the benchmark's own --embedder lookup, bypassed
    module.main((["quality"] if which == "quality" else []) + args + ["--embedder", str(path)])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"] and len(argv) >= 3:
        bench(Path(argv[1]), argv[2], argv[3:])
        return 0
    if argv[:1] == ["compare"] and len(argv) >= 3:
        print("\n".join(compare(Path(argv[1]), [Path(f) for f in argv[2:]])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("export",))
    parser.add_argument("folder", type=Path, help="a folder scripts/finetune_embedder.py --base mpnet wrote")
    parser.add_argument("out", type=Path)
    parser.add_argument("--fp32-ffn-out", action="store_true",
                        help="leave every layer's feed-forward output projection unquantised")
    parser.add_argument("--layers", default=None, metavar="N,N,...",
                        help="with --fp32-ffn-out: only these layers' (0-based; default every layer)")
    args = parser.parse_args(argv)
    if args.layers is not None and not args.fp32_ffn_out:
        parser.error("--layers goes with --fp32-ffn-out")
    try:
        layers = None if args.layers is None else {int(n) for n in args.layers.split(",")}
    except ValueError:
        parser.error(f"--layers {args.layers!r}: comma-separated layer numbers, e.g. 6,7,8,9")
    if not (args.folder / "config.json").is_file():
        parser.error(f"{args.folder}: not a model folder (no config.json)")
    for path in export(args.folder, args.out, args.fp32_ffn_out, layers):
        print(f"{path}: {path.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
