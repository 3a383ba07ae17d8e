"""Neighbour expansion, measured over `fusion_lab.py` dumps: the last places of the ten given to the turns next to
the fused top hits. A research script (docs/retrieval-record.md, "Tried after 0.6.0"); nothing of it is in the server.

For every dumped question it re-fuses the candidates as shipped, keeps the first KEEP places, fills the next ones
with the turn after ("n"), before ("p") or both ("np") each of the top TOP hits (same session, in conversation
order, not already listed), then the fused tail; and counts how many missed evidence turns sit next to a top-3 hit.

    python scripts/fusion_lab.py dump --set annotated --split tuning --out /tmp/lab/ann-tuning.pkl
    python scripts/neighbour_slots.py --set annotated /tmp/lab/ann-tuning.pkl

Tuning splits only: the dumps say which split they hold; never run it to choose on a test split.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fusion_lab import score, shipped  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "session_bench" / "data"
DATASETS = {"annotated": DATA / "conversations_annotated.json", "generated": DATA / "conversations_eval.json",
            "authored": DATA / "conversations_authored.json"}
SETTINGS = [(keep, top, side) for keep in (6, 7, 8) for top in (2, 3, 5) for side in ("n", "p", "np")]


def neighbours(dataset: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """Each turn's previous and next turn within its session, keyed as the dumps key them (`conv/turn`)."""
    before: dict[str, str] = {}
    after: dict[str, str] = {}
    for conversation in dataset["conversations"]:
        for session in conversation["sessions"]:
            keys = [f"{conversation['conversation_id']}/{turn['key']}" for turn in session["turns"]]
            for earlier, later in zip(keys, keys[1:]):
                after[earlier], before[later] = later, earlier
    return before, after


def expand(fused: list[str], before: dict[str, str], after: dict[str, str], keep: int, top: int, side: str) -> list[str]:
    """The first `keep` of `fused`, then the neighbours of its first `top`, then the rest of `fused`; ten in all."""
    ranked = list(fused[:keep])
    for key in fused[:top]:
        for near in ([after.get(key)] if "n" in side else []) + ([before.get(key)] if "p" in side else []):
            if near and near not in ranked and len(ranked) < 10:
                ranked.append(near)
    ranked += [key for key in fused[keep:] if key not in ranked]
    return ranked[:10]


def report(rows: list[dict[str, Any]], before: dict[str, str], after: dict[str, str]) -> list[str]:
    fused = [shipped(row["rankings"], row["weights"]) for row in rows]
    missed = [(g, set(ranked[:3])) for row, ranked in zip(rows, fused) for g in row["gold"] if g not in ranked[:10]]
    near_top = sum(before.get(g) in top or after.get(g) in top for g, top in missed)
    lines = [f"{len(rows)} questions; missed evidence turns {len(missed)}, next to a top-3 hit {near_top}",
             "| keep, top, side | recall@10 / MRR@10 |", "| --- | --- |"]
    for setting in [None, *SETTINGS]:
        totals: dict[str, float] = defaultdict(float)
        for row, ranked in zip(rows, fused):
            scores = score(ranked if setting is None else expand(ranked, before, after, *setting), row["gold"])
            totals["recall@10"] += scores["recall@10"]
            totals["mrr"] += scores["mrr"]
        lines.append(f"| {'shipped' if setting is None else setting} | "
                     f"{totals['recall@10'] / len(rows):.3f} / {totals['mrr'] / len(rows):.3f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=sorted(DATASETS), required=True, help="the conversation set the dump holds")
    parser.add_argument("dump", type=Path, help="a `fusion_lab.py dump` of that set")
    args = parser.parse_args(argv)
    before, after = neighbours(json.loads(DATASETS[args.set].read_text()))
    print("\n".join(report(pickle.loads(args.dump.read_bytes()), before, after)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
