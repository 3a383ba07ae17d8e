"""scripts/distill_query_encoder.py, the recipe of chat-mpnet's fast question side, on the bundled chat-mpnet file:
its dequantisation and re-quantisation give the teacher's bytes back, a graph it builds reads the unchanged weights
from chat-mpnet's file and computes what the layers it keeps compute, and the torch layers it trains compute what
that graph computes."""

from __future__ import annotations

import numpy as np
import pytest

from .scripts_dir import ROOT, script

pytest.importorskip("onnx")
pytest.importorskip("torch")

TEXTS = ["What did Theo name his sourdough starter?", "Why is GATEWAY_AUTHORIZE_TIMEOUT_MS not set any higher?",
         "Maya: The movers come on the 3rd of June and then it's Lisbon for two years!"]


@pytest.fixture(scope="module")
def distill():
    return script("distill_query_encoder")


@pytest.fixture(scope="module")
def teacher(distill):
    """(the inflated chat-mpnet bytes, its model, its dequantised weights)."""
    import onnx

    data = distill.read_teacher()
    model = onnx.load_from_string(data)
    return data, model, distill.teacher_weights(model)


def _run(path, texts, extra_output=None):
    """Mean-pooled, normalised outputs of the ONNX file `path` (and the raw extra output) for `texts`."""
    import onnx
    import onnxruntime as ort

    from amfs_server.adapters.wordpiece import WordPieceTokenizer

    source = str(path)
    if extra_output is not None:
        model = onnx.load(str(path))
        model.graph.output.append(onnx.helper.make_tensor_value_info(extra_output, onnx.TensorProto.FLOAT, None))
        source = model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    tokenizer = WordPieceTokenizer.from_file(ROOT / "adapters" / "models" / "chat-mpnet" / "tokenizer.json")
    vectors, extras = [], []
    for text in texts:
        ids = np.array([tokenizer.encode(text, 256)], dtype=np.int64)
        outputs = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        pooled = outputs[0][0].mean(axis=0)
        vectors.append(pooled / np.linalg.norm(pooled))
        extras.append(outputs[-1][0])
    return np.stack(vectors), extras


def test_requantising_the_dequantised_teacher_gives_its_own_bytes_back(distill, teacher) -> None:
    from onnx import numpy_helper

    _, model, weights = teacher
    initializers = {t.name: t for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits" and "/layer.11/" in n.name]
    assert len(nodes) == 6  # q, k, v, o, and the two feed-forward ones
    for node in nodes:
        q, scales = distill.quantize_blocks(weights[distill._node_weight(node.name)])
        np.testing.assert_array_equal(q, numpy_helper.to_array(initializers[node.input[1]]))
        np.testing.assert_array_equal(scales, numpy_helper.to_array(initializers[node.input[2]]))


def _build(distill, teacher, kept, tmp_path, monkeypatch):
    from amfs_server.adapters.onnx_embedder import SHARED_WEIGHTS

    data, _, weights = teacher
    monkeypatch.setattr(distill, "KEPT", kept)
    trained = {k: v for k, v in weights.items() if any(k.startswith(f"encoder.layer.{j}.") for j in kept[-distill.TRAINED:])}
    packed = distill.build(data, trained, tmp_path)
    (tmp_path / SHARED_WEIGHTS).write_bytes(data)
    return packed


def test_a_graph_of_all_twelve_layers_built_from_the_teachers_weights_is_the_teacher(distill, teacher, tmp_path,
                                                                                     monkeypatch) -> None:
    """Every step of the build (rewiring, re-quantising the trained layers, pointing the rest into chat-mpnet's
    file, pruning) is exact: with nothing skipped and nothing changed, it computes chat-mpnet's own vectors."""
    from amfs_server.adapters.embedders import load_embedder

    packed = _build(distill, teacher, list(range(12)), tmp_path, monkeypatch)
    assert packed.stat().st_size < 30_000_000  # the trained layers and the graph; the rest stays in chat-mpnet's file
    built, _ = _run(tmp_path / "model_int8.onnx", TEXTS)
    np.testing.assert_allclose(built, load_embedder("chat-mpnet", 1).embed(TEXTS), atol=1e-5)


def test_the_torch_layers_trained_compute_what_the_exported_graph_computes(distill, teacher, tmp_path,
                                                                          monkeypatch) -> None:
    """The training optimises the function the server runs: the torch top layers over the frozen layers' token
    states give the built graph's vectors."""
    import torch

    _build(distill, teacher, distill.KEPT, tmp_path, monkeypatch)
    frozen = distill.LAYER_OUT.format(distill.KEPT[-distill.TRAINED - 1])
    built, states = _run(tmp_path / "model_int8.onnx", TEXTS, extra_output=frozen)
    top, forward = distill.top_layers(teacher[2])
    top.eval()
    with torch.inference_mode():
        pooled = forward(*distill.padded(states)).numpy()
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    cosines = (pooled * built).sum(axis=1)
    assert cosines.min() > 0.995, cosines  # the graph's top layers compute in 8 bits, torch's in float32
