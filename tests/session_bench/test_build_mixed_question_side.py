"""chat-mpnet's mixed question side: the requantisation its weights are computed by at load
(`adapters/requantize.py`), and scripts/build_mixed_question_side.py, which rebuilds the bundled graph and recipe
byte for byte from the bundled chat-mpnet and the recipe's float channels."""

from __future__ import annotations

import gzip
import hashlib
import json

import numpy as np
import pytest

from amfs_server.adapters import requantize
from amfs_server.adapters.onnx_embedder import VARIANTS
from amfs_server.adapters.requantize import (
    RECIPE, dequantize_blocks, derived_initializers, matmul_tensors, quantize_columns, tensor_names,
)

from .scripts_dir import script


def test_a_column_requantised_keeps_every_weight_within_one_step_and_zero_exact() -> None:
    rng = np.random.default_rng(0)
    weight = rng.normal(0.0, 0.05, (256, 8)).astype(np.float32)
    weight[:, 3] = np.abs(weight[:, 3])  # a column of one sign still holds 0 in its range
    weight[:, 5] = 0.0
    weight[7, :] = 0.0
    q, scale, zero = quantize_columns(weight)
    assert q.dtype == np.uint8 and scale.shape == zero.shape == (8,)
    restored = (q.astype(np.float32) - zero) * scale
    # half a step inside the range; at its ends the zero point's rounding can cost one
    assert np.all(np.abs(restored - weight) <= scale + 1e-7)
    assert np.median(np.abs(restored - weight) / scale) < 0.3
    assert np.all(restored[:, 5] == 0.0) and np.all(restored[7, :] == 0.0)  # a zero weight stays zero


def test_blocks_dequantise_to_the_weights_they_hold() -> None:
    q8 = np.array([[[128, 129, 255, 0]]], dtype=np.uint8)  # one column, one block of 4
    scales = np.array([[0.5]], dtype=np.float32)
    np.testing.assert_array_equal(dequantize_blocks(q8, scales, 4)[:, 0], [0.0, 0.5, 63.5, -64.0])


def quantize_columns_restored(weight: np.ndarray) -> np.ndarray:
    q, scale, zero = quantize_columns(weight)
    return (q.astype(np.float32) - zero) * scale


def test_outlier_channels_are_masked_out_of_the_8bit_product_and_kept_exact_in_float() -> None:
    """An input whose channel 2 is 100 times the rest: one 8-bit scale for the whole input rounds the ordinary
    channels to almost nothing; with channel 2 masked out of the 8-bit product and multiplied in float beside it,
    the product is kept to within the 8-bit steps."""
    rng = np.random.default_rng(1)
    weight = rng.normal(0.0, 0.05, (64, 16)).astype(np.float32)
    x = rng.normal(0.0, 1.0, (5, 64)).astype(np.float32)
    x[:, 2] = 100.0
    q, scale, zero, mask, index, rows = matmul_tensors(weight, [2])
    assert list(index) == [2] and mask[2] == 0.0 and mask.sum() == 63
    np.testing.assert_array_equal(rows, weight[[2], :])  # the float rows are the weight's own
    restored = (q.astype(np.float32) - zero) * scale
    assert np.all(restored[2, :] == 0.0)  # and the 8-bit weight holds nothing of them

    def activations_8bit(values):  # one scale for the whole input, as DynamicQuantizeMatMul does per call
        step = (values.max() - min(values.min(), 0.0)) / 255.0
        return np.rint(values / step) * step

    exact = x @ weight
    decomposed = activations_8bit(x * mask) @ restored + x[:, index] @ rows
    plain = activations_8bit(x) @ quantize_columns_restored(weight)
    assert np.abs(decomposed - exact).max() < 0.1 < np.abs(plain - exact).max()


def test_the_weights_are_read_at_the_recipes_offsets_in_the_shared_file(tmp_path) -> None:
    """Blocks and scales at their offsets in chat-mpnet's inflated file: what is computed at load is what the
    same arrays give in memory."""
    rng = np.random.default_rng(2)
    q8 = rng.integers(0, 256, (4, 2, 128), dtype=np.uint8)  # N 4, K 256 in two blocks of 128
    scales = rng.random((4, 2), dtype=np.float32)
    shared = tmp_path / "shared.onnx"
    shared.write_bytes(b"header" + q8.tobytes() + b"gap" + scales.tobytes() + b"tail")
    recipe = tmp_path / RECIPE
    recipe.write_text(json.dumps({"matmuls": [
        {"node": "n0", "stem": "w0", "n": 4, "k": 256, "outliers": [],
         "blocks": [6, q8.nbytes], "scales": [6 + q8.nbytes + 3, scales.nbytes]},
        {"node": "n1", "stem": "w1", "n": 4, "k": 256, "outliers": [5, 9],
         "blocks": [6, q8.nbytes], "scales": [6 + q8.nbytes + 3, scales.nbytes]}]}))
    derived = derived_initializers(recipe, shared)
    assert list(derived) == tensor_names("w0", False) + tensor_names("w1", True)
    weight = dequantize_blocks(q8, scales, 256)
    for got, expected in zip([derived[n] for n in tensor_names("w1", True)], matmul_tensors(weight, [5, 9])):
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(derived["w0_U8"], quantize_columns(weight)[0])


def test_the_bundled_recipe_floats_16_channels_of_each_feed_forward_matmul_and_none_of_the_attention() -> None:
    recipe = json.loads(VARIANTS["chat-mpnet-mixed-int8"].requantize.read_text())["matmuls"]
    assert len(recipe) == 72
    for matmul in recipe:
        feed_forward = "/dense/" in matmul["node"]
        assert len(matmul["outliers"]) == (16 if feed_forward else 0), matmul["node"]
        assert matmul["outliers"] == sorted(set(matmul["outliers"])) and all(0 <= c < matmul["k"] for c in matmul["outliers"])


def test_the_script_rebuilds_the_bundled_graph_and_recipe(tmp_path) -> None:
    """From the bundled recipe's channels (`--calibrate`, which chooses them from onnxruntime's activations, differs
    slightly between CPUs and is not tested here): the offsets, shapes and graph bytes are checked."""
    pytest.importorskip("onnx")
    build = script("build_mixed_question_side")
    with gzip.open(VARIANTS["chat-mpnet-int8"].bundled, "rb") as source:
        packed, recipe = build.build(source.read(), tmp_path, build.bundled_outliers())
    spec = VARIANTS["chat-mpnet-mixed-int8"]
    for built, bundled in ((packed, spec.bundled), (recipe, spec.requantize)):
        assert hashlib.sha256(built.read_bytes()).hexdigest() == hashlib.sha256(bundled.read_bytes()).hexdigest()
    assert requantize.REQUANTIZED.encode() in gzip.decompress(packed.read_bytes())
