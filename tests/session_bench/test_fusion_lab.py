"""scripts/fusion_lab.py: its dump is what the service fused, and re-fusing it as shipped gives what was returned.

Uses the real default embedder on the first two sessions of one annotated tuning conversation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from amfs_server.core import service as service_module
from amfs_server.core.retrieval import RankedList, fuse_hybrid

from .scripts_dir import ROOT, script

ANNOTATED = ROOT / "session_bench" / "data" / "conversations_annotated.json"


def lab():
    return script("fusion_lab")


def small_dataset(folder: Path) -> Path:
    """ann-01 (tuning split) cut to its first two sessions and six questions answered there, written to `folder`."""
    data = json.loads(ANNOTATED.read_text())
    conversation = data["conversations"][0]
    conversation["sessions"] = conversation["sessions"][:2]
    kept = {turn["key"] for session in conversation["sessions"] for turn in session["turns"]}
    conversation["questions"] = [q for q in conversation["questions"] if set(q["evidence"]) <= kept][:6]
    assert len(conversation["questions"]) >= 3
    data["conversations"] = [conversation]
    path = folder / "small.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    return lab(), asyncio.run(lab().dump_conversations(small_dataset(tmp_path_factory.mktemp("lab")), "tuning", 0.0))


def test_re_fusing_the_dump_as_shipped_gives_what_the_service_returned(dumped):
    module, rows = dumped
    assert all(len(row["returned"]) == 10 for row in rows)
    module.check_reproduces(rows, Path("small"))  # raises when any top 10 differs
    assert service_module.fuse_hybrid is fuse_hybrid  # the recorder is taken out again
    assert {r.strategy for r in rows[0]["rankings"]} >= {"semantic", "keyword", "temporal", "confidence"}


def test_a_dump_from_other_code_is_refused(dumped):
    module, rows = dumped
    tampered = [dict(rows[0], returned=list(reversed(rows[0]["returned"]))), *rows[1:]]
    with pytest.raises(SystemExit, match="1 of"):
        module.check_reproduces(tampered, Path("small"))


def test_the_variants_on_known_candidates():
    module = lab()
    rankings = [RankedList("semantic", ["a", "b", "c"], [0.9, 0.8, 0.1]),
                RankedList("keyword", ["c", "b"], [0.15, 0.9])]
    weights = {"semantic": 0.5, "keyword": 0.5}
    # shipped: a 0.5; b 0.5 x 0.875 + 0.45 = 0.8875; c 0.075
    assert module.shipped(rankings, weights) == ["b", "a", "c"]
    assert module.keyword_threshold(0.0)(rankings, weights) == module.shipped(rankings, weights)
    # a keyword share under the threshold counts nothing (c's 0.15); b keeps most of its 0.9
    assert module.keyword_threshold(0.2)(rankings, weights) == ["b", "a", "c"]
    assert module.single("keyword")(rankings, weights)[:2] == ["b", "c"]
    assert module.score(["x", "a", "b"], ["a", "z"]) == {"recall@5": 0.5, "recall@10": 0.5, "mrr": 0.5}


def test_the_headroom_bounds_on_known_candidates():
    module = lab()
    keys = [f"k{i}" for i in range(12)]
    # The answer is semantic search's 12th and keyword search's only hit, with a small share: the shipped split
    # leaves it 12th, keyword search alone would put it first.
    row = {"kind": "single-hop", "gold": ["k11"], "weights": {"semantic": 0.5, "keyword": 0.5},
           "rankings": [RankedList("semantic", keys, [1.0 - i / 20 for i in range(12)]),
                        RankedList("keyword", ["k11"], [0.05])]}
    bounds = module.headroom([row])["all"]
    assert bounds == {"shipped": 0.0, "best weight per question": 1.0, "either top 10": 1.0, "either pool": 1.0,
                      "n": 1.0}


def probe():
    return script("probe_cross_encoder")


def test_the_cross_encoder_probe_refuses_test_splits_before_anything_runs(tmp_path):
    module = probe()
    for spec in (f"{ANNOTATED}:test", f"{ANNOTATED}:all", str(ANNOTATED)):
        with pytest.raises(SystemExit, match="test splits are refused"):
            module.main(["--train", f"{ANNOTATED}:tuning", "--eval", spec])


def test_the_probe_mixes_scores_within_the_fused_top_and_keeps_the_rest():
    module = probe()
    row = {"keys": ["a", "b", "c"], "fused": [0.9, 0.5, 0.1], "tail": ["d", "e"]}
    cross = np.array([0.0, 0.0, 5.0])  # the cross-encoder puts c first
    assert module.mixed_order(row, cross, 0.0) == ["a", "b", "c", "d", "e"]  # a = 0 is the shipped fusion
    assert module.mixed_order(row, cross, 1.0)[0] == "c"
    assert module.mixed_order(row, cross, 1.0)[3:] == ["d", "e"]


def test_score_intervals_subtract_the_first_variant_question_by_question(dumped):
    module, rows = dumped
    shipped = [module.score(module.shipped(row["rankings"], row["weights"]), row["gold"]) for row in rows]
    same = module.intervals(rows, shipped, shipped)
    assert all((d["difference"], d["low"], d["high"]) == (0.0, 0.0, 0.0) for d in same.values())
    nothing = [dict(s, **{"recall@10": 0.0, "mrr": 0.0}) for s in shipped]
    worse = module.intervals(rows, nothing, shipped)
    mean_recall = sum(s["recall@10"] for s in shipped) / len(shipped)
    assert worse["recall@10"]["difference"] == pytest.approx(-mean_recall)
    assert worse["recall@10"]["high"] <= 0.0 and worse["recall@10"]["conversations"] == 1


def test_a_semantic_share_reweights_every_question_but_an_identifier_ones():
    module = lab()
    rankings = [RankedList("semantic", ["a", "b", "c"], [0.9, 0.8, 0.1]),
                RankedList("keyword", ["c", "b"], [0.15, 0.9])]
    lean = module.semantic_weight(0.9)  # a: 0.9; b: 0.9 x 0.875 + 0.1 x 0.9 = 0.8775
    assert lean(rankings, {"semantic": 0.5, "keyword": 0.5})[:2] == ["a", "b"]
    assert lean(rankings, {"semantic": 0.8, "keyword": 0.2})[:2] == ["a", "b"]  # a dump with an embedder's own share
    identifier = {"semantic": 0.3, "keyword": 0.7}  # a question naming an identifier keeps its split
    assert lean(rankings, identifier) == module.shipped(rankings, identifier) == ["b", "a", "c"]  # at 0.9: a first


def test_neighbour_slots_fill_the_tail_with_the_turns_next_to_the_top_hits():
    module = script("neighbour_slots")
    dataset = {"conversations": [{"conversation_id": "c", "sessions": [
        {"turns": [{"key": f"s1-t{n}"} for n in range(3)]}, {"turns": [{"key": f"s2-t{n}"} for n in range(2)]}]}]}
    before, after = module.neighbours(dataset)
    assert after["c/s1-t0"] == "c/s1-t1" and "c/s1-t2" not in after  # a session's last turn has no next one
    assert before["c/s2-t1"] == "c/s2-t0" and "c/s2-t0" not in before
    fused = ["c/s1-t0", "c/s2-t0", *[f"x{n}" for n in range(10)]]
    ranked = module.expand(fused, before, after, keep=8, top=2, side="n")
    assert ranked[:8] == fused[:8] and ranked[8:] == ["c/s1-t1", "c/s2-t1"]  # the two next turns take places 9-10
    assert module.expand(fused, before, after, keep=8, top=2, side="p") == fused[:10]  # no previous turns: unchanged


def test_the_keyword_gate_leans_on_semantic_search_only_where_keyword_hits_are_weak():
    module = lab()
    semantic = RankedList("semantic", ["a", "b", "c"], [0.9, 0.8, 0.1])
    gate = module.keyword_gate(0.3)
    strong = [semantic, RankedList("keyword", ["b"], [0.45])]  # b: 0.5 x 0.875 + 0.5 x 0.45 > a's 0.5
    weak = [semantic, RankedList("keyword", ["b"], [0.25])]  # at 0.8 / 0.2: a 0.8, b 0.7 + 0.05
    shipped = {"semantic": 0.5, "keyword": 0.5}
    assert gate(strong, shipped) == module.shipped(strong, shipped) == ["b", "a", "c"]
    assert module.shipped(weak, shipped)[:2] == ["b", "a"] and gate(weak, shipped)[:2] == ["a", "b"]
    identifier = {"semantic": 0.3, "keyword": 0.7}
    assert gate(weak, identifier) == module.shipped(weak, identifier)


def test_a_dump_with_dates_ranks_recency_by_the_sessions_dates_and_no_recency_drops_that_share(dumped, tmp_path):
    module, rows = dumped
    path = small_dataset(tmp_path)
    dated = asyncio.run(module.dump_conversations(path, "tuning", 0.0, with_dates=True))
    module.check_reproduces(dated, Path("small, dated"))
    assert [row["question"] for row in dated] == [row["question"] for row in rows]
    days = {session["date"] for session in json.loads(path.read_text())["conversations"][0]["sessions"]}
    assert len(days) == 2
    # recency's raw scores (POSIX timestamps to the hour) lie on the two sessions' days, not on the write time
    recency = {round(score) for row in dated for r in row["rankings"] if r.strategy == "temporal" for score in r.scores}
    assert len(recency) == 2 and max(recency) - min(recency) >= 86400
    undated = {round(score) for row in rows for r in row["rankings"] if r.strategy == "temporal" for score in r.scores}
    assert not recency & undated
    # no_recency: the shipped fusion with the recency share at 0; here recency alone breaks a tie
    rankings = [RankedList("semantic", ["a", "b", "c"], [0.9, 0.9, 0.1]),
                RankedList("temporal", ["b", "a"], [1_700_000_000.0 + 30 * 86400, 1_700_000_000.0])]
    weights = {"semantic": 0.5, "keyword": 0.5, "temporal": 0.05}
    assert module.shipped(rankings, weights)[:2] == ["b", "a"]
    assert module.VARIANTS["no_recency"](rankings, weights)[:2] == ["a", "b"]
