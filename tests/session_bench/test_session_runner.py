"""The five-mode session runner on the tiny random backbone: reports, metric fields, statistics, errors."""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest

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


def test_runner_writes_json_markdown_and_chart_with_the_five_modes_and_the_oracle(tmp_path, one_thread, capsys):
    out = tmp_path / "report"
    args = sb.parse_args(["--backbone", "tiny-random-qwen2", "--device", "cpu", "--n-facts", "20",
                          "--max-new-tokens", "2", "--embedder", "none", "--out", str(out)])
    report = sb.run_benchmark(args, embedder=BagOfWordsEmbedder())

    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", "report.png"}
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "report.json").read_text())
    # Each prefix mode is followed by itself at key scale 1.0 (plain concatenation), beside the default.
    assert list(saved["summary"]) == ["D_full_history", "B_flat_cos", "B_ams_text", "B_text_top1", "A_ams_prefix",
                                      "A_ams_prefix@ks1.0", "C_ams_hybrid", "C_ams_hybrid@ks1.0", sb.ORACLE]
    from amfs_server.ml.answer.prefix_cache import DEFAULT_KEY_SCALE

    assert saved["config"]["key_scale"] == DEFAULT_KEY_SCALE and saved["config"]["key_scales_beside"] == [1.0]
    for mode, s in saved["summary"].items():
        assert s["n"] == 10, mode
        assert s["reference"] is (mode == sb.ORACLE) and s["served_by"] == ["in-process"]
        for fld in ("hit_rate", "hit_rate_ci95", "hit_rate_lenient", "avg_input_tokens", "avg_prefix_tokens", "avg_retrieve_ms",
                    "avg_generate_ms", "avg_generate_ms_ci95", "avg_ttft_ms", "retrieval_recall",
                    "hit_rate_on_oracle_hits", "hits_beyond_oracle", "refused"):
            assert fld in s, (mode, fld)
    summary = report["summary"]
    # Text modes reuse nothing; the prefix modes prefill only the question (plus the top-1 for hybrid).
    assert summary["D_full_history"]["avg_prefix_tokens"] == summary["B_ams_text"]["avg_prefix_tokens"] == 0
    assert summary["A_ams_prefix"]["avg_prefix_tokens"] > 0
    assert summary["A_ams_prefix"]["avg_input_tokens"] < summary["C_ams_hybrid"]["avg_input_tokens"] \
        < summary["B_ams_text"]["avg_input_tokens"] < summary["D_full_history"]["avg_input_tokens"]
    # B_text_top1 reads only the top memory of the same retrieval.
    assert summary["B_text_top1"]["avg_input_tokens"] < summary["B_ams_text"]["avg_input_tokens"]
    assert all(len(q["memories"]) == 1 for q in saved["queries"] if q["mode"] == "B_text_top1")
    # The same prefix at another key scale: same tokens, only the keys differ.
    assert summary["A_ams_prefix@ks1.0"]["avg_prefix_tokens"] == summary["A_ams_prefix"]["avg_prefix_tokens"]
    # The oracle reads one fact as text: more than the question alone, less than three facts.
    assert summary["A_ams_prefix"]["avg_input_tokens"] < summary[sb.ORACLE]["avg_input_tokens"] \
        < summary["B_ams_text"]["avg_input_tokens"]
    assert summary["D_full_history"]["avg_retrieve_ms"] == 0 and summary["D_full_history"]["retrieval_recall"] is None
    assert saved["config"]["top_k"] == 3 and saved["config"]["is_random_backbone"] is True
    assert saved["config"]["path"] == "in-process" and saved["config"]["reference_modes"] == [sb.ORACLE]
    assert saved["sessions"][0]["memories_compiled"] == 20
    assert {"A_input_tokens_vs_D", "A_generate_ms_vs_B_ams_text", "C_generate_ms_vs_B_ams_text",
            "A_hit_rate_at_least_B_ams_text", "A_minus_B_ams_text_paired_ci95", "best_text_mode",
            "vs_best_text"} <= set(saved["targets"])
    assert saved["targets"]["best_text_mode"] in sb.TEXT_MODES
    assert set(saved["targets"]["vs_best_text"]) == {"A_ams_prefix", "A_ams_prefix@ks1.0", "C_ams_hybrid",
                                                     "C_ams_hybrid@ks1.0"}
    assert len(saved["queries"]) == 90
    oracle = [q for q in saved["queries"] if q["mode"] == sb.ORACLE]
    session = sb.report_session(20)
    gold = {q.question: q.fact_path for q in session.queries}
    assert [q["memories"] for q in oracle] == [[gold[q["question"]]] for q in oracle]
    assert all(q["gold_retrieved"] is None and q["retrieve_ms"] == 0 for q in oracle)
    for q in saved["queries"]:
        if q["mode"] in ("B_flat_cos", "B_ams_text", "A_ams_prefix", "C_ams_hybrid"):
            gold_path = gold[q["question"]]
            assert q["gold_rank"] == (q["memories"].index(gold_path) + 1 if gold_path in q["memories"] else None)
    for mode in ("B_ams_text", "A_ams_prefix"):
        rows = [q for q in saved["queries"] if q["mode"] == mode]
        assert saved["summary"][mode]["gold_first_rate"] == pytest.approx(
            sum(q["gold_rank"] == 1 for q in rows) / len(rows))
    markdown = (out / "report.md").read_text()
    assert "A_ams_prefix" in markdown and "randomly initialised" in markdown
    assert "vs the best text mode" in markdown and "lenient" in markdown
    assert "O_gold_text (reference: gold fact only)" in markdown and "on O's hits | beyond O" in markdown
    assert saved["refused"] == [] and "Refused" not in markdown  # every answer fitted
    assert "Path: **in process" in markdown
    progress = capsys.readouterr().err
    assert "C_ams_hybrid    query 10/10" in progress and "running hit-rate" in progress


def _result(mode, question, hit, session="s0"):
    return sb.QueryResult(mode=mode, session=session, question=question, expected="x", answer="", hit=hit,
                          gold_retrieved=None, gold_rank=None, memories=[], input_tokens=1, prefix_tokens=0, new_tokens=1,
                          retrieve_ms=0.0, compile_ms=0.0, ttft_ms=1.0, generate_ms=1.0)


def test_hit_rates_relative_to_the_oracle():
    # The oracle answers q1..q4 of five; A answers q1, q2 and q5 (which the oracle misses).
    oracle = [True, True, True, True, False]
    a = [True, True, False, False, True]
    results = [_result(sb.ORACLE, f"q{i}", h) for i, h in enumerate(oracle, 1)]
    results += [_result("A_ams_prefix", f"q{i}", h) for i, h in enumerate(a, 1)]
    summary = sb.summarize(results, ["A_ams_prefix", sb.ORACLE])
    assert summary["A_ams_prefix"]["hit_rate_on_oracle_hits"] == pytest.approx(2 / 4)
    assert summary["A_ams_prefix"]["hits_beyond_oracle"] == 1  # q5
    assert summary[sb.ORACLE]["reference"] and not summary["A_ams_prefix"]["reference"]
    assert "hit_rate_on_oracle_hits" not in sb.summarize(results, ["A_ams_prefix"])["A_ams_prefix"]


def test_paired_difference_interval_is_over_question_pairs():
    same = [True, False, True, False]
    assert sb.paired_difference_interval(same, same) == (0.0, 0.0)
    lo, hi = sb.paired_difference_interval([True] * 8 + [False] * 2, [False] * 5 + [True] * 5)
    assert -0.4 <= lo < 0.3 < hi <= 0.9  # mean +0.3, resampled pairs of ten
    results = [_result("A_ams_prefix", f"q{i}", True) for i in range(4)]
    results += [_result("B_ams_text", f"q{i}", i < 2) for i in range(4)]
    t = sb.targets(sb.summarize(results, ["B_ams_text", "A_ams_prefix"]), results)
    assert t["A_hit_rate_minus_B_ams_text"] == pytest.approx(0.5)
    assert 0 <= t["A_minus_B_ams_text_paired_ci95"][0] <= 0.5 <= t["A_minus_B_ams_text_paired_ci95"][1] <= 1


def test_large_session_runs_per_seed_with_pooled_intervals(tmp_path, one_thread):
    args = sb.parse_args(["--backbone", "tiny-random-qwen2", "--device", "cpu", "--large", "--seeds", "0,1",
                          "--large-facts", "12", "--large-queries", "3", "--modes", "D_full_history,A_ams_prefix",
                          "--max-new-tokens", "1", "--embedder", "none", "--out", str(tmp_path)])
    report = sb.run_benchmark(args)
    assert [s["n_facts"] for s in report["sessions"]] == [12, 12]
    assert report["summary"]["A_ams_prefix"]["n"] == 6
    assert list(report["summary"]) == ["D_full_history", "A_ams_prefix", "A_ams_prefix@ks1.0"]
    assert report["config"]["split"] == "report" and report["config"]["seeds"] == [0, 1]
    assert "report split, seeds 0,1" in (tmp_path / "report.md").read_text()
    # Pooled over the seeds above, one line per seed below.
    assert list(report["per_session"]) == ["generated_s0_n12", "generated_s1_n12"]
    assert [s["A_ams_prefix"]["n"] for s in report["per_session"].values()] == [3, 3]
    assert set(report["per_session_targets"]["generated_s0_n12"]) >= {"A_input_tokens_vs_D"}
    markdown = (tmp_path / "report.md").read_text()
    assert "## Per session (seed)" in markdown and "| generated_s1_n12 |" in markdown


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
    with pytest.raises(SystemExit):
        sb.parse_args(["--modes", "B_ams_text@ks0.5"])  # a key scale applies to prefix modes only
    assert "B_ams_text@ks0.5" in capsys.readouterr().err


def test_generated_session_sizes_out_of_range_are_refused_before_any_load(capsys):
    """--large-facts past what six people hold used to end in a traceback after the backbone had loaded."""
    most = sb.most_generated_facts(sb.LARGE_PEOPLE)
    for extra, said in ((["--large-facts", str(most + 1)], f"--large-facts must be 1..{most}"),
                        (["--large-facts", "0"], f"--large-facts must be 1..{most}"),
                        (["--large-facts", "10", "--large-queries", "11"], "--large-queries must be 1..10"),
                        (["--large-queries", "0"], "--large-queries must be 1..")):
        with pytest.raises(SystemExit):
            sb.parse_args(["--large", *extra])
        assert said in capsys.readouterr().err, extra
    assert sb.parse_args(["--large", "--large-facts", str(most), "--large-queries", str(most)]).large_facts == most


def test_prefix_modes_at_named_key_scales_follow_their_base_mode():
    args = sb.parse_args(["--modes", "C_ams_hybrid@ks1.0,A_ams_prefix@ks0.6,B_text_top1", "--key-scales-beside",
                          "none"])
    assert args.mode_list == ["B_text_top1", "A_ams_prefix", "A_ams_prefix@ks0.6", "C_ams_hybrid",
                              "C_ams_hybrid@ks1.0"]
    assert sb.mode_key_scale("A_ams_prefix@ks0.6") == 0.6 and sb.mode_key_scale("A_ams_prefix") is None


def test_b_flat_cos_without_an_embedder_says_what_to_pass(tmp_path, one_thread):
    args = sb.parse_args(["--backbone", "tiny-random-qwen2", "--device", "cpu", "--modes", "B_flat_cos",
                          "--max-new-tokens", "1", "--embedder", "none", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="B_flat_cos needs an embedder"):
        sb.run_benchmark(args)


def test_a_fact_longer_than_the_context_is_refused_naming_it_before_anything_compiles(tmp_path, one_thread):
    """Compiling such a fact ran for 10 minutes at 5 GB, or asked for 71 GB and ended in a traceback (red-team
    finding, 0.7.12); tiny-random-qwen2 reads 4,096 positions."""
    session = tmp_path / "long.json"
    session.write_text(json.dumps({"name": "long", "facts": [
        {"entity_path": "ops", "key": "log", "text": "The deploy log says " + "retry failed again " * 1500},
        {"entity_path": "ops", "key": "owner", "text": "The ops team is owned by Ana."},
    ], "queries": [{"question": "Who owns the ops team?", "expected": "Ana", "fact_path": "ops/owner"}]}))
    args = sb.parse_args(["--backbone", "tiny-random-qwen2", "--device", "cpu", "--session-file", str(session),
                          "--modes", "A_ams_prefix", "--embedder", "none", "--max-new-tokens", "1", "--out",
                          str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=r"fact ops/log is longer than .* context \(4096 tokens\) on its own, so "
                                         "nothing has run"):
        sb.run_benchmark(args)


SERVER_MODES_ORDER = ["D_full_history", "B_ams_text", "A_ams_prefix", "C_ams_hybrid"]


def test_via_server_writes_through_amfs_write_and_answers_through_amfs_answer(tmp_path, one_thread, monkeypatch):
    from amfs_server.tools import memory as memory_tools

    written = []
    real_register = memory_tools.register

    def spying_register(tools):  # record every amfs_write the server's service receives
        real_write = tools.service.write

        async def write(actor, request):
            written.append(f"{request.entity_path}/{request.key}")
            return await real_write(actor, request)

        tools.service.write = write
        real_register(tools)

    monkeypatch.setattr(memory_tools, "register", spying_register)
    common = ["--backbone", "tiny-random-qwen2", "--device", "cpu", "--n-facts", "20", "--max-new-tokens", "3",
              "--embedder", "none"]
    via = sb.run_benchmark(sb.parse_args([*common, "--via-server", "--out", str(tmp_path / "server")]),
                           embedder=BagOfWordsEmbedder())
    session = sb.report_session(20)
    # The warm-up's own memory (forgotten after it), then every fact, once, in the session's order
    assert written == ["bench-warm-up/sky", *(f.path for f in session.facts)]

    saved = json.loads((tmp_path / "server" / "report.json").read_text())
    assert saved["config"]["path"] == "server" and "amfs_answer" in saved["config"]["path_description"]
    assert saved["sessions"][0]["served_by"] == "server" and saved["sessions"][0]["backbone_load_ms"] > 0
    served = {m: s["served_by"] for m, s in saved["summary"].items()}
    assert served == {"D_full_history": ["server"], "B_flat_cos": ["in-process"], "B_ams_text": ["server"],
                      "B_text_top1": ["server"], "A_ams_prefix": ["server"], "C_ams_hybrid": ["server"],
                      sb.ORACLE: ["in-process"]}
    for q in saved["queries"]:
        assert isinstance(q["answer"], str) and q["generate_ms"] > 0 and q["total_ms"] >= q["generate_ms"]
        assert q["new_tokens"] >= 1 and q["input_tokens"] > 0
        if q["mode"] in ("A_ams_prefix", "C_ams_hybrid"):
            assert q["prefix_tokens"] > 0 and 1 <= len(q["memories"]) <= 3
        if q["mode"] == "B_text_top1":  # amfs_answer with memories=1
            assert len(q["memories"]) == 1 and q["prefix_tokens"] == 0
        if q["mode"] == "D_full_history":
            assert q["memories"] == [f.path for f in session.facts]  # mode="full": every memory, oldest first
    # The server compiled memories on first use: some answers paid a compile, later ones found the cache.
    prefix_rows = [q for q in saved["queries"] if q["mode"] == "A_ams_prefix"]
    assert prefix_rows[0]["compile_ms"] > 0
    markdown = (tmp_path / "server" / "report.md").read_text()
    assert "Path: **through the server" in markdown and "| served by |" in markdown

    # In process, with the same greedy backbone and retrieval, every server-served answer is the same: same
    # memories, same prompt sizes, same answer.
    local = sb.run_benchmark(sb.parse_args([*common, "--modes", ",".join(SERVER_MODES_ORDER), "--key-scales-beside",
                                            "none",
                                            "--out", str(tmp_path / "local")]))
    server_rows = {(q["mode"], q["question"]): q for q in via["queries"] if q["mode"] in SERVER_MODES_ORDER}
    local_rows = {(q["mode"], q["question"]): q for q in local["queries"]}
    assert server_rows.keys() == local_rows.keys() and len(local_rows) == 40
    for k, q in local_rows.items():
        s = server_rows[k]
        assert (s["answer"], s["memories"], s["input_tokens"], s["prefix_tokens"], s["new_tokens"]) == \
            (q["answer"], q["memories"], q["input_tokens"], q["prefix_tokens"], q["new_tokens"]), k


def test_via_server_refuses_settings_the_server_does_not_use(capsys):
    with pytest.raises(SystemExit):
        sb.parse_args(["--via-server", "--key-scale", "1.0"])
    assert "leave --key-scale out" in capsys.readouterr().err
    from amfs_server.ml.answer.prefix_cache import DEFAULT_KEY_SCALE

    assert sb.parse_args(["--via-server", "--key-scale", str(DEFAULT_KEY_SCALE)]).via_server
    # amfs_answer takes a memory count: --top-k and B_text_top1 run through the server too.
    assert sb.parse_args(["--via-server", "--top-k", "5"]).top_k == 5
    assert sb.parse_args(["--via-server", "--modes", "B_text_top1,A_ams_prefix"]).mode_list == [
        "B_text_top1", "A_ams_prefix"]
    # By default --via-server runs every mode, and none at another key scale.
    assert sb.parse_args(["--via-server"]).mode_list == ["D_full_history", "B_flat_cos", "B_ams_text",
                                                          "B_text_top1", "A_ams_prefix", "C_ams_hybrid", sb.ORACLE]
