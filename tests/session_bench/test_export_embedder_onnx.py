"""scripts/export_embedder_onnx.py on a small random mpnet of the shipped width (768): the fp32 file, run by the
server's adapter with its pure-Python tokenizer, embeds as torch does; the int8 file has every weight MatMul as
8-bit MatMulNBits and the token embedding table as int8, and stays close to torch; a folder of another kind is
refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from .scripts_dir import script

TEXTS = ["chat message: Jonah: We want to skydive for my birthday!", "Why won't Felix skydive?", "<UNK> a <mask>", ""]


@pytest.fixture(scope="module")
def exporter():
    return script("export_embedder_onnx")


def _torch_rows(folder, texts):
    import torch
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    rows = []
    with torch.inference_mode():
        for text in texts:
            rows.append(model(**tokenizer([text], return_tensors="pt")).last_hidden_state.mean(1)[0].numpy())
    return np.stack([row / np.linalg.norm(row) for row in rows])


def test_an_mpnet_exports_to_files_the_server_adapter_runs(exporter, small_mpnet, tmp_path):
    import onnx

    from amfs_server.adapters.onnx_embedder import OnnxEmbedder

    fp32, int8 = exporter.export(small_mpnet, tmp_path)
    reference = _torch_rows(small_mpnet, TEXTS)

    def rows(path):
        embedder = OnnxEmbedder(variant="chat-mpnet-int8", model_path=path, tokenizer_path=small_mpnet / "tokenizer.json")
        return embedder.embed(TEXTS)

    assert np.allclose((rows(fp32) * reference).sum(1), 1.0, atol=1e-4)  # same ids, same graph
    assert (rows(int8) * reference).sum(1).min() > 0.99

    graph = onnx.load(str(int8)).graph
    weights = {init.name for init in graph.initializer}
    ops = [node.op_type for node in graph.node]
    assert ops.count("MatMulNBits") == 12  # per layer: q, k, v, attention output, FFN in and out
    assert not [node for node in graph.node if node.op_type == "MatMul" and node.input[1] in weights]
    nbits = {attr.name: attr.i for node in graph.node if node.op_type == "MatMulNBits" for attr in node.attribute}
    assert nbits["bits"] == 8 and nbits["block_size"] == exporter.NBITS_BLOCK and nbits["accuracy_level"] == 4
    assert "DequantizeLinear" in ops and "MatMulInteger" not in ops  # the embedding table only
    assert (tmp_path / "model_int8.onnx.gz").is_file() and (tmp_path / "tokenizer.json").is_file()
    assert exporter.check(small_mpnet, [fp32, int8]) > 0.99


def test_a_folder_of_another_kind_is_refused(exporter, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))
    with pytest.raises(SystemExit, match="'gemma3_text' model; this exports bert or mpnet models"):
        exporter.architecture(tmp_path)
    with pytest.raises(SystemExit, match="no readable config.json"):
        exporter.architecture(tmp_path / "missing")
