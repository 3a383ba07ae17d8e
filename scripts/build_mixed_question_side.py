"""Build chat-mpnet's mixed question side: the same model, its attention projections on faster kernels.

Why: on a 2-core CPU without AVX-512 VNNI, chat-mpnet's 8-bit block MatMuls (onnxruntime's MatMulNBits with int8
compute) take about 37 ms for a question, which alone leaves too little of the 50 ms retrieve target. onnxruntime's
dynamic 8-bit MatMul (DynamicQuantizeMatMul: per-column weights, the activations quantised per call) runs about
twice as fast there, but quantises a whole activation tensor with one scale, and the feed-forward layers' inputs
carry outlier channels: all 72 MatMuls that way gave vectors at median cosine 0.91 to the model's own. The
attention's q, k, v and o projections (48 of the 72, a third of the compute) are safe: their inputs are layer
norms' outputs and attention's mix. So this graph is chat-mpnet's with those 48 MatMuls on dynamic 8-bit kernels,
their weights the model's own 8-bit blocks dequantised and requantised per output column (uint8, asymmetric), and
every other weight left where it is: those initializers point into chat-mpnet's file (ONNX external data,
`SHARED_WEIGHTS`), which the embedder inflates beside this graph, as for the fast question side.

Stored vectors do not change: only questions are embedded by this graph, and only where AMFS_QUERY_ENCODER says
so (`mixed`, or `auto`, the default, on a CPU without VNNI; README, "On a CPU without VNNI").

    python scripts/build_mixed_question_side.py --out /tmp/mixed
    cp /tmp/mixed/model_int8.onnx.gz adapters/models/chat-mpnet-mixed/
    python scripts/build_mixed_question_side.py --fit     # cosine of its question vectors to chat-mpnet's own
    python scripts/build_mixed_question_side.py --speed   # both sides timed, alternated question by question

Needs onnx (the `[gemma]` extra, or `pip install onnx`).
"""

from __future__ import annotations

import argparse
import gzip
import re
import shutil
from pathlib import Path

import numpy as np

# The MatMulNBits nodes this graph moves to dynamic 8-bit kernels: the attention's four projections per layer.
ATTENTION_PROJECTION = re.compile(r"^/inner/encoder/layer\.\d+/attention/attn/[qkvo]/MatMul_Q8$")


def dequantize_blocks(q8: np.ndarray, scales: np.ndarray, k: int) -> np.ndarray:
    """MatMulNBits 8-bit blocks without zero points (uint8 [N, blocks, 128], scales [N, blocks]) -> float [K, N]."""
    n = q8.shape[0]
    blocks = (q8.astype(np.float32) - 128.0) * scales[:, :, None]
    return blocks.reshape(n, -1)[:, :k].T.copy()


def quantize_columns(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float [K, N] -> uint8 [K, N], scale [N], zero point [N]: asymmetric per output column, the range widened to
    hold 0, as onnxruntime's own dynamic quantisation does for uint8 weights."""
    low = np.minimum(weight.min(axis=0), 0.0)
    high = np.maximum(weight.max(axis=0), 0.0)
    scale = ((high - low) / 255.0).astype(np.float32)
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    zero = np.clip(np.rint(-low / scale), 0, 255).astype(np.uint8)
    q = np.clip(np.rint(weight / scale) + zero, 0, 255).astype(np.uint8)
    return q, scale, zero


def build(model_bytes: bytes, out: Path) -> Path:
    """The mixed graph from chat-mpnet's inflated ONNX bytes; returns the gzip-compressed file written in `out`."""
    import onnx
    from onnx import helper, numpy_helper

    from amfs_server.adapters.onnx_embedder import point_into_shared_weights

    model = onnx.load_from_string(model_bytes)
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    nodes, added, moved = [], [], 0
    for node in graph.node:
        if node.op_type != "MatMulNBits" or not ATTENTION_PROJECTION.match(node.name):
            nodes.append(node)
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attributes.get("bits") != 8 or len(node.input) != 3:
            raise ValueError(f"{node.name}: expected 8-bit blocks without zero points or bias")
        weight = dequantize_blocks(numpy_helper.to_array(initializers[node.input[1]]),
                                   numpy_helper.to_array(initializers[node.input[2]]), attributes["K"])
        q, scale, zero = quantize_columns(weight)
        stem = node.input[1].removesuffix("_Q8")
        names = [f"{stem}_U8", f"{stem}_U8_scale", f"{stem}_U8_zero"]
        added += [numpy_helper.from_array(array, name) for array, name in zip((q, scale, zero), names)]
        nodes.append(helper.make_node("DynamicQuantizeMatMul", [node.input[0], *names], list(node.output),
                                      name=node.name.replace("_Q8", "_U8"), domain="com.microsoft"))
        moved += 1
    if moved != 48:
        raise ValueError(f"expected chat-mpnet's 48 attention projections, found {moved}")
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept + added)
    point_into_shared_weights(model, model_bytes, {t.name for t in added})  # the unchanged ones: chat-mpnet's file
    out.mkdir(parents=True, exist_ok=True)
    plain = out / "model_int8.onnx"
    plain.write_bytes(model.SerializeToString())
    packed = out / "model_int8.onnx.gz"
    with plain.open("rb") as source, gzip.GzipFile(packed, "wb", compresslevel=9, mtime=0) as target:
        shutil.copyfileobj(source, target)
    plain.unlink()
    return packed


def fit_report() -> dict[str, float]:
    """Cosine of the bundled mixed side's question vectors to chat-mpnet's own, on the annotated tuning chats'
    questions and the agent-memory set's even questions (the tuning halves)."""
    import json

    from amfs_server.adapters.embedders import load_embedder
    from amfs_server.core.embedding import embed_queries

    root = Path(__file__).resolve().parents[1]
    chats = json.loads((root / "session_bench/data/conversations_annotated.json").read_text())
    questions = [q["question"] for c in chats["conversations"] if c["split"] == "tuning" for q in c["questions"]]
    agent = json.loads((root / "session_bench/data/retrieval_eval.json").read_text())
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
    import json
    import time

    from amfs_server.adapters.embedders import load_embedder
    from amfs_server.core.embedding import embed_queries

    root = Path(__file__).resolve().parents[1]
    chats = json.loads((root / "session_bench/data/conversations_annotated.json").read_text())
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
    return {"questions": len(times["full"]), "full_p50_ms": float(np.median(times["full"])),
            "mixed_p50_ms": float(np.median(times["mixed"])), "difference_p50_ms": float(np.median(difference))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write model_int8.onnx.gz here")
    parser.add_argument("--fit", action="store_true", help="compare the bundled mixed side with chat-mpnet's own")
    parser.add_argument("--speed", action="store_true",
                        help="time both sides on the annotated tuning questions, alternated question by question")
    args = parser.parse_args()
    if args.out:
        from amfs_server.adapters.onnx_embedder import VARIANTS

        with gzip.open(VARIANTS["chat-mpnet-int8"].bundled, "rb") as source:
            print(build(source.read(), args.out))
    if args.fit:
        for label, figures in fit_report().items():
            print(f"{label}: {figures['n']} texts, cosine median {figures['median']:.4f}, min {figures['min']:.4f}")
    if args.speed:
        figures = speed_report()
        print(f"{figures['questions']} questions a side, one at a time: chat-mpnet p50 {figures['full_p50_ms']:.1f} ms, "
              f"mixed p50 {figures['mixed_p50_ms']:.1f} ms, paired difference p50 {figures['difference_p50_ms']:.1f} ms")
    if not (args.out or args.fit or args.speed):
        parser.error("give --out DIR, --fit, --speed or several")


if __name__ == "__main__":
    main()
