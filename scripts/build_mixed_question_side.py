"""Build chat-mpnet's mixed question side: the same model, every MatMul on onnxruntime's dynamic 8-bit kernels.

Why: on a 2-core CPU without AVX-512 VNNI, chat-mpnet's 8-bit block MatMuls (onnxruntime's MatMulNBits with int8
compute) take most of the 50 ms a retrieve may take. onnxruntime's dynamic 8-bit MatMul (DynamicQuantizeMatMul:
per-column weights, the activations quantised per call with one scale) runs about twice as fast there. Its one
activation scale is the catch: each feed-forward MatMul's input holds a few channels whose values on the first and
last tokens are 10-100 times the rest (all 72 MatMuls moved as they are gave question vectors at median cosine 0.91
to the model's own). So in those 24 MatMuls the 16 input channels with the largest magnitude are masked out of the
8-bit product and multiplied in float beside it (outlier decomposition); the attention's projections need none.

0.7.16's side moved only the 48 attention projections and shipped their requantised weights. Since 0.7.18 the graph
ships no weight of its own: the derived ones (8-bit columns, scales, zero points, masks, float outlier rows) are
declared as external data at `requantize.REQUANTIZED` and computed at load from chat-mpnet's file by the recipe
written beside the graph (`requantize.json`: where each MatMul's blocks and scales lie, which channels are in
float); every other weight points into chat-mpnet's file (`SHARED_WEIGHTS`), as for the fast question side.

Stored vectors do not change: only questions are embedded by this graph, and only where AMFS_QUERY_ENCODER says
so (`mixed`, or `auto`, the default, on a CPU without VNNI; README, "On a CPU without VNNI").

    python scripts/build_mixed_question_side.py --calibrate --out /tmp/mixed   # channels chosen again
    python scripts/build_mixed_question_side.py --out /tmp/mixed               # channels from the bundled recipe
    cp /tmp/mixed/* adapters/models/chat-mpnet-mixed/
    python scripts/build_mixed_question_side.py --fit     # cosine of its question vectors to chat-mpnet's own
    python scripts/build_mixed_question_side.py --speed   # both sides timed, alternated question by question

The channels come from onnxruntime's activations, which differ slightly between CPUs, so `--calibrate` may pick
another channel or two elsewhere; `--out` alone rebuilds the bundled files byte for byte. Needs onnx (the `[gemma]`
extra, or `pip install onnx`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
from pathlib import Path

import numpy as np

from amfs_server.adapters.requantize import RECIPE, REQUANTIZED, dequantize_blocks, matmul_tensors, tensor_names

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "adapters/models/chat-mpnet-mixed"
# chat-mpnet's 72 MatMuls: the attention's four projections and the feed-forward pair, per layer
MATMUL = re.compile(r"^/inner/encoder/layer\.\d+/(attention/attn/[qkvo]|intermediate/dense|output/dense)/MatMul_Q8$")
FEED_FORWARD = re.compile(r"/(intermediate|output)/dense/")
OUTLIER_CHANNELS = 16  # per feed-forward MatMul; 32 fitted chat-mpnet's vectors no closer (record, 0.7.18)
CALIBRATION_QUESTIONS = 400


def _matmuls(model):
    from onnx import helper

    found = [node for node in model.graph.node if node.op_type == "MatMulNBits" and MATMUL.match(node.name)]
    if len(found) != 72:
        raise ValueError(f"expected chat-mpnet's 72 MatMuls, found {len(found)}")
    for node in found:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attributes.get("bits") != 8 or attributes.get("block_size") != 128 or len(node.input) != 3:
            raise ValueError(f"{node.name}: expected 8-bit blocks of 128 without zero points or bias")
    return found


def calibration_questions() -> list[str]:
    """400 questions of the training conversations (never a tuning or test split), drawn with seed 0."""
    texts = []
    for name in ("conversations_annotated_train.json", "conversations_authored_train.json"):
        chats = json.loads((ROOT / "session_bench/data" / name).read_text())
        texts += [q["question"] for c in chats["conversations"] if c["split"] == "train" for q in c["questions"]]
    picked = np.random.default_rng(0).choice(len(texts), CALIBRATION_QUESTIONS, replace=False)
    return [texts[i] for i in picked]


def calibrate(model_bytes: bytes) -> dict[str, list[int]]:
    """Per feed-forward MatMul (by node name), the OUTLIER_CHANNELS input channels with the largest magnitude over
    the calibration questions, run one at a time through chat-mpnet itself."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from amfs_server.adapters.onnx_embedder import VARIANTS, cpu_session_options
    from amfs_server.adapters.wordpiece import WordPieceTokenizer

    model = onnx.load_from_string(model_bytes)
    feed_forward = [node for node in _matmuls(model) if FEED_FORWARD.search(node.name)]
    inputs = sorted({node.input[0] for node in feed_forward})
    for name in inputs:
        model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), sess_options=cpu_session_options(2))
    tokenizer = WordPieceTokenizer.from_file(VARIANTS["chat-mpnet-int8"].tokenizer)
    outputs = [o.name for o in session.get_outputs()]
    largest: dict[str, np.ndarray] = {}
    for text in calibration_questions():
        ids = np.array([tokenizer.encode(text, 256)], dtype=np.int64)
        for name, value in zip(outputs, session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})):
            if name in inputs:
                magnitude = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
                largest[name] = np.maximum(largest[name], magnitude) if name in largest else magnitude
    return {node.name: sorted(int(c) for c in np.argsort(largest[node.input[0]])[-OUTLIER_CHANNELS:])
            for node in feed_forward}


def build(model_bytes: bytes, out: Path, outliers: dict[str, list[int]]) -> tuple[Path, Path]:
    """The mixed graph and its recipe from chat-mpnet's inflated ONNX bytes and the float channels per feed-forward
    MatMul; returns the gzip-compressed graph and the recipe written in `out`."""
    import onnx
    from onnx import helper, numpy_helper

    from amfs_server.adapters.onnx_embedder import point_into_shared_weights

    model = onnx.load_from_string(model_bytes)
    initializers = {t.name: t for t in model.graph.initializer}
    matmuls = {node.name: node for node in _matmuls(model)}
    if set(outliers) != {name for name in matmuls if FEED_FORWARD.search(name)}:
        raise ValueError("the float channels must name every feed-forward MatMul, and only those")
    nodes, declared, recipe = [], [], []
    for node in model.graph.node:
        if node.name not in matmuls:
            nodes.append(node)
            continue
        blocks, scales = initializers[node.input[1]], initializers[node.input[2]]
        n, k = int(blocks.dims[0]), int(helper.get_attribute_value(next(a for a in node.attribute if a.name == "K")))
        stem, channels = node.input[1].removesuffix("_Q8"), outliers.get(node.name, [])
        recipe.append({"node": node.name, "stem": stem, "n": n, "k": k, "outliers": channels,
                       "blocks": _offset_and_length(model_bytes, blocks), "scales": _offset_and_length(model_bytes, scales)})
        # the shapes and types the derived tensors will have, declared here, computed at load
        weight = dequantize_blocks(numpy_helper.to_array(blocks), numpy_helper.to_array(scales), k)
        names = tensor_names(stem, bool(channels))
        for name, array in zip(names, matmul_tensors(weight, channels)):
            declared.append(_external(name, array))
        name = node.name.replace("_Q8", "_U8")
        if not channels:
            nodes.append(helper.make_node("DynamicQuantizeMatMul", [node.input[0], *names[:3]], list(node.output),
                                          name=name, domain="com.microsoft"))
            continue
        x, (weight_u8, scale, zero, mask, index, rows) = node.input[0], names
        nodes += [helper.make_node("Mul", [x, mask], [f"{name}/masked"], name=f"{name}/mask"),
                  helper.make_node("DynamicQuantizeMatMul", [f"{name}/masked", weight_u8, scale, zero],
                                   [f"{name}/int8"], name=name, domain="com.microsoft"),
                  helper.make_node("Gather", [x, index], [f"{name}/outliers"], name=f"{name}/gather", axis=-1),
                  helper.make_node("MatMul", [f"{name}/outliers", rows], [f"{name}/float"], name=f"{name}/float"),
                  helper.make_node("Add", [f"{name}/int8", f"{name}/float"], list(node.output), name=f"{name}/add")]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = {name for node in model.graph.node for name in node.input}
    kept = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept + declared)
    point_into_shared_weights(model, model_bytes, {t.name for t in declared})  # the unchanged ones: chat-mpnet's file
    out.mkdir(parents=True, exist_ok=True)
    plain = out / "model_int8.onnx"
    plain.write_bytes(model.SerializeToString())
    packed = out / "model_int8.onnx.gz"
    with plain.open("rb") as source, gzip.GzipFile(packed, "wb", compresslevel=9, mtime=0) as target:
        shutil.copyfileobj(source, target)
    plain.unlink()
    recipe_path = out / RECIPE
    recipe_path.write_text(json.dumps({"matmuls": recipe}, indent=1) + "\n")
    return packed, recipe_path


def _offset_and_length(model_bytes: bytes, tensor) -> list[int]:
    """[offset, length] of an initializer's bytes in the inflated model (they are stored there as one run)."""
    offset = model_bytes.find(tensor.raw_data)
    if offset < 0 or model_bytes.find(tensor.raw_data, offset + 1) >= 0:
        raise ValueError(f"{tensor.name}: its bytes are not in the model exactly once")
    return [offset, len(tensor.raw_data)]


def _external(name: str, array: np.ndarray):
    """An initializer of `array`'s name, type and shape whose data is external at REQUANTIZED (supplied at load)."""
    import onnx
    from onnx import helper

    tensor = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", REQUANTIZED), ("offset", "0"), ("length", str(array.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def bundled_outliers() -> dict[str, list[int]]:
    """The float channels the bundled recipe holds, by MatMul node name."""
    recipe = json.loads((BUNDLED / RECIPE).read_text())
    return {m["node"]: m["outliers"] for m in recipe["matmuls"] if m["outliers"]}


def fit_report() -> dict[str, dict[str, float]]:
    """Cosine of the bundled mixed side's question vectors to chat-mpnet's own, on the annotated tuning chats'
    questions and the agent-memory set's even questions (the tuning halves)."""
    from amfs_server.adapters.embedders import load_embedder
    from amfs_server.core.embedding import embed_queries

    chats = json.loads((ROOT / "session_bench/data/conversations_annotated.json").read_text())
    questions = [q["question"] for c in chats["conversations"] if c["split"] == "tuning" for q in c["questions"]]
    agent = json.loads((ROOT / "session_bench/data/retrieval_eval.json").read_text())
    agent_questions = [q["question"] for q in agent["questions"][::2]]
    full, mixed = load_embedder("chat-mpnet", query_encoder="full"), load_embedder("chat-mpnet", query_encoder="mixed")
    report = {}
    for label, texts in (("annotated tuning questions", questions), ("agent memories' even questions", agent_questions)):
        a = np.vstack([embed_queries(full, [t]) for t in texts])
        b = np.vstack([embed_queries(mixed, [t]) for t in texts])
        cosine = (a * b).sum(axis=1)
        report[label] = {"n": len(texts), "median": float(np.median(cosine)), "min": float(cosine.min())}
    return report


def speed_report(rounds: int = 2) -> dict[str, float]:
    """p50 ms of a question's embedding by chat-mpnet's own side and by the mixed side, one question at a time as a
    retrieve embeds it, the two sides alternated question by question over the annotated tuning chats' questions
    (`rounds` passes), and the p50 of the paired difference."""
    import time

    from amfs_server.adapters.embedders import load_embedder
    from amfs_server.core.embedding import embed_queries

    chats = json.loads((ROOT / "session_bench/data/conversations_annotated.json").read_text())
    questions = [q["question"] for c in chats["conversations"] if c["split"] == "tuning" for q in c["questions"]]
    sides = {"full": load_embedder("chat-mpnet", query_encoder="full"),
             "mixed": load_embedder("chat-mpnet", query_encoder="mixed")}
    for side in sides.values():
        embed_queries(side, questions[:20])  # loaded and warm
    times: dict[str, list[float]] = {name: [] for name in sides}
    for number in range(rounds * len(questions)):
        order = list(sides) if number % 2 == 0 else list(sides)[::-1]
        for name in order:
            started = time.perf_counter()
            embed_queries(sides[name], [questions[number % len(questions)]])
            times[name].append((time.perf_counter() - started) * 1000)
    difference = [f - m for f, m in zip(times["full"], times["mixed"])]
    return {"questions": len(questions), "rounds": rounds, "full_p50_ms": float(np.median(times["full"])),
            "mixed_p50_ms": float(np.median(times["mixed"])), "difference_p50_ms": float(np.median(difference))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help=f"write model_int8.onnx.gz and {RECIPE} here")
    parser.add_argument("--calibrate", action="store_true",
                        help="with --out: choose the float channels again (else the bundled recipe's)")
    parser.add_argument("--fit", action="store_true", help="compare the bundled mixed side with chat-mpnet's own")
    parser.add_argument("--speed", action="store_true",
                        help="time both sides on the annotated tuning questions, alternated question by question")
    args = parser.parse_args()
    if args.calibrate and not args.out:
        parser.error("--calibrate builds: give --out DIR")
    if args.out:
        from amfs_server.adapters.onnx_embedder import VARIANTS

        with gzip.open(VARIANTS["chat-mpnet-int8"].bundled, "rb") as source:
            model_bytes = source.read()
        outliers = calibrate(model_bytes) if args.calibrate else bundled_outliers()
        for path in build(model_bytes, args.out, outliers):
            print(path)
    if args.fit:
        for label, figures in fit_report().items():
            print(f"{label}: {figures['n']} texts, cosine median {figures['median']:.4f}, min {figures['min']:.4f}")
    if args.speed:
        figures = speed_report()
        print(f"{figures['questions']} questions, {figures['rounds']} times each a side, one at a time: chat-mpnet p50 {figures['full_p50_ms']:.1f} ms, "
              f"mixed p50 {figures['mixed_p50_ms']:.1f} ms, paired difference p50 {figures['difference_p50_ms']:.1f} ms")
    if not (args.out or args.fit or args.speed):
        parser.error("give --out DIR, --fit, --speed or several")


if __name__ == "__main__":
    main()
