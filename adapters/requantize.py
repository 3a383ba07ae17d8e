"""Weights a question side derives from chat-mpnet's own when it loads (the mixed question side since 0.7.18).

The mixed side runs every MatMul of chat-mpnet on onnxruntime's dynamic 8-bit kernels (`DynamicQuantizeMatMul`:
weights 8-bit per output column, activations quantised per call), which are about twice as fast as chat-mpnet's
8-bit block MatMuls on a CPU without VNNI. Its weights are chat-mpnet's own 8-bit blocks dequantised and quantised
again per column: a deterministic function of chat-mpnet's file, so they are computed here at load (about a second)
rather than shipped as a second copy of the model. The graph (`models/chat-mpnet-mixed`) declares each derived
tensor as external data at the location `REQUANTIZED`; the recipe beside it (`RECIPE`) says where each MatMul's
blocks and scales lie in chat-mpnet's inflated file and which of its input channels it computes in float.

Why some channels in float: a feed-forward MatMul's input holds a few channels whose values on the sentence's first
and last tokens are 10-100 times the rest; one activation scale per call cannot hold both, so those channels (16 per
MatMul, chosen by `scripts/build_mixed_question_side.py --calibrate`) are masked out of the 8-bit product and
multiplied in float beside it. Numpy only: nothing here needs the `onnx` package."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

RECIPE = "requantize.json"
REQUANTIZED = "requantized-at-load"
"""The external-data location the mixed graph gives the tensors derived here (no such file exists)."""


def dequantize_blocks(q8: np.ndarray, scales: np.ndarray, k: int) -> np.ndarray:
    """MatMulNBits 8-bit blocks without zero points (uint8 [N, blocks, 128], scales [N, blocks]) -> float [K, N]."""
    n = q8.shape[0]
    blocks = (q8.astype(np.float32) - 128.0) * scales[:, :, None]
    weight: np.ndarray = blocks.reshape(n, -1)[:, :k].T.copy()
    return weight


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


def tensor_names(stem: str, with_outliers: bool) -> list[str]:
    """The derived tensors of the MatMul whose weight is `stem`, in the order `matmul_tensors` returns them."""
    names = [f"{stem}_U8", f"{stem}_U8_scale", f"{stem}_U8_zero"]
    return names + [f"{stem}_mask", f"{stem}_outliers", f"{stem}_outlier_rows"] if with_outliers else names


def matmul_tensors(weight: np.ndarray, outliers: list[int]) -> list[np.ndarray]:
    """One MatMul's derived tensors from its float weight [K, N]: the 8-bit weight, its column scales and zero
    points, and with `outliers` (input channels computed in float): the input mask that zeroes them, their indices
    and their float rows of the weight (zeroed in the 8-bit one)."""
    if not outliers:
        return list(quantize_columns(weight))
    index = np.asarray(outliers, dtype=np.int64)
    rows = weight[index, :].copy()
    rest = weight.copy()
    rest[index, :] = 0.0
    mask = np.ones(weight.shape[0], dtype=np.float32)
    mask[index] = 0.0
    return [*quantize_columns(rest), mask, index, rows]


def derived_initializers(recipe_path: Path, shared: Path) -> dict[str, np.ndarray]:
    """Every tensor the mixed graph declares at `REQUANTIZED`, computed from chat-mpnet's inflated file `shared` by
    the recipe at `recipe_path`."""
    recipe: dict[str, Any] = json.loads(recipe_path.read_text())
    data = np.memmap(shared, dtype=np.uint8, mode="r")
    tensors: dict[str, np.ndarray] = {}
    for matmul in recipe["matmuls"]:
        n, k = matmul["n"], matmul["k"]
        (b_offset, b_length), (s_offset, s_length) = matmul["blocks"], matmul["scales"]
        q8 = np.asarray(data[b_offset:b_offset + b_length]).reshape(n, -1, 128)
        scales = np.asarray(data[s_offset:s_offset + s_length]).view(np.float32).reshape(n, -1)
        arrays = matmul_tensors(dequantize_blocks(q8, scales, k), matmul["outliers"])
        tensors.update(zip(tensor_names(matmul["stem"], bool(matmul["outliers"])), arrays))
    del data
    return tensors
