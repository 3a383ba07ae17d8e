"""scripts/probe_mpnet_onnx.py on a random mpnet of the shipped width: `compare` finds the fp32 file at cosine 1 to
torch, and the dynamic int8 research file leaves exactly the chosen feed-forward output projections unquantised."""

from __future__ import annotations

from pathlib import Path

import pytest

from .scripts_dir import script


@pytest.fixture(scope="module")
def probe():
    return script("probe_mpnet_onnx")


def _ops(path: Path) -> dict[str, list[str]]:
    import onnx

    nodes: dict[str, list[str]] = {}
    for node in onnx.load(str(path)).graph.node:
        nodes.setdefault(node.op_type, []).append(node.name)
    return nodes


def test_compare_finds_the_fp32_file_exact_and_int8_keeps_the_chosen_ffn_outputs_fp32(probe, small_mpnet, tmp_path):
    fp32, plain = probe.export(small_mpnet, tmp_path / "plain")
    assert (tmp_path / "plain" / "model_int8.onnx").is_file()  # the shipped quantisation beside it
    (line,) = probe.compare(small_mpnet, [fp32], turns=5, questions=5)
    assert "over 5 turns min 1.000 mean 1.000" in line and "(5 questions, one thread)" in line

    _, kept = probe.export(small_mpnet, tmp_path / "ffn", fp32_ffn_out=True)
    projections = probe.ffn_output_projections(fp32)
    assert len(projections) == 2  # one per layer
    assert set(projections) <= set(_ops(kept).get("MatMul", []))
    assert not set(projections) & set(_ops(plain).get("MatMul", []))
    assert _ops(kept).get("MatMulInteger")  # the rest is quantised

    _, one = probe.export(small_mpnet, tmp_path / "one", fp32_ffn_out=True, layers={1})
    assert set(projections) & set(_ops(one).get("MatMul", [])) == {projections[1]}
    with pytest.raises(SystemExit, match="layers 0-1"):
        probe.ffn_output_projections(fp32, {2})
    with pytest.raises(SystemExit):
        probe.main(["export", str(small_mpnet), str(tmp_path / "x"), "--layers", "1"])  # without --fp32-ffn-out
