"""The authored conversation sets hold what the benchmark and the embedder's training assume of them."""

import json
from datetime import date
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "session_bench" / "data"
KINDS = {"single-hop", "multi-hop", "temporal", "open-domain"}


def conversations(name):
    return json.loads((DATA / name).read_text())["conversations"]


@pytest.mark.parametrize("name, count, splits", [("conversations_authored.json", 8, {"tuning", "test"}),
                                                 ("conversations_authored_train.json", 8, {"train"}),
                                                 ("conversations_annotated.json", 8, {"tuning", "test"}),
                                                 ("conversations_annotated_train.json", 8, {"train"}),
                                                 ("conversations_fresh.json", 4, {"test"}),
                                                 ("conversations_recurring.json", 8, {"tuning", "test"}),
                                                 ("conversations_chitchat.json", 8, {"tuning", "test"})])
def test_every_question_points_at_turns_that_exist(name, count, splits):
    found = conversations(name)
    assert len(found) == count and {c["split"] for c in found} == splits
    for conversation in found:
        speakers = conversation["speakers"]
        sessions = conversation["sessions"]
        dates = [date.fromisoformat(s["date"]) for s in sessions]
        # the typed chats' people talked several times a day; every written chat has a session a day at most
        assert dates == (sorted(dates) if name == "conversations_chitchat.json" else sorted(set(dates))), \
            conversation["conversation_id"]
        turns = {t["key"]: (s["session"], t) for s in sessions for t in s["turns"]}
        assert 240 <= len(turns) <= 340
        assert all(question["id"].startswith(conversation["conversation_id"]) for question in conversation["questions"])
        assert all(t["speaker"] in speakers and t["text"].strip() for _, t in turns.values())
        assert all(t["date"] == s["date"] for s in sessions for t in s["turns"])
        assert len(conversation["questions"]) >= 100
        assert {q["kind"] for q in conversation["questions"]} == KINDS
        for question in conversation["questions"]:
            assert question["evidence"] and all(key in turns for key in question["evidence"]), question
            if question["kind"] == "multi-hop":
                assert len({turns[key][0] for key in question["evidence"]}) >= 2, question


def test_the_annotated_set_is_split_by_conversation_and_shares_no_turn_with_the_others():
    annotated = conversations("conversations_annotated.json")
    assert [c["split"] for c in annotated] == ["tuning"] * 4 + ["test"] * 4
    others = {t["text"] for name in ("conversations_authored.json", "conversations_authored_train.json",
                                     "conversations_annotated_train.json")
              for c in conversations(name) for s in c["sessions"] for t in s["turns"]}
    assert not others & {t["text"] for c in annotated for s in c["sessions"] for t in s["turns"] if len(t["text"]) > 40}


@pytest.mark.parametrize("name, ids, splits, earlier", [
    ("conversations_fresh.json", [f"fresh-0{i}" for i in range(1, 5)], ["test"] * 4,
     ("conversations_authored.json", "conversations_authored_train.json", "conversations_annotated.json",
      "conversations_annotated_train.json")),
    ("conversations_recurring.json", [f"rec-0{i}" for i in range(1, 9)], ["tuning"] * 4 + ["test"] * 4,
     ("conversations_authored.json", "conversations_authored_train.json", "conversations_annotated.json",
      "conversations_annotated_train.json", "conversations_fresh.json")),
    ("conversations_chitchat.json", [f"chit-0{i}" for i in range(1, 9)], ["tuning", "test"] * 4,
     ("conversations_authored.json", "conversations_authored_train.json", "conversations_annotated.json",
      "conversations_annotated_train.json", "conversations_fresh.json", "conversations_recurring.json")),
])
def test_a_later_set_is_split_by_conversation_and_shares_no_turn_with_the_earlier_ones(name, ids, splits, earlier):
    found = conversations(name)
    assert [c["conversation_id"] for c in found] == ids
    assert [c["split"] for c in found] == splits
    others = {t["text"] for other in earlier for c in conversations(other) for s in c["sessions"] for t in s["turns"]}
    assert not others & {t["text"] for c in found for s in c["sessions"] for t in s["turns"] if len(t["text"]) > 40}


def test_the_training_conversations_are_not_the_benchmarks():
    benchmark = {t["text"] for c in conversations("conversations_authored.json") for s in c["sessions"] for t in s["turns"]}
    training = {t["text"] for c in conversations("conversations_authored_train.json") for s in c["sessions"] for t in s["turns"]}
    assert not benchmark & {text for text in training if len(text) > 40}
    ids = [c["conversation_id"] for c in conversations("conversations_authored.json")]
    assert [c["split"] for c in conversations("conversations_authored.json")] == ["tuning"] * 4 + ["test"] * 4, ids
