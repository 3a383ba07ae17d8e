"""How sure a retrieval benchmark's figures are: paired bootstrap intervals over its questions.

Reads what `amfs-server bench retrieval conversations --json FILE` wrote, or the `quality.json` of `amfs-server bench
retrieval quality` (the agent-memory set): every question's scores per ranker. For one file: each ranker's mean with
its 95% interval, and the reference ranker (the fusion as configured) against every other ranker, question by
question. With `--against OTHER`: the reference ranker of FILE against the same ranker of OTHER (another embedder,
another release), paired on the question ids, run by run (sqlite with sqlite, ...).

Intervals resample the questions (10,000 times, percentile method, a fixed seed). Questions of one conversation (or,
on the agent-memory set, of one service) are not independent, and resampling questions treats them as if they were,
so the intervals are narrower than the uncertainty about another conversation; the last columns, how many
conversations (services) each difference points the same way in, are the cruder check on that.

    amfs-server bench retrieval conversations --dataset session_bench/data/conversations_annotated.json --split test --json minilm.json
    amfs-server bench retrieval intervals minilm.json
    amfs-server bench retrieval conversations --dataset ... --split test --embedder embeddinggemma --json gemma.json
    amfs-server bench retrieval intervals gemma.json --against minilm.json
    amfs-server bench retrieval intervals all.json --split test      # one half of a `conversations --split all` run
    amfs-server bench retrieval quality --out reports/retrieval && amfs-server bench retrieval intervals reports/retrieval/quality.json --half odd
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .conversation_bench import FUSION
from .retrieval_bench import QUALITY_FUSION

# The scores a report may hold per question, in the order they are printed, with their printed names.
METRICS = {"recall@5": "recall@5", "recall@10": "recall@10", "mrr@10": "MRR@10", "mrr": "MRR"}
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


def group_of(row: dict[str, Any]) -> str:
    """The conversation (agent-memory set: the service) a scored question belongs to; rows written before either
    field existed: from the question id, `ann-01-q001` -> `ann-01`."""
    for field in ("group", "conversation"):
        if field in row:
            return str(row[field])
    return str(row["id"]).rsplit("-q", 1)[0]


def metrics_of(rows: Rows) -> list[str]:
    """The scores every row holds, in print order."""
    return [m for m in METRICS if all(m in row for row in rows)]


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
        per_conversation.setdefault(group_of(row), []).append(difference)
    signs = [float(np.mean(values)) for values in per_conversation.values()]
    return {"difference": mean, "low": low, "high": high, "conversations": len(signs),
            "ahead": sum(s > 1e-12 for s in signs), "behind": sum(s < -1e-12 for s in signs)}


class Report:
    """A loaded report: run name -> ranker -> scored questions, and what its questions are grouped by."""

    def __init__(self, runs: dict[str, dict[str, Rows]], unit: str) -> None:
        self.runs, self.unit = runs, unit


def load_report(path: Path, half: str | None = None, kind: str | None = None, split: str | None = None) -> Report:
    """A `conversations --json` file (its runs) or a `quality.json` (its stores); `half` keeps the agent-memory
    set's even (tuning) or odd (held-out) questions, `split` a conversation set's tuning or test half (so a
    `--split all` run gives each half's intervals without a second run), `kind` the questions of one kind."""
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file (write one with `amfs-server bench retrieval conversations "
                          "... --json FILE` or `amfs-server bench retrieval quality`)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ReportError(f"{path}: not JSON ({error})") from None
    runs = None
    if isinstance(report, dict):
        runs = report.get("runs") if "runs" in report else report.get("stores")
    if not isinstance(runs, dict) or not runs or not all(
            isinstance(run, dict) and isinstance(run.get("questions"), dict) for run in runs.values()):
        raise ReportError(f"{path}: not a report of `amfs-server bench retrieval conversations --json` or `quality` "
                          "with per-question scores (a quality.json from before `intervals` existed has none: run the benchmark again)")
    loaded: dict[str, dict[str, Rows]] = {}
    for name, run in runs.items():
        rankers = {ranker: rows for ranker, rows in run["questions"].items() if rows}
        for ranker, rows in rankers.items():
            if not all(isinstance(r, dict) and "id" in r for r in rows) or "recall@10" not in metrics_of(rows):
                raise ReportError(f"{path}: run {name!r}, ranker {ranker!r}: rows without an id or scores")
            if half is not None:
                if not all("half" in r for r in rows):
                    raise ReportError(f"{path}: --half is for the agent-memory set's quality.json; this report's "
                                      "questions have no halves")
                rankers[ranker] = [r for r in rows if r["half"] == half]
            if split is not None:
                splits = sorted({str(r.get("split")) for r in rows})
                if not all("split" in r for r in rows):
                    raise ReportError(f"{path}: --split is for a `conversations --json` report; this report's "
                                      "questions carry no split (the agent-memory set's halves are --half)")
                if split not in splits:
                    raise ReportError(f"{path}: no question of the {split} half (this report holds: "
                                      f"{', '.join(splits)}; run `conversations --split {split}` or `--split all`)")
                rankers[ranker] = [r for r in rankers[ranker] if r["split"] == split]
            if kind is not None:
                kinds = sorted({str(r.get("kind")) for r in rows})
                if kind not in kinds:
                    raise ReportError(f"{path}: no question of kind {kind!r} (kinds: {', '.join(kinds)})")
                rankers[ranker] = [r for r in rankers[ranker] if r.get("kind") == kind]
        loaded[name] = rankers
    first = next(rows for rankers in loaded.values() for rows in rankers.values())
    return Report(loaded, "services" if "group" in first[0] else "conversations")


def interval_cell(mean: float, low: float, high: float, signed: bool = False) -> str:
    form = "{:+.3f}" if signed else "{:.3f}"
    return f"{form.format(mean)} [{form.format(low)}, {form.format(high)}]"


def direction_cell(result: dict[str, Any]) -> str:
    return f"{result['ahead']} up / {result['behind']} down of {result['conversations']}"


def reference_of(rankers: dict[str, Rows], asked: str | None) -> str:
    """The ranker the others are compared with: the one asked for, else the default fusion (named `... via MCP`
    in a `--via-mcp` report, and otherwise in the agent-memory benchmark's)."""
    if asked is not None:
        return asked
    return next((name for name in (FUSION, FUSION + " via MCP", QUALITY_FUSION) if name in rankers), FUSION)


def reference_rows(name: str, rankers: dict[str, Rows], asked: str | None) -> tuple[str, Rows]:
    """The reference ranker of run `name` and its scored questions, or ReportError naming the rankers it has."""
    reference = reference_of(rankers, asked)
    if reference not in rankers:
        raise ReportError(f"run {name!r} has no ranker {reference!r} (it has: {', '.join(rankers)})")
    return reference, rankers[reference]


def _table_head(first: str, metrics: list[str], unit: str) -> list[str]:
    names = [METRICS[m] for m in metrics]
    head = f"| {first} | " + " | ".join(names) + " | " + " | ".join(f"{unit}, {n}" for n in names) + " |"
    return [head, "| --- |" + " --- |" * (2 * len(names))]


def _difference_cells(mine: Rows, theirs: Rows, metrics: list[str], resamples: int) -> str:
    results = [paired(mine, theirs, m, resamples) for m in metrics]
    return (" | ".join(interval_cell(r["difference"], r["low"], r["high"], signed=True) for r in results)
            + " | " + " | ".join(direction_cell(r) for r in results))


def within_run(name: str, rankers: dict[str, Rows], asked: str | None, unit: str = "conversations",
               resamples: int = RESAMPLES, kind: str | None = None, split: str | None = None) -> str:
    reference, rows = reference_rows(name, rankers, asked)
    metrics = metrics_of(rows)
    only = (f" of the {split} half" if split else "") + (f" of kind {kind}" if kind else "")
    lines = [f"### {name}: {len(rows)} questions{only}, {len({group_of(r) for r in rows})} {unit}; 95% intervals, "
             f"questions resampled {resamples:,} times", "",
             "| ranker | " + " | ".join(METRICS[m] for m in metrics) + " |", "| --- |" + " --- |" * len(metrics)]
    for ranker, scored in rankers.items():
        lines.append(f"| {ranker} | " + " | ".join(interval_cell(*interval([r[m] for r in scored], resamples))
                                                   for m in metrics) + " |")
    lines += ["", *_table_head(f"{reference} minus", metrics, unit)]
    for ranker, scored in rankers.items():
        if ranker != reference:
            lines.append(f"| {ranker} | " + _difference_cells(rows, scored, metrics, resamples) + " |")
    return "\n".join(lines + [""])


def plot(name: str, rankers: dict[str, Rows], asked: str | None, against: list[str] | None, path: Path,
         resamples: int = RESAMPLES, title: str | None = None) -> None:
    """A forest plot: the reference ranker minus each ranker of `against` (names or their beginnings; default every
    other ranker with scores of its own), overall and per question kind, one panel per score, 95% intervals."""
    from . import pyplot

    reference, rows = reference_rows(name, rankers, asked)
    chosen: list[str] = []
    for ranker, scored in rankers.items():
        wanted = against is None or any(ranker.startswith(prefix) for prefix in against)
        # Rankers that score every question alike (temporal and confidence equal semantic on conversations) once.
        if ranker == reference or not wanted or any(rankers[c] == scored for c in chosen):
            continue
        chosen.append(ranker)
    if not chosen:
        raise ReportError(f"--plot-against {','.join(against or [])!r} names no ranker of run {name!r} "
                          f"(it has: {', '.join(r for r in rankers if r != reference)})")
    kinds = ["all", *sorted({str(r.get("kind")) for r in rows})]
    metrics = [m for m in metrics_of(rows) if m != "recall@5"]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 0.5 + 0.45 * len(kinds) * len(chosen)),
                             sharey=True, squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for k, kind in enumerate(kinds):
            ids = {r["id"] for r in rows if kind == "all" or r.get("kind") == kind}
            for c, ranker in enumerate(chosen):
                result = paired([r for r in rows if r["id"] in ids],
                                [r for r in rankers[ranker] if r["id"] in ids], metric, resamples)
                y = k * (len(chosen) + 1) + c
                clear = result["low"] > 0 or result["high"] < 0
                ax.errorbar(result["difference"], y, xerr=[[result["difference"] - result["low"]],
                                                           [result["high"] - result["difference"]]],
                            fmt="o", color=f"C{c}", mfc=f"C{c}" if clear else "white",
                            capsize=3, label=ranker if k == 0 else None)
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.set_title(f"{METRICS[metric]}: {reference} minus ...", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.set_yticks([k * (len(chosen) + 1) + (len(chosen) - 1) / 2 for k in range(len(kinds))], kinds)
    axes[0][0].invert_yaxis()
    fig.suptitle(f"{title or name}: {len(rows)} questions, 95% intervals (filled: the interval excludes 0)", fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(3, len(chosen)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def across_reports(mine: Report, theirs: Report, asked: str | None, labels: tuple[str, str],
                   resamples: int = RESAMPLES) -> str:
    common = [name for name in mine.runs if name in theirs.runs]
    if not common:
        raise ReportError(f"the two files share no run (one has {', '.join(mine.runs)}, the other "
                          f"{', '.join(theirs.runs)}): run both with the same --stores / --via-mcp")
    reference = reference_of(mine.runs[common[0]], asked)
    metrics: list[str] = []
    lines: list[str] = []
    for name in common:
        if reference not in mine.runs[name] or reference not in theirs.runs[name]:
            raise ReportError(f"run {name!r}: ranker {reference!r} is missing from one of the files")
        ours, other = mine.runs[name][reference], theirs.runs[name][reference]
        metrics = metrics or [m for m in metrics_of(ours) if m in metrics_of(other)]
        lines.append(f"| {name} ({len(ours)} questions) | " + _difference_cells(ours, other, metrics, resamples) + " |")
    return "\n".join([f"### {labels[0]} minus {labels[1]}, ranker {reference!r}: 95% intervals, questions resampled "
                      f"{resamples:,} times", "", *_table_head("run", metrics, mine.unit), *lines, ""])


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="amfs-server bench retrieval intervals",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a file written by `amfs-server bench retrieval conversations --json`, "
                                                  "or the quality.json of `amfs-server bench retrieval quality`")
    parser.add_argument("--against", type=Path, default=None,
                        help="another such file: compare the two files' reference rankers question by question")
    parser.add_argument("--ranker", default=None,
                        help=f"the reference ranker (default: the default fusion, {FUSION!r} or its via-MCP or "
                             f"agent-memory name)")
    parser.add_argument("--resamples", type=int, default=RESAMPLES, help=f"bootstrap resamples (default {RESAMPLES:,})")
    parser.add_argument("--half", choices=("even", "odd"), default=None,
                        help="the agent-memory set only: its even (tuning) or odd (held-out) questions")
    parser.add_argument("--split", choices=("tuning", "test"), default=None,
                        help="a conversation set only: the questions of its tuning or test half (a `--split all` "
                             "report holds both)")
    parser.add_argument("--kind", default=None, help="only the questions of this kind (e.g. open-domain, paraphrase)")
    parser.add_argument("--plot", type=Path, default=None,
                        help="also draw the reference minus each ranker, overall and per kind, for the first run (PNG; "
                             "needs the [bench] extra)")
    parser.add_argument("--plot-against", default=None, metavar="NAMES",
                        help="comma-separated rankers (or their beginnings, e.g. semantic,rrf) for --plot "
                             "(default: every other ranker)")
    args = parser.parse_args(argv)
    if args.resamples < 100:
        parser.error("--resamples must be at least 100")
    if args.plot is not None and args.against is not None:
        parser.error("--plot draws one report's rankers; drop --against")
    try:
        mine = load_report(args.report, args.half, args.kind, args.split)
        if args.against is None:
            text = "\n".join(within_run(name, rankers, args.ranker, mine.unit, args.resamples, args.kind, args.split)
                             for name, rankers in mine.runs.items())
            if args.plot is not None:
                first = next(iter(mine.runs))
                against = [n.strip() for n in args.plot_against.split(",") if n.strip()] if args.plot_against else None
                plot(first, mine.runs[first], args.ranker, against, args.plot, args.resamples,
                     title=f"{args.report.name} ({first})")
        else:
            text = across_reports(mine, load_report(args.against, args.half, args.kind, args.split), args.ranker,
                                  (str(args.report), str(args.against)), args.resamples)
    except ReportError as error:
        parser.error(str(error))
    print(text)
    return text


if __name__ == "__main__":
    main()
