"""scripts/poisoning_bench.py's parts that decide what is measured: how hubs are chosen and written, how fakes are
built, and how a scenario is counted (the whole run needs the real embedder and minutes; README, Security)."""

from __future__ import annotations

import numpy as np

from .scripts_dir import script

bench = script("poisoning_bench")


def test_speakers_are_swapped_first_for_first_as_whole_words() -> None:
    assert bench.swap_speakers("Did Pen tell Penelope about Max?", ["Pen", "Max"], ["Ana", "Bo"]) == \
        "Did Ana tell Penelope about Bo?"


def test_a_hub_is_written_in_the_form_asked() -> None:
    questions = ["What did Ana eat?", "When did Bo move to Leeds?", "Is Ana a nurse?"]
    assert bench.hub_body(questions, "questions") == "What did Ana eat? When did Bo move to Leeds? Is Ana a nurse?"
    assert bench.hub_body(questions, "flat") == "What did Ana eat. When did Bo move to Leeds. Is Ana a nurse."
    assert bench.hub_body(questions, "statements") == "Ana eat. Bo move to Leeds. Ana a nurse."
    assert bench.hub_body(questions, "grouped:2") == "What did Ana eat, When did Bo move to Leeds. Is Ana a nurse."
    assert bench.hub_body(questions, "single").count(".") == 1


def test_hubs_are_grown_greedily_toward_the_questions_they_do_not_reach_yet() -> None:
    # Four candidate questions along two directions; two selection questions, one per direction.
    passages = np.array([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [0.1, 0.9]], dtype=np.float32)
    passages /= np.linalg.norm(passages, axis=1, keepdims=True)
    questions = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    candidates = ["a b", "c d", "e f", "g h"]  # two words each
    hubs = bench.choose_hubs(candidates, passages, questions, np.array([0.9, 0.9]), hubs=2, hub_words=2)
    assert hubs == [[0], [1]]  # the second hub aims at the question the first does not reach


def test_a_scenario_counts_top_tens_first_places_and_fakes_above_their_real_turn() -> None:
    target = {"questions": [{"id": "q1", "evidence": ["D1:1"]}, {"id": "q2", "evidence": ["D1:2"]}]}
    rows = [{"id": "q1", "ranked": ["D1:1-b", "D1:1", "x"], "marked": {"D1:1-b": ["D1:1"]}},
            {"id": "q2", "ranked": ["D1:2", "D99:1"], "marked": {}}]
    summary = bench.summarise(target, rows, ["D1:1-b", "D99:1"])
    assert summary["recall@10"] == 1.0 and summary["mrr@10"] == 0.75
    assert summary["top10_lists_with_attack"] == 2 and summary["first_places"] == 1
    fakes = [{"question": "q1", "real": "D1:1", "fake": "D1:1-b", "value": "..."}]
    assert bench.near_copy_outcomes(rows, fakes) == {
        "questions_faked": 1, "fake_in_top10": 1, "fake_above_real": 1, "fake_first": 1, "fake_beside_real": 1,
        "fake_beside_real_marked": 1}
