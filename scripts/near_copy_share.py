"""How many fakes and how many genuine pairs of turns `near_copies` marks, at several word-overlap shares.

Each turn of the annotated conversations (all eight) is copied with one fact changed, the way a red-team pass did
(a weekday, month, number or capitalised name swapped, else a sentence appended); a fake counts as marked when it
shares the share of its distinct words with its real turn. Genuine pairs are every two turns of one conversation
with 5 or more distinct words each. The share 0.6 in `core/retrieval.py` was read off this table, on this data:

    python scripts/near_copy_share.py
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

from amfs_server.core.retrieval import NEAR_COPY_MIN_WORDS, _ALNUM, search_form

DATASET = Path(__file__).resolve().parents[1] / "session_bench" / "data" / "conversations_annotated.json"
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


def altered(text: str) -> str:
    for i, day in enumerate(DAYS):
        if day in text:
            return text.replace(day, DAYS[(i + 3) % 7], 1)
    for i, month in enumerate(MONTHS):
        if re.search(rf"\b{month}\b", text):
            return re.sub(rf"\b{month}\b", MONTHS[(i + 4) % 12], text, count=1)
    number = re.search(r"\b\d+\b", text)
    if number:
        return text[:number.start()] + str(int(number.group()) + 3) + text[number.end():]
    names = re.findall(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]{3,}\b", text)
    if names:
        return re.sub(rf"\b{names[-1]}\b", "Cleveland", text, count=1)
    return text + " Actually no, that got cancelled in the end."


def words(text: str) -> frozenset[str]:
    return frozenset(_ALNUM.findall(search_form(text).casefold()))


def main() -> None:
    shares = (0.6, 0.7, 0.8, 0.9)
    fakes: list[float] = []
    genuine = {share: 0 for share in shares}
    pairs = 0
    for conversation in json.loads(DATASET.read_text())["conversations"]:
        turns = [(t["speaker"], t["text"]) for session in conversation["sessions"] for t in session["turns"]]
        sets = [words(f"{speaker}: {text}") for speaker, text in turns]
        for (speaker, text), real in zip(turns, sets):
            fake = words(f"{speaker}: {altered(text)}")
            if fake != real and len(real) >= NEAR_COPY_MIN_WORDS:
                fakes.append(len(real & fake) / len(real | fake))
        for a, b in itertools.combinations([s for s in sets if len(s) >= NEAR_COPY_MIN_WORDS], 2):
            pairs += 1
            overlap = len(a & b) / len(a | b)
            for share in shares:
                genuine[share] += overlap >= share
    print("| share | fakes marked | genuine pairs marked |\n| --- | --- | --- |")
    for share in shares:
        marked = sum(overlap >= share for overlap in fakes)
        print(f"| {share} | {marked} of {len(fakes)} ({marked / len(fakes):.0%}) | {genuine[share]} of {pairs:,} |")


if __name__ == "__main__":
    main()
