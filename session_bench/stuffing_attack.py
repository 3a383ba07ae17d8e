"""Stuffing: how often one memory made to match many questions surfaces for a conversation's questions.

Keyword stuffing (`--words`): the N most common words of the *other* split's questions (so none is taken from the
questions asked), written as one memory among a conversation's turns. Topic stuffing (`--statements`): N statements
of the other split, the evidence turns of its questions taken one conversation after another, written as one memory
of N sentences, aimed at the best-sentence look of semantic search (an entry scores partly by its best sentence).
Then every question of the conversation is asked with `limit` 10. Reports how often the stuffed memory ranks first
and in the top 10, for each N. The tables of "Long and stuffed memories" in docs/retrieval-record.md are this command's output:

    python -m amfs_server.session_bench.stuffing_attack --conversation 1 --words 40,80,1500
    python -m amfs_server.session_bench.stuffing_attack --conversation 1 --words 40,80,1500 --pivot none
    python -m amfs_server.session_bench.stuffing_attack --dataset session_bench/data/conversations_annotated.json \
        --conversation 1 --words "" --statements 4,8,16,32
    python -m amfs_server.session_bench.stuffing_attack --conversation 1 --words 300 --joiner "$(printf '\u19b0')"

`--pivot` replaces `core.retrieval.KEYWORD_LENGTH_PIVOT` in this process only ("none": no length factor), to
compare the shipped value with others. `--joiner` joins the stuffed words with that text instead of a space: a
character the keyword index splits words at but Python's `\\w` does not (U+19B0 on SQLite, U+00B2 on PostgreSQL)
once made the length factor count them as one word.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path
from collections import Counter
from typing import Any

from ..core import retrieval
from ..sdk import AgentMemory
from .conversation_bench import DATASET, load_conversations

STUFFED_KEY = "zz-stuffed"


def common_question_words(conversations: list[dict[str, Any]], count: int) -> list[str]:
    words: Counter[str] = Counter()
    for conversation in conversations:
        for question in conversation["questions"]:
            words.update(word.lower() for word in re.findall(r"[A-Za-z]+", question["question"]))
    return [word for word, _ in words.most_common(count)]


def common_statements(conversations: list[dict[str, Any]], count: int) -> list[str]:
    """`count` evidence turns of `conversations`' questions, one conversation after another (so the topics vary), each
    as one sentence."""
    texts: list[list[str]] = []
    for conversation in conversations:
        turns = {turn["key"]: turn["text"] for session in conversation["sessions"] for turn in session["turns"]}
        evidence = dict.fromkeys(key for question in conversation["questions"] for key in question["evidence"])
        texts.append([turns[key] for key in evidence if key in turns])
    chosen: list[str] = []
    for depth in range(max(map(len, texts), default=0)):
        for conversation_texts in texts:
            if depth < len(conversation_texts) and len(chosen) < count:
                text = re.sub(r"[.!?]+\s+", ", ", conversation_texts[depth].strip()).rstrip(".!? ")
                chosen.append(text + ".")
    return chosen


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
    parser.add_argument("--dataset", type=Path, default=DATASET)
    parser.add_argument("--words", default="40,80,1500",
                        help="comma-separated sizes of the keyword-stuffed memory, in words ('' for none)")
    parser.add_argument("--statements", default="",
                        help="comma-separated sizes of the topic-stuffed memory, in sentences (default: none)")
    parser.add_argument("--joiner", default=" ", help="what joins the stuffed words (default: a space)")
    parser.add_argument("--pivot", default=None,
                        help=f"the keyword length pivot to use (default {retrieval.KEYWORD_LENGTH_PIVOT}; 'none': off)")
    args = parser.parse_args(argv)
    if args.pivot is not None:
        retrieval.KEYWORD_LENGTH_PIVOT = float("inf") if args.pivot == "none" else int(args.pivot)  # type: ignore[assignment]
    conversations = load_conversations(args.dataset)
    if not 1 <= args.conversation <= len(conversations):
        parser.error(f"--conversation must be between 1 and {len(conversations)}")
    target = conversations[args.conversation - 1]
    others = [c for c in conversations if c["split"] != target["split"]]
    print(f"conversation {target['conversation_id']}, keyword length pivot {retrieval.KEYWORD_LENGTH_PIVOT}: "
          "the stuffed memory's rank over its questions (limit 10)")
    print("| stuffed memory | questions | ranked first | in the top 10 |")
    print("| --- | --- | --- | --- |")
    for count in (int(n) for n in args.words.split(",") if n):
        questions, first, top10 = attack(target, args.joiner.join(common_question_words(others, count)))
        joined = "" if args.joiner == " " else f", joined by {args.joiner!r}"
        print(f"| {count} words{joined} | {questions} | {first} | {top10} |")
    for count in (int(n) for n in args.statements.split(",") if n):
        questions, first, top10 = attack(target, " ".join(common_statements(others, count)))
        print(f"| {count} statements | {questions} | {first} | {top10} |")


if __name__ == "__main__":
    main()
