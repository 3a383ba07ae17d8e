"""scripts/probe_mpnet_onnx.py on a tiny random mpnet: the fp32 file embeds as torch does, --fp32-ffn-out leaves
exactly the feed-forward output projections unquantised, and its benchmark runner refuses test splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .scripts_dir import ROOT, random_mpnet, script

@pytest.fixture(scope="module")
def probe():
    return script("probe_mpnet_onnx")


@pytest.fixture(scope="module")
def tiny_mpnet(tmp_path_factory):
    pytest.importorskip("onnx")
    pytest.importorskip("tokenizers")
    # MiniLM's WordPiece tokenizer stands in for mpnet's (same kind, ids below the vocabulary size).
    return random_mpnet(tmp_path_factory.mktemp("tiny-mpnet"), ROOT / "adapters" / "models" / "all-MiniLM-L6-v2" /
                        "tokenizer.json", "[PAD]", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=130)


def _matmuls(path: Path) -> dict[str, list[str]]:
    import onnx

    nodes: dict[str, list[str]] = {}
    for node in onnx.load(str(path)).graph.node:
        nodes.setdefault(node.op_type, []).append(node.name)
    return nodes


def test_the_fp32_file_embeds_as_torch_and_int8_keeps_only_the_ffn_outputs_fp32(probe, tiny_mpnet, tmp_path):
    import torch
    from transformers import AutoModel, AutoTokenizer

    texts = ["chat message: Jonah: We want to skydive for my birthday!", "Why won't Felix skydive?"]
    model = AutoModel.from_pretrained(str(tiny_mpnet)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_mpnet))
    with torch.inference_mode():
        reference = [model(**tokenizer([t], return_tensors="pt")).last_hidden_state.mean(1)[0].numpy() for t in texts]
    reference = np.stack([r / np.linalg.norm(r) for r in reference])

    fp32, plain_int8 = probe.export(tiny_mpnet, tmp_path / "plain")
    embedder = probe.OnnxFileEmbedder(fp32)
    rows = embedder.embed(texts)
    assert embedder.dimension == 32 and rows.shape == (2, 32)
    assert np.allclose((rows * reference).sum(1), 1.0, atol=1e-4)

    (line,) = probe.compare(tiny_mpnet, [fp32], turns=5, questions=5)
    assert "over 5 turns min 1.000 mean 1.000" in line and "(5 questions, one thread)" in line

    _, kept_int8 = probe.export(tiny_mpnet, tmp_path / "ffn", fp32_ffn_out=True)
    projections = probe.ffn_output_projections(fp32)
    assert len(projections) == 2  # one per layer
    assert set(projections) <= set(_matmuls(kept_int8).get("MatMul", []))
    assert not set(projections) & set(_matmuls(plain_int8).get("MatMul", []))
    assert _matmuls(kept_int8).get("MatMulInteger")  # the rest is quantised
    assert np.allclose(np.linalg.norm(probe.OnnxFileEmbedder(kept_int8).embed(texts), axis=1), 1.0, atol=1e-5)

    _, one_int8 = probe.export(tiny_mpnet, tmp_path / "one", fp32_ffn_out=True, layers={1})
    assert set(projections) & set(_matmuls(one_int8).get("MatMul", [])) == {projections[1]}
    with pytest.raises(SystemExit, match="layers 0-1"):
        probe.ffn_output_projections(fp32, {2})
    with pytest.raises(SystemExit):
        probe.main(["export", str(tiny_mpnet), str(tmp_path / "x"), "--layers", "1"])  # without --fp32-ffn-out


def test_its_benchmark_runner_refuses_test_splits(probe, tmp_path):
    with pytest.raises(SystemExit, match="test split"):
        probe.bench(tmp_path / "model_int8.onnx", "conversations", ["--split", "test"])
    with pytest.raises(SystemExit, match="not 'latency'"):
        probe.bench(tmp_path / "model_int8.onnx", "latency", [])
