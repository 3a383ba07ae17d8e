"""How sure a conversation benchmark's figures are: paired bootstrap intervals over its questions.

Reads what `amfs-server bench retrieval conversations --json FILE` wrote (every question's recall@10 and MRR@10 per
ranker). For one file: each ranker's mean with its 95% interval, and the reference ranker (the fusion as configured)
against every other ranker, question by question. With `--against OTHER`: the reference ranker of FILE against the
same ranker of OTHER (another embedder, another release), paired on the question ids, run by run (sqlite with
sqlite, ...).

Intervals resample the questions (10,000 times, percentile method, a fixed seed). Questions of one conversation are
not independent (one chat's style makes several of its questions easy or hard together), and resampling questions
treats them as if they were, so the intervals are narrower than the uncertainty about another conversation; the
last column, how many conversations each difference points the same way in, is the cruder check on that.

    amfs-server bench retrieval conversations --dataset session_bench/data/conversations_annotated.json --split test --json minilm.json
    amfs-server bench retrieval intervals minilm.json
    amfs-server bench retrieval conversations --dataset ... --split test --embedder embeddinggemma --json gemma.json
    amfs-server bench retrieval intervals gemma.json --against minilm.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .conversation_bench import FUSION, METRICS

RESAMPLES = 10_000
SEED = 20261128
LEVEL = 0.95

Rows = list[dict[str, Any]]


class ReportError(ValueError):
    """A file that is not a usable `conversations --json` report, or two that cannot be paired; says which."""


def interval(values: Sequence[float], resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float, float]:
    """The mean of `values` and the bounds of its 95% percentile bootstrap interval (questions drawn with
    replacement, `resamples` times). Deterministic for a given seed."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("no values to resample")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    # In chunks: resamples x questions indices at once would be ~50 MB for 700 questions.
    for start in range(0, resamples, 1000):
        stop = min(resamples, start + 1000)
        means[start:stop] = data[rng.integers(0, data.size, size=(stop - start, data.size))].mean(axis=1)
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(data.mean()), float(low), float(high)


def conversation_of(row: dict[str, Any]) -> str:
    """The conversation a scored question belongs to (rows written before the field existed: from the question id,
    `ann-01-q001` -> `ann-01`)."""
    if "conversation" in row:
        return str(row["conversation"])
    return str(row["id"]).rsplit("-q", 1)[0]


def paired(mine: Rows, theirs: Rows, metric: str, resamples: int = RESAMPLES) -> dict[str, Any]:
    """`mine` minus `theirs`, question by question (paired on the question id): the mean difference, its interval,
    and per conversation whether the difference is positive, negative or nil."""
    by_id = {row["id"]: row for row in theirs}
    if {row["id"] for row in mine} != set(by_id) or len(by_id) != len(mine):
        only_mine = len({row["id"] for row in mine} - set(by_id))
        only_theirs = len(set(by_id) - {row["id"] for row in mine})
        raise ReportError(f"the two runs asked different questions ({only_mine} only in one, {only_theirs} only in "
                          "the other): compare runs of the same data set, split and --conversations")
    differences = [row[metric] - by_id[row["id"]][metric] for row in mine]
    mean, low, high = interval(differences, resamples)
    per_conversation: dict[str, list[float]] = {}
    for row, difference in zip(mine, differences):
        per_conversation.setdefault(conversation_of(row), []).append(difference)
    signs = [float(np.mean(values)) for values in per_conversation.values()]
    return {"difference": mean, "low": low, "high": high, "conversations": len(signs),
            "ahead": sum(s > 1e-12 for s in signs), "behind": sum(s < -1e-12 for s in signs)}


def load_report(path: Path) -> dict[str, dict[str, Rows]]:
    """run name -> ranker -> scored questions, from a `conversations --json` file."""
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file (write one with `amfs-server bench retrieval conversations "
                          "... --json FILE`)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ReportError(f"{path}: not JSON ({error})") from None
    runs = report.get("runs") if isinstance(report, dict) else None
    if not isinstance(runs, dict) or not runs or not all(
            isinstance(run, dict) and isinstance(run.get("questions"), dict) for run in runs.values()):
        raise ReportError(f"{path}: not a report of `amfs-server bench retrieval conversations --json` (it has no "
                          "runs with per-question scores)")
    loaded: dict[str, dict[str, Rows]] = {}
    for name, run in runs.items():
        rankers = {ranker: rows for ranker, rows in run["questions"].items() if rows}
        for ranker, rows in rankers.items():
            if not all(isinstance(r, dict) and "id" in r and all(m in r for m in METRICS) for r in rows):
                raise ReportError(f"{path}: run {name!r}, ranker {ranker!r}: rows without an id or {METRICS}")
        loaded[name] = rankers
    return loaded


def _cell(mean: float, low: float, high: float, signed: bool = False) -> str:
    form = "{:+.3f}" if signed else "{:.3f}"
    return f"{form.format(mean)} [{form.format(low)}, {form.format(high)}]"


def _ahead(result: dict[str, Any]) -> str:
    return f"{result['ahead']} up / {result['behind']} down of {result['conversations']}"


def reference_of(rankers: dict[str, Rows], asked: str | None) -> str:
    """The ranker the others are compared with: the one asked for, else the fusion as configured (named
    `... via MCP` in a `--via-mcp` report)."""
    if asked is not None:
        return asked
    return next((name for name in (FUSION, FUSION + " via MCP") if name in rankers), FUSION)


def within_run(name: str, rankers: dict[str, Rows], asked: str | None, resamples: int = RESAMPLES) -> str:
    reference = reference_of(rankers, asked)
    if reference not in rankers:
        raise ReportError(f"run {name!r} has no ranker {reference!r} (it has: {', '.join(rankers)})")
    rows = rankers[reference]
    conversations = len({conversation_of(r) for r in rows})
    lines = [f"### {name}: {len(rows)} questions, {conversations} conversations; 95% intervals, questions resampled "
             f"{resamples:,} times", "", "| ranker | recall@10 | MRR@10 |", "| --- | --- | --- |"]
    for ranker, scored in rankers.items():
        lines.append(f"| {ranker} | " + " | ".join(_cell(*interval([r[m] for r in scored], resamples))
                                                   for m in METRICS) + " |")
    lines += ["", f"| {reference} minus | recall@10 | MRR@10 | conversations, recall@10 | conversations, MRR@10 |",
              "| --- | --- | --- | --- | --- |"]
    for ranker, scored in rankers.items():
        if ranker == reference:
            continue
        results = [paired(rows, scored, m, resamples) for m in METRICS]
        lines.append(f"| {ranker} | " + " | ".join(_cell(r["difference"], r["low"], r["high"], signed=True)
                                                   for r in results)
                     + " | " + " | ".join(_ahead(r) for r in results) + " |")
    return "\n".join(lines + [""])


def across_reports(mine: dict[str, dict[str, Rows]], theirs: dict[str, dict[str, Rows]], asked: str | None,
                   labels: tuple[str, str], resamples: int = RESAMPLES) -> str:
    common = [name for name in mine if name in theirs]
    if not common:
        raise ReportError(f"the two files share no run (one has {', '.join(mine)}, the other {', '.join(theirs)}): "
                          "run both with the same --stores / --via-mcp")
    reference = reference_of(mine[common[0]], asked)
    lines = [f"### {labels[0]} minus {labels[1]}, ranker {reference!r}: 95% intervals, questions resampled "
             f"{resamples:,} times", "",
             "| run | questions | recall@10 | MRR@10 | conversations, recall@10 | conversations, MRR@10 |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name in common:
        if reference not in mine[name] or reference not in theirs[name]:
            raise ReportError(f"run {name!r}: ranker {reference!r} is missing from one of the files")
        results = [paired(mine[name][reference], theirs[name][reference], m, resamples) for m in METRICS]
        lines.append(f"| {name} | {len(mine[name][reference])} | "
                     + " | ".join(_cell(r["difference"], r["low"], r["high"], signed=True) for r in results)
                     + " | " + " | ".join(_ahead(r) for r in results) + " |")
    return "\n".join(lines + [""])


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="amfs-server bench retrieval intervals",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a file written by `amfs-server bench retrieval conversations --json`")
    parser.add_argument("--against", type=Path, default=None,
                        help="another such file: compare the two files' reference rankers question by question")
    parser.add_argument("--ranker", default=None,
                        help=f"the reference ranker (default: {FUSION!r}, or the same via MCP in a --via-mcp report)")
    parser.add_argument("--resamples", type=int, default=RESAMPLES, help=f"bootstrap resamples (default {RESAMPLES:,})")
    args = parser.parse_args(argv)
    if args.resamples < 100:
        parser.error("--resamples must be at least 100")
    try:
        mine = load_report(args.report)
        if args.against is None:
            text = "\n".join(within_run(name, rankers, args.ranker, args.resamples) for name, rankers in mine.items())
        else:
            text = across_reports(mine, load_report(args.against), args.ranker,
                                  (args.report.name, args.against.name), args.resamples)
    except ReportError as error:
        parser.error(str(error))
    print(text)
    return text


if __name__ == "__main__":
    main()
