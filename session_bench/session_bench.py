"""The five-mode session benchmark: does the prefix channel answer as well as text, for a fraction of the prompt?

A session writes facts as memories (``AsyncAgentMemory`` over a temporary SQLite store, MiniLM
embeddings), then asks targeted-recall questions; a hit is the expected keyword in the answer,
case-insensitive (the protocol of the report this benchmark answers). Modes:

=================  ==================================================================================
D_full_history     every fact in the prompt, as text (the ceiling)
B_flat_cos         plain cosine over MiniLM embeddings of the facts; the top-k as text
B_ams_text         this product's ``retrieve()`` (semantic + keyword + recency + confidence, RRF); top-k as text
A_ams_prefix       the same retrieved memories as compiled key/value caches; the prompt holds only the question
C_ams_hybrid       the compiled caches plus the top-1 memory as text
=================  ==================================================================================

Every mode generates through ``worker.answer_from_memories`` (the ``amfs_answer`` tool's code), one
greedy loop for all, so times compare. Queries run mode after mode for each question (interleaved), so
a machine that gets busier mid-run slows every mode alike. Memories are compiled when written (a
write-time cost, reported apart); a query's ``compile_ms`` is the cache lookup.

    amfs-server bench session --backbone smollm2 --n-facts 20
    amfs-server bench session --backbone smollm2 --large --seeds 0,1,2
    python -m amfs_server.session_bench.session_bench --backbone tiny-random-qwen2 --max-new-tokens 4

Writes ``report.json``, ``report.md`` and ``report.png`` to ``--out`` (default
``reports/session/<backbone>-n<N>/``, ``-large`` for the generated sessions); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..core.embedding import Embedder
from .session_data import Session, generated_session, report_session
from .worker import AnswerMode, MemoryText, answer_from_memories

ModeName = Literal["D_full_history", "B_flat_cos", "B_ams_text", "A_ams_prefix", "C_ams_hybrid"]
MODES: tuple[ModeName, ...] = ("D_full_history", "B_flat_cos", "B_ams_text", "A_ams_prefix", "C_ams_hybrid")
# How each benchmark mode is served: which generation mode, and where its memories come from.
GENERATION_MODE: dict[ModeName, AnswerMode] = {
    "D_full_history": "full", "B_flat_cos": "text", "B_ams_text": "text", "A_ams_prefix": "prefix",
    "C_ams_hybrid": "hybrid",
}
RETRIEVAL: dict[ModeName, str] = {
    "D_full_history": "none", "B_flat_cos": "flat_cos", "B_ams_text": "ams", "A_ams_prefix": "ams",
    "C_ams_hybrid": "ams",
}
DEFAULT_TOP_K = 3
DEFAULT_MAX_NEW_TOKENS = 30  # the report's mt=30
DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"
LARGE_FACTS = 60
LARGE_PEOPLE = 6
# Targets this benchmark is judged by (the bar): A's prefilled tokens vs D's, A/C time vs B_ams_text's.
TARGET_INPUT_TOKEN_RATIO = 0.15
TARGET_GENERATE_RATIO = 1.10
BOOTSTRAP_RESAMPLES = 2000


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------

def wilson_interval(hits: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval for a proportion (sound at 0/n and n/n, unlike the normal interval)."""
    if n == 0:
        return (0.0, 1.0)
    p = hits / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_mean_interval(values: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the mean (timings are skewed, so no normality is assumed)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return (float("nan"), float("nan"))
    if data.size == 1:
        return (float(data[0]), float(data[0]))
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(BOOTSTRAP_RESAMPLES, data.size))].mean(axis=1)
    return (float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)))


# ---------------------------------------------------------------------------
# One session
# ---------------------------------------------------------------------------

@dataclass
class QueryResult:
    mode: ModeName
    session: str
    question: str
    expected: str
    answer: str
    hit: bool
    gold_retrieved: bool | None  # the answering fact among the memories given (None for D: it gets all)
    memories: list[str]
    input_tokens: int
    prefix_tokens: int
    new_tokens: int
    retrieve_ms: float
    compile_ms: float
    ttft_ms: float
    generate_ms: float


@dataclass
class SessionRun:
    session: str
    n_facts: int
    n_queries: int
    write_ms: float
    compile_ms_total: float
    memories_compiled: int
    results: list[QueryResult] = field(default_factory=list)


class FlatCosine:
    """B_flat_cos: plain cosine over the embedder's vectors of the fact texts, nothing else."""

    def __init__(self, embedder: Embedder, memories: Sequence[MemoryText]) -> None:
        self.embedder = embedder
        self.matrix = np.asarray(embedder.embed([m.text for m in memories]), dtype=np.float32)

    def top(self, question: str, k: int) -> list[int]:
        query = np.asarray(self.embedder.embed([question]), dtype=np.float32)[0]
        scores = self.matrix @ query
        return [int(i) for i in np.argsort(-scores, kind="stable")[:k]]


async def _open_memory(data_dir: Path, embedder: Embedder | None) -> Any:
    """An AsyncAgentMemory over a fresh SQLite store with ``embedder`` (an object, so tests can pass a double)."""
    from ..adapters import create_store
    from ..core.service import MemoryService, ServiceConfig
    from ..sdk import AsyncAgentMemory

    store = create_store(data_dir / "amfs.db", None, embedding_dimension=embedder.dimension if embedder else 384)
    service = MemoryService(store, ServiceConfig(), embedder=embedder)
    await service.open()  # AsyncAgentMemory takes a given service as open, and closes it
    return AsyncAgentMemory(agent_id="session-bench", service=service)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def run_session(session: Session, backbone: Any, compiler: Any, embedder: Embedder | None,
                      modes: Sequence[ModeName], top_k: int, max_new_tokens: int) -> SessionRun:
    """Write the session's facts as memories, then ask every question in every mode (interleaved)."""
    from ..core.service import WriteRequest

    with tempfile.TemporaryDirectory(prefix="amfs-session-bench-") as tmp:
        memory = await _open_memory(Path(tmp), embedder)
        try:
            started = time.perf_counter()
            entries = await memory.write_many([WriteRequest(f.entity_path, f.key, f.text) for f in session.facts])
            write_ms = (time.perf_counter() - started) * 1000
            texts = [MemoryText.of(e) for e in entries]
            path_of = {t.memory_id: f"{e.entity_path}/{e.key}" for t, e in zip(texts, entries)}
            before = compiler.stats.compiled
            started = time.perf_counter()
            if {"A_ams_prefix", "C_ams_hybrid"} & set(modes):
                for t in texts:  # what the product does when a memory is written or first used
                    compiler.compile(t.memory_id, t.text)
            run = SessionRun(session.name, len(session.facts), len(session.queries), write_ms,
                             (time.perf_counter() - started) * 1000, compiler.stats.compiled - before)
            flat = None
            if "B_flat_cos" in modes:
                if embedder is None:
                    raise SystemExit("session bench: B_flat_cos needs an embedder; pass --embedder all-MiniLM-L6-v2 "
                                     "or leave B_flat_cos out of --modes")
                flat = FlatCosine(embedder, texts)
            hits = {m: 0 for m in modes}
            for qi, query in enumerate(session.queries, start=1):
                for mode in modes:
                    started = time.perf_counter()
                    kind = RETRIEVAL[mode]
                    if kind == "none":
                        given = texts
                    elif kind == "flat_cos":
                        assert flat is not None
                        given = [texts[i] for i in flat.top(query.question, top_k)]
                    else:
                        retrieved = await memory.retrieve(query.question, limit=top_k)
                        given = [MemoryText.of(hit.entry) for hit in retrieved]
                    retrieve_ms = (time.perf_counter() - started) * 1000 if kind != "none" else 0.0
                    gen = answer_from_memories(backbone, compiler, query.question, GENERATION_MODE[mode], given,
                                               max_new_tokens)
                    paths = [path_of.get(g.memory_id, g.memory_id) for g in given]
                    hit = query.hit(gen.answer)
                    hits[mode] += hit
                    m = gen.metrics
                    run.results.append(QueryResult(
                        mode=mode, session=session.name, question=query.question, expected=query.expected,
                        answer=gen.answer, hit=hit, gold_retrieved=None if kind == "none" else query.fact_path in paths,
                        memories=paths, input_tokens=m.input_tokens, prefix_tokens=m.prefix_tokens,
                        new_tokens=m.new_tokens, retrieve_ms=retrieve_ms, compile_ms=gen.compile_ms,
                        ttft_ms=m.ttft_ms, generate_ms=m.generate_ms,
                    ))
                    _progress(f"[{session.name}] {mode:<15} query {qi}/{len(session.queries)} "
                              f"{'hit ' if hit else 'miss'} running hit-rate {hits[mode]}/{qi} "
                              f"({hits[mode] / qi:.0%}) gen {m.generate_ms:.0f} ms  {gen.answer[:60]!r}")
        finally:
            await memory.close()
    return run


# ---------------------------------------------------------------------------
# Aggregation and reports
# ---------------------------------------------------------------------------

def summarize(results: Sequence[QueryResult], modes: Sequence[ModeName]) -> dict[str, dict[str, Any]]:
    summary: dict[str, dict[str, Any]] = {}
    for i, mode in enumerate(modes):
        rows = [r for r in results if r.mode == mode]
        n = len(rows)
        hits = sum(r.hit for r in rows)
        gold = [r.gold_retrieved for r in rows if r.gold_retrieved is not None]

        def mean(attr: str) -> float:
            return float(np.mean([getattr(r, attr) for r in rows])) if rows else float("nan")

        summary[mode] = {
            "n": n, "hits": hits, "hit_rate": hits / n if n else float("nan"),
            "hit_rate_ci95": list(wilson_interval(hits, n)),
            "retrieval_recall": (sum(gold) / len(gold)) if gold else None,
            "avg_input_tokens": mean("input_tokens"), "avg_prefix_tokens": mean("prefix_tokens"),
            "avg_new_tokens": mean("new_tokens"),
            "avg_retrieve_ms": mean("retrieve_ms"),
            "avg_retrieve_ms_ci95": list(bootstrap_mean_interval([r.retrieve_ms for r in rows], seed=i)),
            "avg_compile_ms": mean("compile_ms"), "avg_ttft_ms": mean("ttft_ms"),
            "avg_generate_ms": mean("generate_ms"),
            "avg_generate_ms_ci95": list(bootstrap_mean_interval([r.generate_ms for r in rows], seed=100 + i)),
            "avg_ms_per_new_token": (sum(r.generate_ms for r in rows) / max(1, sum(r.new_tokens for r in rows))),
        }
    return summary


def targets(summary: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's bar, where the modes it compares were run."""
    out: dict[str, Any] = {}
    a, b, c, d = (summary.get(m) for m in ("A_ams_prefix", "B_ams_text", "C_ams_hybrid", "D_full_history"))
    if a and b:
        out["A_hit_rate_minus_B_ams_text"] = a["hit_rate"] - b["hit_rate"]
        out["A_hit_rate_at_least_B_ams_text"] = a["hit_rate"] >= b["hit_rate"]
        out["A_generate_ms_vs_B_ams_text"] = a["avg_generate_ms"] / b["avg_generate_ms"]
        out["A_generate_within_1.1x"] = out["A_generate_ms_vs_B_ams_text"] <= TARGET_GENERATE_RATIO
    if c and b:
        out["C_generate_ms_vs_B_ams_text"] = c["avg_generate_ms"] / b["avg_generate_ms"]
        out["C_generate_within_1.1x"] = out["C_generate_ms_vs_B_ams_text"] <= TARGET_GENERATE_RATIO
    if a and d:
        out["A_input_tokens_vs_D"] = a["avg_input_tokens"] / d["avg_input_tokens"]
        out["A_input_tokens_within_15pct"] = out["A_input_tokens_vs_D"] <= TARGET_INPUT_TOKEN_RATIO
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    sessions = ", ".join(f"{s['session']} ({s['n_facts']} facts, {s['n_queries']} queries)" for s in report["sessions"])
    lines = [
        f"# Session benchmark: {cfg['backbone']}, {report['title']}",
        "",
        f"Backbone `{cfg['backbone']}` ({cfg['device']}, {cfg['dtype']}); embedder `{cfg['embedder']}`; "
        f"top-k {cfg['top_k']}; max new tokens {cfg['max_new_tokens']}; greedy; torch threads {cfg['torch_threads']}. "
        f"Sessions: {sessions}. "
        "Hit = expected keyword in the answer (case-insensitive). 95% CIs: Wilson for hit-rates, "
        "percentile bootstrap of the mean for times.",
        "",
        "| Mode | Hit-rate (95% CI) | Gold in top-k | avg input tokens (prefilled) | avg reused prefix tokens "
        "| avg retrieve ms | avg generate ms (95% CI) | avg TTFT ms | avg new tokens |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, s in report["summary"].items():
        lo, hi = s["hit_rate_ci95"]
        glo, ghi = s["avg_generate_ms_ci95"]
        recall = "-" if s["retrieval_recall"] is None else _pct(s["retrieval_recall"])
        lines.append(
            f"| {mode} | {_pct(s['hit_rate'])} ({s['hits']}/{s['n']}; {_pct(lo)}-{_pct(hi)}) | {recall} "
            f"| {s['avg_input_tokens']:.0f} | {s['avg_prefix_tokens']:.0f} | {s['avg_retrieve_ms']:.1f} "
            f"| {s['avg_generate_ms']:.0f} ({glo:.0f}-{ghi:.0f}) | {s['avg_ttft_ms']:.0f} | {s['avg_new_tokens']:.1f} |"
        )
    t = report["targets"]
    lines += ["", "## Targets", ""]
    if "A_hit_rate_at_least_B_ams_text" in t:
        lines.append(f"- A hit-rate >= B_ams_text: **{'met' if t['A_hit_rate_at_least_B_ams_text'] else 'not met'}** "
                     f"(A - B = {100 * t['A_hit_rate_minus_B_ams_text']:+.0f} points)")
    if "A_input_tokens_vs_D" in t:
        lines.append(f"- A input tokens <= 15% of D: **{'met' if t['A_input_tokens_within_15pct'] else 'not met'}** "
                     f"({_pct(t['A_input_tokens_vs_D'])} of D)")
    for m in ("A", "C"):
        if f"{m}_generate_ms_vs_B_ams_text" in t:
            lines.append(f"- {m} generate ms <= 1.1x B_ams_text: "
                         f"**{'met' if t[f'{m}_generate_within_1.1x'] else 'not met'}** "
                         f"({t[f'{m}_generate_ms_vs_B_ams_text']:.2f}x)")
    lines += ["", "Write-time costs: " + "; ".join(
        f"{s['session']}: write {s['write_ms']:.0f} ms, compiled {s['memories_compiled']} memories in "
        f"{s['compile_ms_total']:.0f} ms" for s in report["sessions"]) + ".", "",
        f"Command: `{report['command']}`", ""]
    if cfg.get("is_random_backbone"):
        lines.insert(2, "**The backbone is randomly initialised (a test model): its answers are noise.**\n")
    return "\n".join(lines)


def chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = report["summary"]
    modes = list(summary)
    x = np.arange(len(modes))
    colors = ["#7f7f7f", "#9ecae1", "#3182bd", "#e6550d", "#fd8d3c"][: len(modes)]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    rates = [summary[m]["hit_rate"] * 100 for m in modes]
    # Clipped at 0: at 0/n or n/n the Wilson bound equals the rate up to rounding.
    err = np.clip(np.array([[r - summary[m]["hit_rate_ci95"][0] * 100, summary[m]["hit_rate_ci95"][1] * 100 - r]
                            for m, r in zip(modes, rates)]).T, 0, None)
    axes[0].bar(x, rates, color=colors, yerr=err, capsize=4)
    axes[0].set_ylim(0, 105)
    axes[0].set_title("hit-rate % (95% Wilson CI)")
    prefilled = [summary[m]["avg_input_tokens"] for m in modes]
    reused = [summary[m]["avg_prefix_tokens"] for m in modes]
    axes[1].bar(x, prefilled, color=colors, label="prefilled")
    axes[1].bar(x, reused, bottom=prefilled, color="none", edgecolor="#555555", hatch="//", label="reused prefix")
    axes[1].set_title("avg input tokens (prefilled; hatched: reused)")
    axes[1].legend(loc="upper right", fontsize=8)
    gen = [summary[m]["avg_generate_ms"] for m in modes]
    gerr = np.clip(np.array([[g - summary[m]["avg_generate_ms_ci95"][0], summary[m]["avg_generate_ms_ci95"][1] - g]
                             for m, g in zip(modes, gen)]).T, 0, None)
    axes[2].bar(x, gen, color=colors, yerr=gerr, capsize=4)
    axes[2].set_title("avg generate ms (95% bootstrap CI)")
    for ax in axes:
        ax.set_xticks(x, [m.replace("_", "\n", 1) for m in modes], fontsize=8)
    fig.suptitle(f"{report['config']['backbone']}: {report['title']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="amfs-server bench session", description=__doc__.split("\n\n")[0])
    p.add_argument("--backbone", default="smollm2",
                   help="smollm2 (default; CPU), qwen2.5-1.5b, a local model directory, or tiny-random-qwen2 (tests)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--n-facts", type=int, default=10, choices=(10, 20), help="the report's session size")
    p.add_argument("--large", action="store_true", help="generated sessions (60 facts, 60 queries each) per seed")
    p.add_argument("--large-facts", type=int, default=LARGE_FACTS, help="facts per generated session")
    p.add_argument("--large-queries", type=int, default=None, help="queries per generated session (default: all)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds for --large")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    p.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help="memories given to the retrieval modes")
    p.add_argument("--key-scale", type=float, default=None,
                   help="prefix modes: multiply the keys of memories after the top-1 (below 1 trusts the top-1 "
                        "more; default 0.8, 1.0 = plain concatenation)")
    p.add_argument("--embedder", default=DEFAULT_EMBEDDER, help="all-MiniLM-L6-v2 (default) or none")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--out", type=Path, default=None, help="report directory (default reports/session/<backbone>-n<N>)")
    args = p.parse_args(argv)
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.mode_list if m not in MODES]
    if unknown or not args.mode_list:
        p.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    args.mode_list = [m for m in MODES if m in args.mode_list]  # canonical order
    if args.top_k < 1:
        p.error("--top-k must be >= 1")
    args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.argv = None if argv is None else list(argv)
    return args


def _slug(spec: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "-" for ch in Path(spec).name or spec).strip("-")


def _load(args: argparse.Namespace) -> tuple[Any, Any, Embedder | None]:
    from .backbone import BackboneUnavailable, load_backbone
    from .prefix_cache import MemoryCompiler

    try:
        backbone = load_backbone(args.backbone, device=args.device)
    except BackboneUnavailable as error:
        raise SystemExit(f"session bench: {error}") from None
    embedder = None
    if args.embedder.strip().lower() not in ("none", "off", ""):
        from ..core.embedding import load_embedder

        embedder = load_embedder(args.embedder)
    scale = {} if args.key_scale is None else {"key_scale": args.key_scale}
    return backbone, MemoryCompiler(backbone, **scale), embedder


def _warm_up(backbone: Any, compiler: Any) -> None:
    """One untimed answer per generation mode, so first-call costs (allocations, kernels) land nowhere."""
    memories = [MemoryText("warm-up/a@v1", "The sky is blue."), MemoryText("warm-up/b@v1", "Grass is green.")]
    for mode in ("text", "prefix", "hybrid"):
        answer_from_memories(backbone, compiler, "What colour is the sky?", mode, memories, 4)


def run_benchmark(args: argparse.Namespace, *, embedder: Embedder | None = None, loaded: Any = None) -> dict[str, Any]:
    """Run the configured sessions and write the reports; ``loaded`` = (backbone, compiler, embedder) to reuse."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    backbone, compiler, loaded_embedder = loaded if loaded is not None else _load(args)
    embedder = embedder or loaded_embedder
    if args.large:
        sessions = [generated_session(seed, n_people=LARGE_PEOPLE, n_facts=args.large_facts,
                                      n_queries=args.large_queries) for seed in args.seed_list]
        title = (f"generated sessions x{len(sessions)} (seeds {args.seeds}; {args.large_facts} facts, "
                 f"{len(sessions[0].queries)} queries each)")
        default_out = f"{_slug(args.backbone)}-large"
    else:
        sessions = [report_session(args.n_facts)]
        title = f"report session N={args.n_facts} ({args.n_facts} facts, {len(sessions[0].queries)} queries)"
        default_out = f"{_slug(args.backbone)}-n{args.n_facts}"
    out = args.out or Path("reports") / "session" / default_out
    _progress(f"session bench: {backbone.name} on {backbone.device} ({backbone.dtype}), loaded in "
              f"{backbone.load_seconds:.1f}s; {title}; modes {', '.join(args.mode_list)}; top-k {args.top_k}")
    _warm_up(backbone, compiler)
    started = time.perf_counter()
    runs = [asyncio.run(run_session(s, backbone, compiler, embedder, args.mode_list, args.top_k, args.max_new_tokens))
            for s in sessions]
    results = [r for run in runs for r in run.results]
    summary = summarize(results, args.mode_list)
    report: dict[str, Any] = {
        "title": title,
        "command": "amfs-server bench session " + " ".join(sys.argv[1:] if args.argv is None else args.argv),
        "config": {
            "backbone": backbone.name, "backbone_spec": args.backbone, "source": backbone.source,
            "is_random_backbone": backbone.is_random, "device": str(backbone.device),
            "dtype": str(backbone.dtype).replace("torch.", ""),
            "embedder": getattr(embedder, "name", "none") if embedder is not None else "none",
            "top_k": args.top_k, "max_new_tokens": args.max_new_tokens, "modes": args.mode_list,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "machine": platform.machine(), "order": "interleaved per query",
            "key_scale": compiler.key_scale,
        },
        "summary": summary,
        "targets": targets(summary),
        "sessions": [{k: v for k, v in asdict(run).items() if k != "results"} for run in runs],
        "wall_s": time.perf_counter() - started,
        "queries": [asdict(r) for r in results],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    (out / "report.md").write_text(markdown(report), encoding="utf-8")
    chart(report, out / "report.png")
    _progress(f"session bench: wrote {out}/report.json, report.md, report.png in {report['wall_s']:.0f}s")
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report = run_benchmark(args)
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
