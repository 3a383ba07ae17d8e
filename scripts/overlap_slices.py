"""Each ranker of a conversations report by how many of a question's words its evidence turns hold.

The held-out conversations rank plain BM25 above a MiniLM server (0.566 against 0.454 recall@10) while every set
here ranks search by meaning far above BM25: if real questions repeat their evidence's words more than ours do,
the fusion's weights, chosen here, lean too far from keyword search for them. This splits a report's questions by
*word overlap*: the share of the question's keyword terms (`keyword_terms`: lower-cased, stop words and the two
speakers' names left out) found among the words of its evidence turns (the words of the stored value, speaker
label included; a word counts if it or the word less a final s, es, ed or ing is there). The bins are fixed
(none, under 1/3, 1/3 to 2/3, 2/3 and over), not read off the data, and nothing is tuned on them: it is a
diagnostic, on whichever half the report holds.

    amfs-server bench retrieval conversations --dataset session_bench/data/conversations_annotated.json --split test --json ann.json
    python scripts/overlap_slices.py ann.json --dataset session_bench/data/conversations_annotated.json
    python scripts/overlap_slices.py rec.json --dataset session_bench/data/conversations_recurring.json --split test

The report must be an in-process run (`--via-mcp` runs keep the fusion and BM25 only); its fusion is compared,
question by question (paired bootstrap, `bench retrieval intervals`' code), with BM25 and with semantic search alone.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from amfs_server.core.retrieval import _STOPWORDS, keyword_terms, query_word_pattern, search_form
from amfs_server.session_bench.conversation_bench import BM25_ROW as BM25, DATASET, FUSION, load_conversations, turn_value, turns_of
from amfs_server.session_bench.intervals import RESAMPLES, interval, paired

BINS = ((0.0, 0.0, "none"), (0.0, 1 / 3, "under 1/3"), (1 / 3, 2 / 3, "1/3 to 2/3"), (2 / 3, 1.01, "2/3 and over"))
SEMANTIC = "semantic"
_SUFFIX = re.compile(r"(?:ing|ed|es|s)$")


def _stem(word: str) -> str:
    return _SUFFIX.sub("", word) if len(word) > 4 else word


def overlap(question: str, evidence: list[str], names: set[str]) -> float | None:
    """The share of the question's terms (names aside) found among the evidence's words; None with no term."""
    terms = [t for t in keyword_terms(question) if t not in names]
    if not terms:
        return None
    # every word of the evidence (keyword_terms stops at a question's 32 terms; a long turn holds more)
    words = {w for text in evidence for w in query_word_pattern().findall(search_form(text).lower()) if w not in _STOPWORDS}
    stems = {_stem(w) for w in words}
    return sum(t in words or _stem(t) in stems for t in terms) / len(terms)


def bin_of(share: float) -> str:
    if share == 0.0:
        return "none"
    return next(label for low, high, label in BINS[1:] if low <= share < high)


def overlaps(dataset: Path) -> dict[str, float | None]:
    """Question id -> word overlap with its evidence, over every conversation of the data set."""
    shares: dict[str, float | None] = {}
    for conversation in load_conversations(dataset, "all"):
        turns = {t["key"]: turn_value(t) for t in turns_of(conversation)}
        names = {n.lower() for n in conversation["speakers"]}
        for q in conversation["questions"]:
            shares[q["id"]] = overlap(q["question"], [turns[k] for k in q["evidence"]], names)
    return shares


def table(report: dict[str, Any], shares: dict[str, float | None], resamples: int, split: str | None = None) -> str:
    lines: list[str] = []
    for run_name, run in report["runs"].items():
        rankers = {name: {r["id"]: r for r in rows if split is None or r.get("split") == split}
                   for name, rows in run["questions"].items() if rows}
        if split is not None and not rankers.get(FUSION):
            raise SystemExit(f"run {run_name!r} holds no question of the {split} half")
        missing = [name for name in (FUSION, BM25, SEMANTIC) if name not in rankers]
        if missing:
            raise SystemExit(f"run {run_name!r} has no {', '.join(missing)}: use an in-process `conversations --json` "
                             "report (not --via-mcp)")
        unknown = [i for i in rankers[FUSION] if i not in shares]
        if unknown:
            raise SystemExit(f"question {unknown[0]} is not in the data set: pass the report's --dataset")
        lines += [f"### {run_name}{f', {split} half' if split else ''}: recall@10 / MRR@10 by word overlap with the evidence "
                  f"({len(rankers[FUSION])} questions; 95% intervals, {resamples:,} resamples)", "",
                  f"| overlap | questions | {FUSION} | {BM25} | {SEMANTIC} | fusion minus BM25, recall@10 | "
                  "fusion minus semantic, recall@10 | fusion minus BM25, MRR@10 |", "| --- |" + " --- |" * 7]
        for _, _, label in BINS:
            ids = [i for i in rankers[FUSION] if shares[i] is not None and bin_of(shares[i]) == label]
            if not ids:
                continue
            cells = [f"{sum(rankers[n][i]['recall@10'] for i in ids) / len(ids):.3f} / "
                     f"{sum(rankers[n][i]['mrr@10'] for i in ids) / len(ids):.3f}" for n in (FUSION, BM25, SEMANTIC)]
            diffs = []
            for other, metric in ((BM25, "recall@10"), (SEMANTIC, "recall@10"), (BM25, "mrr@10")):
                d = paired([rankers[FUSION][i] for i in ids], [rankers[other][i] for i in ids], metric, resamples)
                diffs.append(f"{d['difference']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]")
            lines.append(f"| {label} | {len(ids)} | " + " | ".join(cells + diffs) + " |")
        known = [shares[i] for i in rankers[FUSION] if shares[i] is not None]
        mean, low, high = interval([float(s) for s in known], resamples)  # type: ignore[arg-type]
        lines += ["", f"Mean overlap {mean:.3f} [{low:.3f}, {high:.3f}]; "
                      f"{len(rankers[FUSION]) - len(known)} questions with no term besides the speakers' names "
                      "are left out.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a file of `amfs-server bench retrieval conversations --json`")
    parser.add_argument("--dataset", type=Path, default=DATASET, help="the data set the report ran on "
                                                                     "(default: the generated set)")
    parser.add_argument("--split", choices=("tuning", "test"), default=None,
                        help="only the questions of one half (a `--split all` report holds both)")
    parser.add_argument("--resamples", type=int, default=RESAMPLES)
    args = parser.parse_args(argv)
    text = table(json.loads(args.report.read_text()), overlaps(args.dataset), args.resamples, args.split)
    print(text)
    return text


if __name__ == "__main__":
    main()
