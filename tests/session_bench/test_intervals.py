"""`amfs-server bench retrieval intervals`: bootstrap intervals and paired differences over a benchmark report."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from amfs_server.session_bench import intervals, retrieval_bench
from amfs_server.session_bench.conversation_bench import FUSION


def rows(scores: list[tuple[float, float]], conversations: int = 4) -> list[dict]:
    return [{"id": f"c{n % conversations}-q{n:03d}", "conversation": f"c{n % conversations}", "kind": "single-hop",
             "split": "test", "recall@10": recall, "mrr@10": mrr} for n, (recall, mrr) in enumerate(scores)]


def report(path: Path, rankers: dict[str, list[dict]], run: str = "sqlite") -> Path:
    path.write_text(json.dumps({"split": "test", "runs": {run: {"summary": {}, "questions": rankers}}}))
    return path


def test_the_interval_holds_the_mean_narrows_with_more_questions_and_repeats_for_a_seed():
    rng = random.Random(5)
    few = [float(rng.random() < 0.7) for _ in range(50)]
    many = [float(rng.random() < 0.7) for _ in range(2000)]
    mean, low, high = intervals.interval(few, resamples=2000)
    assert low < mean < high and mean == pytest.approx(sum(few) / 50)
    _, low_many, high_many = intervals.interval(many, resamples=2000)
    assert high_many - low_many < (high - low) / 3  # ~sqrt(40) narrower
    assert intervals.interval(few, resamples=2000) == (mean, low, high)
    assert intervals.interval([0.5] * 30, resamples=500) == (0.5, 0.5, 0.5)


def test_a_ranker_ahead_on_every_question_is_ahead_with_certainty_and_in_every_conversation():
    better = rows([(1.0, 1.0)] * 40)
    worse = rows([(0.5, 0.25)] * 40)
    result = intervals.paired(better, worse, "mrr@10", resamples=500)
    assert result["difference"] == pytest.approx(0.75) and result["low"] == pytest.approx(0.75)
    assert (result["ahead"], result["behind"], result["conversations"]) == (4, 0, 4)


def test_a_difference_resting_on_two_questions_of_forty_is_not_called_certain():
    base = [(0.0, 0.0)] * 40
    two_better = list(base)
    two_better[3] = two_better[17] = (1.0, 1.0)
    result = intervals.paired(rows(two_better), rows(base), "recall@10", resamples=5000)
    assert result["difference"] == pytest.approx(0.05)
    assert result["low"] <= 0.0 < result["high"]  # could be luck: the interval reaches zero
    assert (result["ahead"], result["behind"]) == (2, 0)  # q003 is in c3, q017 in c1; c0 and c2 unchanged


def test_runs_of_different_questions_are_refused_rather_than_paired():
    with pytest.raises(intervals.ReportError, match="different questions"):
        intervals.paired(rows([(1.0, 1.0)] * 10), rows([(1.0, 1.0)] * 11), "recall@10", resamples=200)


def test_the_command_prints_every_ranker_and_the_fusion_against_each(tmp_path: Path, capsys):
    rng = random.Random(1)
    fusion = rows([(rng.choice([0.0, 0.5, 1.0]), rng.choice([0.0, 0.5, 1.0])) for _ in range(60)])
    bm25 = [dict(r, **{"recall@10": r["recall@10"] / 2, "mrr@10": r["mrr@10"] / 2}) for r in fusion]
    path = report(tmp_path / "run.json", {FUSION: fusion, "bm25 (baseline)": bm25})
    retrieval_bench.main(["intervals", str(path), "--resamples", "500"])
    out = capsys.readouterr().out
    assert "60 questions, 4 conversations" in out
    assert f"| {FUSION} | " in out and "| bm25 (baseline) | " in out
    assert f"| {FUSION} minus |" in out
    line = next(l for l in out.splitlines() if l.startswith("| bm25 (baseline) | +"))
    assert line.count("up /") == 2


def test_against_pairs_the_same_run_of_two_files(tmp_path: Path, capsys):
    mine = report(tmp_path / "gemma.json", {FUSION: rows([(1.0, 1.0)] * 20)})
    theirs = report(tmp_path / "minilm.json", {FUSION: rows([(0.0, 0.0)] * 20)})
    text = intervals.main([str(mine), "--against", str(theirs), "--resamples", "200"])
    assert f"{mine} minus {theirs}" in text
    assert ("| sqlite (20 questions) | +1.000 [+1.000, +1.000] | +1.000 [+1.000, +1.000] | 4 up / 0 down of 4 | "
            "4 up / 0 down of 4 |") in text


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not JSON"),
    (json.dumps({"summary": {}}), "not a report"),
    (json.dumps({"runs": {"sqlite": {"questions": {FUSION: [{"id": "a"}]}}}}), "rows without"),
    (json.dumps({"stores": {"sqlite": {"overall": {}}}}), "not a report"),
])
def test_a_file_that_is_not_a_report_is_named_with_what_is_wrong(tmp_path: Path, capsys, content, message):
    path = tmp_path / "x.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        intervals.main([str(path)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_files_without_a_common_run_or_ranker_are_refused(tmp_path: Path, capsys):
    sqlite = report(tmp_path / "a.json", {FUSION: rows([(1.0, 1.0)] * 8)})
    postgres = report(tmp_path / "b.json", {FUSION: rows([(1.0, 1.0)] * 8)}, run="postgres")
    with pytest.raises(SystemExit):
        intervals.main([str(sqlite), "--against", str(postgres)])
    assert "share no run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        intervals.main([str(sqlite), "--ranker", "semantic"])
    assert "has no ranker 'semantic'" in capsys.readouterr().err


def test_a_via_mcp_report_is_compared_against_its_fusion_through_mcp(tmp_path: Path):
    fusion = rows([(1.0, 1.0)] * 12)
    path = report(tmp_path / "mcp.json", {FUSION + " via MCP": fusion, "bm25 (baseline)": rows([(0.0, 0.0)] * 12)},
                  run="mcp-stdio")
    text = intervals.main([str(path), "--resamples", "200"])
    assert f"| {FUSION} via MCP minus |" in text
    assert "| bm25 (baseline) | +1.000 [+1.000, +1.000]" in text


def test_the_agent_memory_report_is_read_with_its_metrics_services_and_halves(tmp_path: Path):
    """`bench retrieval quality` writes recall@5 / recall@10 / MRR per question, grouped by service, in two halves."""
    def agent_rows(recall: float) -> list[dict]:
        return [{"id": f"q{n:03d}", "group": f"svc-{n % 5}", "kind": "paraphrase", "half": "odd" if n % 2 else "even",
                 "recall@5": recall, "recall@10": recall, "mrr": recall} for n in range(30)]

    path = tmp_path / "quality.json"
    path.write_text(json.dumps({"dataset": {}, "stores": {"sqlite": {"overall": {}, "questions": {
        intervals.QUALITY_FUSION: agent_rows(1.0), "semantic": agent_rows(0.0)}}}}))
    text = intervals.main([str(path), "--half", "odd", "--resamples", "200"])
    assert "### sqlite: 15 questions, 5 services" in text
    assert "| ranker | recall@5 | recall@10 | MRR |" in text
    assert f"| {intervals.QUALITY_FUSION} minus | recall@5 | recall@10 | MRR | services, recall@5 |" in text
    assert "| semantic | +1.000 [+1.000, +1.000] | +1.000 [+1.000, +1.000] | +1.000 [+1.000, +1.000] | 5 up" in text


def test_halves_are_refused_for_a_report_without_them(tmp_path: Path, capsys):
    path = report(tmp_path / "run.json", {FUSION: rows([(1.0, 1.0)] * 8)})
    with pytest.raises(SystemExit):
        intervals.main([str(path), "--half", "odd"])
    assert "no halves" in capsys.readouterr().err


def test_a_split_keeps_one_half_of_a_run_over_both_halves(tmp_path: Path):
    """A `--split all` report gives each half's intervals; the halves' differences are not the whole run's."""
    def both(tuning: tuple[float, float], test: tuple[float, float]) -> list[dict]:
        half = rows([tuning] * 8) + rows([test] * 8)
        for n, row in enumerate(half):
            row["split"] = "tuning" if n < 8 else "test"
            row["id"] = f"{row['split']}-{row['id']}"
        return half

    path = report(tmp_path / "all.json", {FUSION: both((1.0, 1.0), (0.0, 0.0)), "semantic": both((0.0, 0.0), (1.0, 1.0))})
    tuning = intervals.main([str(path), "--split", "tuning", "--resamples", "200"])
    test = intervals.main([str(path), "--split", "test", "--resamples", "200"])
    assert "### sqlite: 8 questions of the tuning half, 4 conversations" in tuning
    assert "| semantic | +1.000 [+1.000, +1.000]" in tuning and "| semantic | -1.000 [-1.000, -1.000]" in test
    assert intervals.main([str(path), "--split", "test", "--against", str(path), "--resamples", "200"]).count(
        "+0.000 [+0.000, +0.000]") == 2


def test_a_split_the_report_does_not_hold_or_a_report_without_splits_is_refused(tmp_path: Path, capsys):
    only_test = report(tmp_path / "test.json", {FUSION: rows([(1.0, 1.0)] * 8)})
    with pytest.raises(SystemExit):
        intervals.main([str(only_test), "--split", "tuning"])
    assert "no question of the tuning half (this report holds: test" in capsys.readouterr().err
    agent = tmp_path / "quality.json"
    agent.write_text(json.dumps({"stores": {"sqlite": {"questions": {intervals.QUALITY_FUSION: [
        {"id": "q1", "group": "svc", "kind": "paraphrase", "half": "odd", "recall@10": 1.0, "mrr": 1.0}]}}}}))
    with pytest.raises(SystemExit):
        intervals.main([str(agent), "--split", "test"])
    assert "carry no split (the agent-memory set's halves are --half)" in capsys.readouterr().err


def test_the_quality_benchmark_writes_every_questions_scores(monkeypatch, tmp_path: Path):
    """The agent-memory benchmark keeps what `intervals` reads: one row per question and ranker, means unchanged."""
    import asyncio

    dataset = json.loads(retrieval_bench.DATASET.read_text())
    dataset["questions"] = dataset["questions"][:6]
    small = tmp_path / "retrieval_eval.json"
    small.write_text(json.dumps(dataset))
    monkeypatch.setattr(retrieval_bench, "DATASET", small)
    result = asyncio.run(retrieval_bench.run_quality(["sqlite"], tmp_path / "out"))
    store = result["stores"]["sqlite"]
    fused = store["questions"][intervals.QUALITY_FUSION]
    assert [r["id"] for r in fused] == [f"q{n:03d}" for n in range(6)]
    assert [r["half"] for r in fused] == ["even", "odd"] * 3
    assert all(r["group"] == q["gold"][0].split("/")[0] for r, q in zip(fused, dataset["questions"]))
    assert store["overall"][intervals.QUALITY_FUSION]["mrr"] == pytest.approx(sum(r["mrr"] for r in fused) / 6)
    written = intervals.load_report(tmp_path / "out" / "quality.json")
    assert written.unit == "services" and set(written.runs["sqlite"]) == set(store["questions"])


def test_kind_keeps_one_kind_of_question_and_names_the_kinds_when_unknown(tmp_path: Path, capsys):
    fusion = rows([(1.0, 1.0)] * 10) + [dict(r, kind="open-domain", id=f"x{n}") for n, r in enumerate(rows([(0.0, 0.0)] * 6))]
    path = report(tmp_path / "run.json", {FUSION: fusion})
    text = intervals.main([str(path), "--kind", "open-domain", "--resamples", "200"])
    assert "6 questions of kind open-domain" in text and f"| {FUSION} | 0.000 [0.000, 0.000]" in text
    with pytest.raises(SystemExit):
        intervals.main([str(path), "--kind", "temporal"])
    assert "no question of kind 'temporal' (kinds: open-domain, single-hop)" in capsys.readouterr().err


def test_plot_draws_the_fusion_minus_the_rankers_asked_for_and_refuses_unknown_ones(tmp_path: Path, capsys):
    rng = random.Random(2)
    fusion = [dict(r, kind=rng.choice(["single-hop", "temporal"]))
              for r in rows([(rng.choice([0.0, 1.0]), rng.random()) for _ in range(40)])]
    semantic = [dict(r, **{"recall@10": 0.0}) for r in fusion]
    path = report(tmp_path / "run.json", {FUSION: fusion, "semantic": semantic, "temporal": semantic,
                                          "bm25 (baseline)": semantic})
    picture = tmp_path / "forest.png"
    intervals.main([str(path), "--plot", str(picture), "--plot-against", "semantic,temporal", "--resamples", "200"])
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):
        intervals.main([str(path), "--plot", str(tmp_path / "x.png"), "--plot-against", "rrf"])
    assert "names no ranker" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        intervals.main([str(path), "--plot", str(tmp_path / "x.png"), "--against", str(path)])
    assert "drop --against" in capsys.readouterr().err
