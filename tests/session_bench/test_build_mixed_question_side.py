"""scripts/build_mixed_question_side.py, the recipe of chat-mpnet's mixed question side: requantising a column of
8-bit blocks keeps each weight within one column step, and the script rebuilds the bundled file byte for byte
from the bundled chat-mpnet."""

from __future__ import annotations

import gzip
import hashlib

import numpy as np
import pytest

from amfs_server.adapters.onnx_embedder import VARIANTS

from .scripts_dir import script

pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def build():
    return script("build_mixed_question_side")


def test_a_column_requantised_keeps_every_weight_within_one_step_and_zero_exact(build) -> None:
    rng = np.random.default_rng(0)
    weight = rng.normal(0.0, 0.05, (256, 8)).astype(np.float32)
    weight[:, 3] = np.abs(weight[:, 3])  # a column of one sign still holds 0 in its range
    weight[:, 5] = 0.0
    weight[7, :] = 0.0
    q, scale, zero = build.quantize_columns(weight)
    assert q.dtype == np.uint8 and scale.shape == zero.shape == (8,)
    restored = (q.astype(np.float32) - zero) * scale
    # half a step inside the range; at its ends the zero point's rounding can cost one
    assert np.all(np.abs(restored - weight) <= scale + 1e-7)
    assert np.median(np.abs(restored - weight) / scale) < 0.3
    assert np.all(restored[:, 5] == 0.0) and np.all(restored[7, :] == 0.0)  # a zero weight stays zero


def test_blocks_dequantise_to_the_weights_they_hold(build) -> None:
    q8 = np.array([[[128, 129, 255, 0]]], dtype=np.uint8)  # one column, one block of 4
    scales = np.array([[0.5]], dtype=np.float32)
    np.testing.assert_array_equal(build.dequantize_blocks(q8, scales, 4)[:, 0], [0.0, 0.5, 63.5, -64.0])


def test_the_script_rebuilds_the_bundled_file(build, tmp_path) -> None:
    with gzip.open(VARIANTS["chat-mpnet-int8"].bundled, "rb") as source:
        packed = build.build(source.read(), tmp_path)
    bundled = VARIANTS["chat-mpnet-mixed-int8"].bundled
    assert hashlib.sha256(packed.read_bytes()).hexdigest() == hashlib.sha256(bundled.read_bytes()).hexdigest()
