"""Cut eight multi-session conversations between real people out of the BYU Chit-Chat dataset.

Every conversation set made here before was written by language-model helpers, and each ranks search by meaning
far above plain BM25 while the held-out real conversations do not. The Chit-Chat Challenge corpus (BYU PCC lab,
2018, MIT licence, on PyPI as `chitchat-dataset`) holds 7,168 typed conversations between students, and some pairs
of people talked again and again over days or weeks. This script takes the eight pairs with the most sessions
and writes each as one conversation in the benchmark's format (`session_bench/data/conversations_chitchat.json`
gets its questions from annotators afterwards, see `session_bench/data/CHITCHAT.md`):

    python -m pip install chitchat-dataset==0.9.0      # in the [test] extra
    python scripts/build_chitchat_set.py --out /tmp/chitchat_turns.json

What is cut, by fixed rules chosen before any question existed: a session is one of the corpus's conversations
with at least 4 turns (a turn is one person's run of messages, joined by spaces, whitespace collapsed), cut to its
first 30 turns; a pair needs 10 such sessions and 260 turns; when a pair has more than 340 turns, evenly spaced
sessions are kept (the first and the last always) until it has at most 340. A session's date is its first
message's day in Utah (America/Denver), where the students were. The people are named by a fixed list of given
names (the corpus has only ids); a name a student typed stays in the text.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

MIN_SESSION_TURNS = 4
MAX_SESSION_TURNS = 30
MIN_SESSIONS = 10
MIN_TURNS = 260
MAX_TURNS = 340
PAIRS = 8
NAMES = (("Alex", "Sam"), ("Jordan", "Casey"), ("Riley", "Morgan"), ("Taylor", "Jamie"),
         ("Avery", "Quinn"), ("Drew", "Reese"), ("Parker", "Rowan"), ("Skyler", "Blake"))
UTAH = ZoneInfo("America/Denver")


def _turns(conversation: dict) -> list[tuple[str, str, str]]:
    """(sender, text, first timestamp) per turn; a turn the corpus left empty is dropped."""
    turns = []
    for run in conversation["messages"]:
        text = re.sub(r"\s+", " ", " ".join(m["text"] for m in run)).strip()
        if text:
            turns.append((run[0]["sender"], text, run[0]["timestamp"]))
    return turns


def _spread(sessions: list[list], limit: int) -> list[list]:
    """The most evenly spaced sessions, first and last included, whose turns add up to at most `limit`."""
    for keep in range(len(sessions), 1, -1):
        picked = sorted({round(i * (len(sessions) - 1) / (keep - 1)) for i in range(keep)})
        if sum(len(sessions[i]) for i in picked) <= limit:
            return [sessions[i] for i in picked]
    raise ValueError("no two sessions fit")


def build(corpus: dict) -> list[dict]:
    by_pair: dict[frozenset, list[list]] = defaultdict(list)
    for conversation in corpus.values():
        turns = _turns(conversation)
        senders = frozenset(sender for sender, _, _ in turns)
        if len(senders) == 2 and len(turns) >= MIN_SESSION_TURNS:
            by_pair[senders].append(turns[:MAX_SESSION_TURNS])
    candidates = []
    for senders, sessions in by_pair.items():
        sessions.sort(key=lambda s: s[0][2])
        if len(sessions) >= MIN_SESSIONS and sum(map(len, sessions)) >= MIN_TURNS:
            candidates.append((-len(sessions), sessions[0][0][2], sessions))
    candidates.sort(key=lambda c: (c[0], c[1]))
    built = []
    for number, (_, _, sessions) in enumerate(candidates[:PAIRS], start=1):
        if sum(map(len, sessions)) > MAX_TURNS:
            sessions = _spread(sessions, MAX_TURNS)
        first, second = NAMES[number - 1]
        names = {sessions[0][0][0]: first}
        names.update({s: second for session in sessions for s, _, _ in session if s not in names})
        out_sessions = []
        for index, session in enumerate(sessions, start=1):
            day = datetime.fromisoformat(session[0][2].replace("Z", "+00:00")).astimezone(UTAH).date().isoformat()
            out_sessions.append({"session": index, "date": day, "turns": [
                {"key": f"D{index}:{t}", "speaker": names[sender], "text": text, "date": day}
                for t, (sender, text, _) in enumerate(session, start=1)]})
        built.append({"conversation_id": f"chit-{number:02d}", "speakers": [first, second],
                      "split": "tuning" if number % 2 else "test", "sessions": out_sessions})
    return built


def installed_corpus() -> dict:
    """The corpus the chitchat-dataset package ships, or an install hint."""
    try:
        import chitchat_dataset
    except ImportError:
        raise SystemExit("the corpus ships in the chitchat-dataset package: python -m pip install chitchat-dataset==0.9.0")
    return dict(chitchat_dataset.Dataset())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    conversations = build(installed_corpus())
    args.out.write_text(json.dumps({"conversations": conversations}, indent=1, ensure_ascii=False) + "\n")
    for c in conversations:
        turns = sum(len(s["turns"]) for s in c["sessions"])
        print(c["conversation_id"], c["split"], f"{len(c['sessions'])} sessions, {turns} turns,",
              c["sessions"][0]["date"], "to", c["sessions"][-1]["date"])


if __name__ == "__main__":
    main()
