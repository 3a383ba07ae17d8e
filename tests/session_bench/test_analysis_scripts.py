"""scripts/compare_entry_vectors.py and scripts/where_retrieval_misses.py measure what the server does.

The comparison's 0.5.0 row must be the vector the server writes, or its table says nothing about the shipped
retrieval; the miss analysis must count every evidence turn and call a found one found. Real default embedder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from .scripts_dir import script



def test_the_comparisons_chosen_row_is_the_vector_the_server_writes() -> None:
    from amfs_server.adapters.embedders import load_embedder
    from amfs_server.core.embedding import embed_entries, entry_texts

    compare = script("compare_entry_vectors")
    embedder = load_embedder()
    turn = "Jonah: Ugh, Mondays. Meet Taco, my new kitten! She is a Maine Coon."
    texts = entry_texts("chat/c1", "t7", turn)
    rows = embedder.embed([texts.whole, *texts.sentences])
    served = embed_entries(embedder.embed, [texts])
    vector, look = compare.vectors_and_looks("whole + sentence-mean", rows[0], rows[1:], np.zeros((0, rows.shape[1])))
    assert np.allclose(vector, served.vectors[0], atol=1e-5)
    assert np.allclose(look, served.passages[0], atol=1e-5)
    # The next-turn scheme (tried after 0.7.8) is the chosen one with one more row in the look.
    following = rows[:1]
    vector_next, look_next = compare.vectors_and_looks("the chosen + next-turn passage", rows[0], rows[1:],
                                                       np.zeros((0, rows.shape[1])), following)
    assert np.allclose(vector_next, vector) and np.allclose(look_next, np.vstack([look, following]))
    # 0.4.0's row: the sentences' mean alone, which is not the served vector any more.
    old, _ = compare.vectors_and_looks("sentence-mean", rows[0], rows[1:], np.zeros((0, rows.shape[1])))
    mean = rows[1:].mean(axis=0)
    assert np.allclose(old, mean / np.linalg.norm(mean), atol=1e-6) and not np.allclose(old, vector, atol=1e-3)


def test_the_miss_analysis_counts_every_evidence_turn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    misses = script("where_retrieval_misses")
    assert misses.band(["a", "b"], "b") == "top 10" and misses.band(["x"] * 12 + ["k"], "k") == "11-25"
    assert misses.band(["a"], "z") == "below 25"
    turns = [{"key": f"s01-t{i:02d}", "speaker": "Ana" if i % 2 else "Ben",
              "text": f"Small talk number {i} about the weather and the week."} for i in range(1, 25)]
    turns[6]["text"] = "I adopted a greyhound called Juniper from the rescue shelter."
    data = {"conversations": [{
        "conversation_id": "tiny-01", "split": "tuning",
        "sessions": [{"date": "2024-03-01", "turns": turns}],
        "questions": [{"id": "tiny-01-q1", "question": "What is the name of the greyhound that was adopted?",
                       "kind": "single-hop", "evidence": ["s01-t07"]},
                      {"id": "tiny-01-q2", "question": "What did they say about the weather?", "kind": "multi-hop",
                       "evidence": ["s01-t01", "s01-t02", "s01-t03", "s01-t04", "s01-t05", "s01-t08", "s01-t09",
                                    "s01-t10", "s01-t11", "s01-t12", "s01-t13", "s01-t14"]}],
    }]}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(data))
    total, missed = misses.asyncio.run(misses.misses(path, "tuning"))
    assert total == 13
    assert all(m[3] != data["conversations"][0]["questions"][0]["question"] for m in missed)  # the greyhound is found
    # Twelve evidence turns cannot all be in a top 10: at least two are missed, each in one of the bands.
    assert len(missed) >= 2 and all(m[0] == "multi-hop" and m[1] in ("top 10", "11-25", "below 25") for m in missed)
    assert misses.main(["--dataset", str(path)]) == 0
    assert f"{len(missed)} of 13 evidence turns not in the fused top 10" in capsys.readouterr().out


def test_the_overlap_slices_count_the_questions_words_in_their_evidence(tmp_path: Path) -> None:
    """scripts/overlap_slices.py: names and stop words aside, a plural or past form counts; bins and the paired
    differences come out of the report's own rows."""
    slices = script("overlap_slices")
    names = {"ana", "ben"}
    assert slices.overlap("When did Ana adopt the greyhounds from the shelter?",
                          ["Ana: I adopted a greyhound."], names) == pytest.approx(2 / 3)
    assert slices.overlap("What did Ben say?", ["Ben: hello"], names) == 0.0  # "say" is the only term
    assert slices.overlap("Ana and Ben?", ["Ana: hi"], names) is None  # nothing but names and stop words
    assert [slices.bin_of(s) for s in (0.0, 0.2, 1 / 3, 0.5, 2 / 3, 1.0)] == [
        "none", "under 1/3", "1/3 to 2/3", "1/3 to 2/3", "2/3 and over", "2/3 and over"]
    shares = {"c-q1": 1.0, "c-q2": 1.0, "c-q3": 0.0, "c-q4": 0.0}

    def rows(hits: list[float]) -> list[dict]:
        return [{"id": f"c-q{n + 1}", "conversation": "c", "kind": "single-hop", "recall@10": h, "mrr@10": h}
                for n, h in enumerate(hits)]

    report = {"runs": {"sqlite": {"questions": {slices.FUSION: rows([1, 1, 0, 1]), slices.BM25: rows([1, 0, 0, 0]),
                                                 slices.SEMANTIC: rows([1, 1, 1, 1])}}}}
    text = slices.table(report, shares, resamples=200)
    assert "| none | 2 | 0.500 / 0.500 | 0.000 / 0.000 | 1.000 / 1.000 | +0.500 [+0.000, +1.000] | -0.500" in text
    assert "| 2/3 and over | 2 | 1.000 / 1.000 | 0.500 / 0.500 | 1.000 / 1.000 | +0.500" in text
    assert "Mean overlap 0.500" in text
    for rows_of in report["runs"]["sqlite"]["questions"].values():
        for n, row in enumerate(rows_of):
            row["split"] = "tuning" if n < 2 else "test"
    half = slices.table(report, shares, resamples=200, split="test")
    assert "### sqlite, test half" in half and "| none | 2 |" in half and "2/3 and over" not in half
    with pytest.raises(SystemExit, match="not in the data set"):
        slices.table(report, {"c-q1": 1.0}, resamples=200)
    del report["runs"]["sqlite"]["questions"][slices.SEMANTIC]
    with pytest.raises(SystemExit, match="has no semantic"):
        slices.table(report, shares, resamples=200)
