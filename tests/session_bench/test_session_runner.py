"""The five-mode session runner on the tiny random backbone: reports, metric fields, statistics, errors."""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest
import torch

from amfs_server.session_bench import session_bench as sb


class BagOfWordsEmbedder:
    """A test double for MiniLM: hashed bag of words, unit-norm (the runner takes any Embedder)."""

    name = "test-bag-of-words"
    dimension = 384

    def embed(self, texts):
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"[a-z0-9']+", text.lower()):
                out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dimension] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_runner_writes_json_markdown_and_chart_with_all_five_modes(tmp_path, one_thread, capsys):
    out = tmp_path / "report"
    args = sb.parse_args(["--backbone", "tiny-random-qwen2", "--device", "cpu", "--n-facts", "20",
                          "--max-new-tokens", "2", "--embedder", "none", "--out", str(out)])
    report = sb.run_benchmark(args, embedder=BagOfWordsEmbedder())

    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", "report.png"}
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "report.json").read_text())
    assert list(saved["summary"]) == list(sb.MODES)
    for mode, s in saved["summary"].items():
        assert s["n"] == 10, mode
        for fld in ("hit_rate", "hit_rate_ci95", "avg_input_tokens", "avg_prefix_tokens", "avg_retrieve_ms",
                    "avg_generate_ms", "avg_generate_ms_ci95", "avg_ttft_ms", "retrieval_recall"):
            assert fld in s, (mode, fld)
    summary = report["summary"]
    # Text modes reuse nothing; the prefix modes prefill only the question (plus the top-1 for hybrid).
    assert summary["D_full_history"]["avg_prefix_tokens"] == summary["B_ams_text"]["avg_prefix_tokens"] == 0
    assert summary["A_ams_prefix"]["avg_prefix_tokens"] > 0
    assert summary["A_ams_prefix"]["avg_input_tokens"] < summary["C_ams_hybrid"]["avg_input_tokens"] \
        < summary["B_ams_text"]["avg_input_tokens"] < summary["D_full_history"]["avg_input_tokens"]
    assert summary["D_full_history"]["avg_retrieve_ms"] == 0 and summary["D_full_history"]["retrieval_recall"] is None
    assert saved["config"]["top_k"] == 3 and saved["config"]["is_random_backbone"] is True
    assert saved["sessions"][0]["memories_compiled"] == 20
    assert {"A_input_tokens_vs_D", "A_generate_ms_vs_B_ams_text", "C_generate_ms_vs_B_ams_text",
            "A_hit_rate_at_least_B_ams_text"} <= set(saved["targets"])
    assert len(saved["queries"]) == 50
    markdown = (out / "report.md").read_text()
    assert "A_ams_prefix" in markdown and "randomly initialised" in markdown
    progress = capsys.readouterr().err
    assert "C_ams_hybrid    query 10/10" in progress and "running hit-rate" in progress


def test_large_session_runs_per_seed_with_pooled_intervals(tmp_path, one_thread):
    args = sb.parse_args(["--backbone", "tiny-random-qwen2", "--device", "cpu", "--large", "--seeds", "0,1",
                          "--large-facts", "12", "--large-queries", "3", "--modes", "D_full_history,A_ams_prefix",
                          "--max-new-tokens", "1", "--embedder", "none", "--out", str(tmp_path)])
    report = sb.run_benchmark(args)
    assert [s["n_facts"] for s in report["sessions"]] == [12, 12]
    assert report["summary"]["A_ams_prefix"]["n"] == 6
    assert list(report["summary"]) == ["D_full_history", "A_ams_prefix"]


def test_wilson_interval_and_bootstrap():
    lo, hi = sb.wilson_interval(10, 10)
    assert hi == pytest.approx(1.0) and lo == pytest.approx(0.7225, abs=1e-3)
    lo, hi = sb.wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)
    lo, hi = sb.bootstrap_mean_interval([10.0, 12.0, 11.0, 13.0, 9.0])
    assert 9.0 <= lo < 11.0 < hi <= 13.0


def test_unknown_backbone_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit, match="nothing is downloaded"):
        sb.main(["--backbone", "amfs-test/no-such-model", "--embedder", "none", "--out", str(tmp_path)])


def test_unknown_mode_is_refused(capsys):
    with pytest.raises(SystemExit):
        sb.parse_args(["--modes", "A_ams_prefix,Z_magic"])
    assert "Z_magic" in capsys.readouterr().err


def test_b_flat_cos_without_an_embedder_says_what_to_pass(tmp_path, one_thread):
    args = sb.parse_args(["--backbone", "tiny-random-qwen2", "--device", "cpu", "--modes", "B_flat_cos",
                          "--max-new-tokens", "1", "--embedder", "none", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="B_flat_cos needs an embedder"):
        sb.run_benchmark(args)
