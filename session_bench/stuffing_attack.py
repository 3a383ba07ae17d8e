"""Keyword stuffing: how often one memory made of common question words surfaces for a conversation's questions.

The attack: the N most common words of the *other* split's questions (so none is taken from the questions asked),
written as one memory among a conversation's turns; then every question of that conversation is asked with
`limit` 10. Reports how often the stuffed memory ranks first and in the top 10, for each N. The README's table
("Long and stuffed memories") is this command's output:

    python -m amfs_server.session_bench.stuffing_attack --conversation 1 --words 40,80,1500
    python -m amfs_server.session_bench.stuffing_attack --conversation 1 --words 40,80,1500 --pivot none

`--pivot` replaces `core.retrieval.KEYWORD_LENGTH_PIVOT` in this process only ("none": no length factor), to
compare the shipped value with others.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections import Counter
from typing import Any

from ..core import retrieval
from ..sdk import AgentMemory
from .conversation_bench import load_conversations

STUFFED_KEY = "zz-stuffed"


def common_question_words(conversations: list[dict[str, Any]], count: int) -> list[str]:
    words: Counter[str] = Counter()
    for conversation in conversations:
        for question in conversation["questions"]:
            words.update(word.lower() for word in re.findall(r"[A-Za-z]+", question["question"]))
    return [word for word, _ in words.most_common(count)]


def attack(conversation: dict[str, Any], stuffed: str) -> tuple[int, int, int]:
    """(questions, times the stuffed memory ranked first, times it was in the top 10)."""
    first = top10 = 0
    with tempfile.TemporaryDirectory() as data_dir, AgentMemory(agent_id="bench/stuffing", data_dir=data_dir) as mem:
        for session in conversation["sessions"]:
            for turn in session["turns"]:
                mem.write("conv", turn["key"], f"{turn['speaker']}: {turn['text']}")
        mem.write("conv", STUFFED_KEY, "Mallory: " + stuffed)
        for question in conversation["questions"]:
            keys = [hit.entry.key for hit in mem.retrieve(question["question"], entity_path="conv", limit=10)]
            first += bool(keys) and keys[0] == STUFFED_KEY
            top10 += STUFFED_KEY in keys
    return len(conversation["questions"]), first, top10


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m amfs_server.session_bench.stuffing_attack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversation", type=int, default=1, help="1-based conversation number (default 1)")
    parser.add_argument("--words", default="40,80,1500", help="comma-separated sizes of the stuffed memory")
    parser.add_argument("--pivot", default=None,
                        help=f"the keyword length pivot to use (default {retrieval.KEYWORD_LENGTH_PIVOT}; 'none': off)")
    args = parser.parse_args(argv)
    if args.pivot is not None:
        retrieval.KEYWORD_LENGTH_PIVOT = float("inf") if args.pivot == "none" else int(args.pivot)  # type: ignore[assignment]
    conversations = load_conversations()
    if not 1 <= args.conversation <= len(conversations):
        parser.error(f"--conversation must be between 1 and {len(conversations)}")
    target = conversations[args.conversation - 1]
    others = [c for c in conversations if c["split"] != target["split"]]
    print(f"conversation {target['conversation_id']}, keyword length pivot {retrieval.KEYWORD_LENGTH_PIVOT}: "
          "the stuffed memory's rank over its questions (limit 10)")
    print("| stuffed words | questions | ranked first | in the top 10 |")
    print("| --- | --- | --- | --- |")
    for count in (int(n) for n in args.words.split(",")):
        questions, first, top10 = attack(target, " ".join(common_question_words(others, count)))
        print(f"| {count} | {questions} | {first} | {top10} |")


if __name__ == "__main__":
    main()
