"""Research script (nothing of it is in the server): the quantisations of a fine-tuned mpnet folder that were tried
before the shipped one, and how close any ONNX file comes to the torch model. docs/retrieval-record.md, "chat-mpnet, the default
since 0.7.0".

    python scripts/probe_mpnet_onnx.py export /tmp/chat-mpnet /tmp/chat-mpnet-dyn            # dynamic int8
    python scripts/probe_mpnet_onnx.py export /tmp/chat-mpnet /tmp/chat-mpnet-ffn --fp32-ffn-out  # the FFN output projections kept fp32
    python scripts/probe_mpnet_onnx.py export /tmp/chat-mpnet /tmp/chat-mpnet-ffn --fp32-ffn-out --layers 6,7,8,9
    python scripts/probe_mpnet_onnx.py compare /tmp/chat-mpnet /tmp/chat-mpnet-dyn/model_dynamic_int8.onnx /tmp/chat-mpnet-onnx/model_int8.onnx

`export` writes what `scripts/export_embedder_onnx.py` writes (the fp32 file and the shipped 8-bit block-wise one)
and beside it `model_dynamic_int8.onnx`: onnxruntime's dynamic int8 (per-channel weights, one activation scale per
tensor), the way the MiniLM default is made, optionally with feed-forward output projections left fp32.
`compare FOLDER FILE...` prints, per file, its cosine to the torch model over the first 60 turns of the annotated
tuning split (as the server embeds a turn) and the time to embed a question (p50 / p95 over 200 of its questions,
one thread, each file timed in turn after a warm-up), each file run by the server's ONNX adapter. Any file is
scored by the shipped benchmarks as `--embedder FILE` (tuning splits only for research).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np


def ffn_output_projections(onnx_path: Path, layers: set[int] | None = None) -> list[str]:
    """The MatMul nodes of the feed-forward output projections (input: the GELU's outliers), in layer order: every
    layer's, or those of `layers` (0-based)."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    found = [node.name for node in graph.node if node.op_type == "MatMul" and "/output/dense/" in node.name]
    if layers is not None and not layers <= set(range(len(found))):
        raise SystemExit(f"layers {sorted(layers)}: the model has layers 0-{len(found) - 1}")
    return [name for layer, name in enumerate(found) if layers is None or layer in layers]


def _shipped_exporter():
    spec = importlib.util.spec_from_file_location("export_embedder_onnx", Path(__file__).with_name("export_embedder_onnx.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def export(folder: Path, out: Path, fp32_ffn_out: bool = False, layers: set[int] | None = None) -> tuple[Path, Path]:
    """`out`/model.onnx (fp32) and the shipped `out`/model_int8.onnx (scripts/export_embedder_onnx.py), then
    `out`/model_dynamic_int8.onnx (onnxruntime dynamic int8, per-channel weights; with `fp32_ffn_out` the FFN output
    projections left fp32, of every layer or of `layers`). Returns the fp32 and the dynamic int8 file."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32, _ = _shipped_exporter().export(folder, out)
    dynamic = out / "model_dynamic_int8.onnx"
    keep = ffn_output_projections(fp32, layers) if fp32_ffn_out else []
    quantize_dynamic(str(fp32), str(dynamic), weight_type=QuantType.QInt8, per_channel=True, nodes_to_exclude=keep)
    return fp32, dynamic


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
    from amfs_server.adapters.onnx_embedder import OnnxEmbedder

    for path in files:
        embedder = OnnxEmbedder.for_file(path)
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
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
    print(f"{args.out / 'model_int8.onnx'}: the shipped quantisation")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
