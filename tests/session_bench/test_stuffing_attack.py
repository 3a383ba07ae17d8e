"""The stuffing benchmark's attack texts: what the "Long and stuffed memories" tables of docs/retrieval-record.md are made of."""

from __future__ import annotations

from typing import Any

from amfs_server.core.embedding import entry_texts
from amfs_server.session_bench.stuffing_attack import common_question_words, common_statements


def conversation(name: str, turns: dict[str, str], evidence: list[list[str]], questions: list[str]) -> dict[str, Any]:
    return {
        "conversation_id": name,
        "sessions": [{"turns": [{"key": key, "speaker": "Ana", "text": text} for key, text in turns.items()]}],
        "questions": [{"question": q, "evidence": e} for q, e in zip(questions, evidence)],
    }


OTHERS = [
    conversation("a", {"a1": "I adopted a kitten. Her name is Miso!", "a2": "We moved to Leeds.", "a3": "Filler."},
                 [["a1"], ["a2", "a1"]], ["What pet did Ana adopt?", "Where did Ana move?"]),
    conversation("b", {"b1": "My sister got married in June.", "b2": "I run every morning."},
                 [["b2"], ["b1"]], ["How often does Ana run?", "When did the sister marry?"]),
]


def test_topic_stuffing_takes_evidence_turns_one_conversation_after_another_each_as_one_sentence() -> None:
    statements = common_statements(OTHERS, 3)
    # Evidence only (never a3), first-asked first, alternating conversations so that the topics vary.
    assert statements == ["I adopted a kitten, Her name is Miso.", "I run every morning.", "We moved to Leeds."]
    stuffed = "Mallory: " + " ".join(common_statements(OTHERS, 10))
    assert len(common_statements(OTHERS, 10)) == 4  # no more than there is evidence
    # One sentence per statement, so each is a passage of its own for the best-sentence look.
    assert len(entry_texts("conv", "zz-stuffed", stuffed).sentences) == 4


def test_keyword_stuffing_takes_the_most_common_question_words() -> None:
    words = common_question_words(OTHERS, 3)
    assert set(words[:2]) == {"did", "ana"} and len(words) == 3  # in three of the four questions each
