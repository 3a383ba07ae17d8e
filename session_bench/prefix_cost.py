"""What the prefix channel costs and saves: time to first token and answer time as memories grow.

The prefix channel's claim is cost, not accuracy: a memory is compiled once per version (one forward pass
after the prompt head) and every later question reuses its keys/values, so a question prefills only
itself. Text modes prefill every memory again for every question. This benchmark measures, for memories
of about ``--sizes`` tokens each and ``--top-k`` memories per question:

* ``text_topk``   the k memories as text (B_ams_text's prompt)
* ``text_top1``   only the first memory as text (B_text_top1's prompt)
* ``prefix``      the k memories as compiled caches, the prompt holds only the question (A_ams_prefix)
* ``hybrid``      the compiled caches plus the first memory as text (C_ams_hybrid)

each through ``worker.answer_from_memories`` (the ``amfs_answer`` tool's code), modes interleaved per
question so a machine that gets busier slows all of them alike. Memories are compiled before the timed
questions (the write-time cost, reported apart as ``compile_ms`` per memory); the break-even is the
number of questions that reuse a set of k memories after which compiling them once has paid for itself
against ``text_topk``: ``k * compile_ms / (ttft_text_topk - ttft_prefix)``.

``--via-server`` measures the same through the MCP tools of a server built with the backbone (an app from
``create_app`` over an in-memory client): each cell's memories are written with ``amfs_write`` under their
own entity path, and every answer is one ``amfs_answer`` call scoped to it (``mode`` text/prefix/hybrid,
``memories`` k, or 1 for text_top1), so retrieval, the worker's queue and the tool layer are in the times.
The first prefix call of a cell compiles its memories (untimed, its compile time reported); TTFT is what
the tool reports (retrieve + cache lookup + prefill to the first token), total is the call as the client
sees it.

    python -m amfs_server.session_bench.prefix_cost --backbone tiny-random-qwen2      # shape check
    python -m amfs_server.session_bench.prefix_cost --backbone smollm2 --reps 3      # the real figures
    python -m amfs_server.session_bench.prefix_cost --backbone smollm2 --via-server  # through amfs_answer

Writes ``report.json``, ``report.md`` and ``report.png`` to ``--out``
(default ``reports/session/prefix-cost-<backbone>/``, ``-server`` appended with ``--via-server``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import pyplot
from .served import ServedApp
from ..ml.answer.worker import MemoryText, answer_from_memories

COST_MODES = ("text_topk", "text_top1", "prefix", "hybrid")
_GENERATION = {"text_topk": "text", "text_top1": "text", "prefix": "prefix", "hybrid": "hybrid"}
# Filler sentences for memories of a given length: ordinary operational notes, varied so that no two
# memories share their token sequence.
_WORDS = ("the deploy pipeline for {svc} runs nightly and posts its report to the on-call channel; "
          "rollbacks need a second reviewer, the canary takes ten percent of traffic for twenty minutes, "
          "alerts page the owner after three failed health checks, and the staging database is refreshed "
          "from a masked snapshot every Monday morning before the planning meeting. ").split()
_SERVICES = ("billing", "search", "checkout", "ledger", "mailer", "gateway", "reports", "catalog", "auth",
             "inventory", "payments", "notify")


def make_memories(backbone: Any, layout: Any, n_tokens: int, count: int, scope: str = "cost") -> list[MemoryText]:
    """``count`` memories of about ``n_tokens`` tokens each (as note lines), each naming its own service,
    with ids ``<scope>/<service>/note@v1`` (a scope per cell, so a server-side retrieve sees only them)."""
    from ..ml.answer.prefix_cache import encode

    memories = []
    for i in range(count):
        svc = _SERVICES[i % len(_SERVICES)] + ("" if i < len(_SERVICES) else str(i))
        words = [f"Note {i + 1} about {svc}:"]
        j = i
        while len(encode(backbone, layout.memory_line(" ".join(words)))) < n_tokens:
            words.append(_WORDS[j % len(_WORDS)].format(svc=svc))
            j += 1
        memories.append(MemoryText(f"{scope}/{svc}/note@v1", " ".join(words)))
    return memories


def _median(values: Sequence[float]) -> float:
    return float(np.median(values)) if values else float("nan")


class InProcess:
    """Answers with ``answer_from_memories`` on the benchmark's own backbone and compiler."""

    def __init__(self, backbone: Any, compiler: Any) -> None:
        self.backbone, self.compiler = backbone, compiler

    async def prepare(self, memories: Sequence[MemoryText]) -> tuple[float, int]:
        """Compile the cell's memories (the write-time cost, once per version): (ms per memory, compiled)."""
        before = self.compiler.stats.compile_ms_total, self.compiler.stats.compiled
        for m in memories:
            self.compiler.compile(m.memory_id, m.text)
        compiled = self.compiler.stats.compiled - before[1]
        return (self.compiler.stats.compile_ms_total - before[0]) / max(1, compiled), compiled

    async def answer(self, mode: str, question: str, memories: Sequence[MemoryText],
                     max_new_tokens: int) -> dict[str, float]:
        given = list(memories[:1] if mode == "text_top1" else memories)
        started = time.perf_counter()
        gen = answer_from_memories(self.backbone, self.compiler, question, _GENERATION[mode], given, max_new_tokens)
        total_ms = (time.perf_counter() - started) * 1000
        m = gen.metrics
        return {"ttft_ms": m.ttft_ms + gen.compile_ms, "total_ms": total_ms, "input_tokens": m.input_tokens,
                "prefix_tokens": m.prefix_tokens, "new_tokens": m.new_tokens, "cache_lookup_ms": gen.compile_ms,
                "memories_given": len(given)}


class ViaServer(ServedApp):
    """Answers through ``amfs_answer`` of a server app built with the backbone, over an in-memory client."""

    def __init__(self, data_dir: Path, backbone_spec: str) -> None:
        super().__init__(data_dir, backbone_spec, "prefix cost --via-server")
        self.load_ms = 0.0

    @staticmethod
    def _scope(memories: Sequence[MemoryText]) -> str:
        return memories[0].memory_id.split("/", 1)[0]

    async def prepare(self, memories: Sequence[MemoryText]) -> tuple[float, int]:
        """Write the cell's memories with amfs_write; the first prefix answer compiles them (untimed)."""
        for m in memories:
            entity_path, key = m.memory_id.rsplit("@v", 1)[0].rsplit("/", 1)
            await self.call("amfs_write", {"entity_path": entity_path, "key": key, "value": m.text})
        first = await self.call("amfs_answer", {"query": "What are these notes about?", "mode": "prefix",
                                                 "entity_path": self._scope(memories), "memories": len(memories),
                                                 "max_new_tokens": 1})
        self.load_ms += first["metrics"]["load_ms"]
        compiled = first["metrics"]["compiled_now"]
        return first["metrics"]["compile_ms"] / max(1, compiled), compiled

    async def answer(self, mode: str, question: str, memories: Sequence[MemoryText],
                     max_new_tokens: int) -> dict[str, float]:
        started = time.perf_counter()
        result = await self.call("amfs_answer", {
            "query": question, "mode": _GENERATION[mode], "entity_path": self._scope(memories),
            "memories": 1 if mode == "text_top1" else len(memories), "max_new_tokens": max_new_tokens})
        total_ms = (time.perf_counter() - started) * 1000
        m = result["metrics"]
        return {"ttft_ms": m["retrieve_ms"] + m["queue_ms"] + m["compile_ms"] + m["ttft_ms"], "total_ms": total_ms,
                "input_tokens": m["input_tokens"], "prefix_tokens": m["prefix_tokens"], "new_tokens": m["new_tokens"],
                "cache_lookup_ms": m["compile_ms"], "retrieve_ms": m["retrieve_ms"],
                "memories_given": len(result["memories"])}


async def run(answerer: InProcess | ViaServer, backbone: Any, layout: Any, sizes: Sequence[int],
              top_ks: Sequence[int], reps: int, max_new_tokens: int) -> dict[str, Any]:
    from ..ml.answer.prefix_cache import encode

    cells = []
    for size in sizes:
        for k in top_ks:
            memories = make_memories(backbone, layout, size, k, scope=f"cost-{size}x{k}")
            tokens = [len(encode(backbone, layout.memory_line(m.text))) for m in memories]
            compile_ms, compiled = await answerer.prepare(memories)
            rows: dict[str, list[dict[str, float]]] = {m: [] for m in COST_MODES}
            for rep in range(reps):
                question = f"What happens after three failed health checks for {_SERVICES[rep % len(_SERVICES)]}?"
                for mode in COST_MODES:
                    rows[mode].append(await answerer.answer(mode, question, memories, max_new_tokens))
            cell = {"memory_tokens": size, "measured_memory_tokens": float(np.mean(tokens)), "top_k": k,
                    "compile_ms_per_memory": compile_ms, "memories_compiled": compiled, "modes": {}}
            for mode, rs in rows.items():
                cell["modes"][mode] = {
                    "median_ttft_ms": _median([r["ttft_ms"] for r in rs]),
                    "median_total_ms": _median([r["total_ms"] for r in rs]),
                    "avg_input_tokens": float(np.mean([r["input_tokens"] for r in rs])),
                    "avg_prefix_tokens": float(np.mean([r["prefix_tokens"] for r in rs])),
                    "avg_new_tokens": float(np.mean([r["new_tokens"] for r in rs])),
                    "runs": rs,
                }
            saved = cell["modes"]["text_topk"]["median_ttft_ms"] - cell["modes"]["prefix"]["median_ttft_ms"]
            cell["prefix_saves_ttft_ms"] = saved
            # Questions that must reuse the k compiled memories before compiling them paid for itself.
            cell["break_even_questions"] = (k * compile_ms / saved) if saved > 0 else None
            cells.append(cell)
            _progress(f"prefix cost: {size} tokens x top-{k}: " + ", ".join(
                f"{mode} ttft {cell['modes'][mode]['median_ttft_ms']:.0f} ms" for mode in COST_MODES)
                + f"; compile {compile_ms:.0f} ms/memory")
    return {"cells": cells}


def crossover(cells: Sequence[dict[str, Any]]) -> list[str]:
    """Plain statements of where prefix beats text_topk on time to first token, per top-k."""
    out = []
    for k in sorted({c["top_k"] for c in cells}):
        row = sorted((c for c in cells if c["top_k"] == k), key=lambda c: c["memory_tokens"])
        wins = [c["memory_tokens"] for c in row if c["prefix_saves_ttft_ms"] > 0]
        if not wins:
            out.append(f"top-{k}: prefix never starts answering sooner than the k memories as text at the sizes "
                       "measured")
        elif wins == [c["memory_tokens"] for c in row]:
            out.append(f"top-{k}: prefix starts answering sooner at every size measured (from "
                       f"{row[0]['memory_tokens']} tokens per memory)")
        else:
            out.append(f"top-{k}: prefix starts answering sooner at {', '.join(map(str, wins))} tokens per memory, "
                       f"not at {', '.join(str(c['memory_tokens']) for c in row if c['memory_tokens'] not in wins)}")
    return out


def markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [f"# Prefix channel cost: {cfg['backbone']}", ""]
    if cfg["is_random_backbone"]:
        lines += ["**The backbone is randomly initialised (a test model): a shape check, not a figure.**", ""]
    lines += [
        f"{cfg['device']}, {cfg['dtype']}, torch threads {cfg['torch_threads']}; {cfg['reps']} questions per cell, "
        f"max {cfg['max_new_tokens']} new tokens, greedy; medians. TTFT includes the cache lookup and prefix "
        "assembly for prefix/hybrid; compiling (once per memory version) is reported apart. "
        "Timings on a shared machine are noisy.", "",
        ("Path: **through the server**: memories written with amfs_write, every answer one amfs_answer call "
         "(TTFT = retrieve + queue + cache lookup + prefill to the first token, as the tool reports it; total = "
         "the call as the client sees it)." if cfg.get("path") == "server" else
         "Path: in process (answer_from_memories, the amfs_answer tool's code, without retrieval)."), "",
        "| memory tokens | top-k | compile ms/memory | " + " | ".join(f"{m} TTFT ms" for m in COST_MODES)
        + " | " + " | ".join(f"{m} total ms" for m in COST_MODES) + " | break-even questions |",
        "|" + "---|" * (3 + 2 * len(COST_MODES) + 1),
    ]
    for c in report["cells"]:
        be = "-" if c["break_even_questions"] is None else f"{c['break_even_questions']:.1f}"
        lines.append(
            f"| {c['memory_tokens']} ({c['measured_memory_tokens']:.0f}) | {c['top_k']} | {c['compile_ms_per_memory']:.0f} | "
            + " | ".join(f"{c['modes'][m]['median_ttft_ms']:.0f}" for m in COST_MODES) + " | "
            + " | ".join(f"{c['modes'][m]['median_total_ms']:.0f}" for m in COST_MODES) + f" | {be} |")
    lines += ["", "Crossover (TTFT, prefix vs the k memories as text):", ""]
    lines += [f"- {s}" for s in report["crossover"]]
    lines += ["", f"Command: `{report['command']}`", ""]
    return "\n".join(lines)


def chart(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    cells = report["cells"]
    colours = {"text_topk": "#3182bd", "text_top1": "#6baed6", "prefix": "#e6550d", "hybrid": "#fd8d3c"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, metric, title in ((axes[0], "median_ttft_ms", "time to first token (ms, median)"),
                              (axes[1], "median_total_ms", "answer time (ms, median)")):
        for k, style in zip(sorted({c["top_k"] for c in cells}), ("-", "--", ":", "-.")):
            row = sorted((c for c in cells if c["top_k"] == k), key=lambda c: c["memory_tokens"])
            x = [c["memory_tokens"] for c in row]
            for mode in COST_MODES:
                if mode == "text_top1" and k != min(c["top_k"] for c in cells):
                    continue  # the same prompt at every k
                ax.plot(x, [c["modes"][mode][metric] for c in row], style, marker="o", color=colours[mode],
                        label=f"{mode}" + ("" if mode == "text_top1" else f", top-{k}"))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sorted({c["memory_tokens"] for c in cells}), [str(s) for s in sorted({c["memory_tokens"]
                                                                                           for c in cells})])
        ax.tick_params(axis="x", which="minor", labelbottom=False)
        ax.set_xlabel("tokens per memory")
        ax.set_title(title)
    axes[1].legend(fontsize=7)
    cfg = report["config"]
    fig.suptitle(f"{cfg['backbone']} ({cfg['device']}, {cfg.get('path', 'in-process')}): prefix channel vs text "
                 "as memories grow"
                 + (" [random test model]" if cfg["is_random_backbone"] else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _ints(text: str, flag: str, p: argparse.ArgumentParser) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        p.error(f"{flag} takes comma-separated integers, got {text!r}")
    if not values or any(v < 1 for v in values):
        p.error(f"{flag} takes positive integers, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m amfs_server.session_bench.prefix_cost",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--backbone", default="smollm2")
    p.add_argument("--device", default=None)
    p.add_argument("--sizes", default="30,100,300", help="tokens per memory (default 30,100,300)")
    p.add_argument("--top-k", default="3,10", help="memories per question (default 3,10)")
    p.add_argument("--reps", type=int, default=3, help="questions per cell (default 3)")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--via-server", action="store_true",
                   help="answer through amfs_answer of a server built with the backbone (memories via amfs_write)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    args.size_list = _ints(args.sizes, "--sizes", p)
    args.k_list = _ints(args.top_k, "--top-k", p)
    if args.reps < 1 or args.max_new_tokens < 1:
        p.error("--reps and --max-new-tokens must be >= 1")
    args.argv = None if argv is None else list(argv)
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    import asyncio

    import torch

    from ..ml.answer.backbone import BackboneUnavailable, load_backbone
    from ..ml.answer.prefix_cache import MemoryCompiler

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        # Via the server this copy only sizes the memories in tokens; the server's worker loads its own.
        backbone = load_backbone(args.backbone, device=args.device)
    except BackboneUnavailable as error:
        raise SystemExit(f"prefix cost: {error}") from None
    compiler = MemoryCompiler(backbone)
    started = time.perf_counter()
    if args.via_server:
        with tempfile.TemporaryDirectory(prefix="amfs-prefix-cost-") as tmp:
            measured = asyncio.run(_run_via_server(Path(tmp), args, backbone, compiler.layout))
    else:
        # Warm-up memories of their own (ids and texts no cell uses), so every cell's memories are compiled,
        # not cache hits.
        warm = [MemoryText(f"warm-up/{m.memory_id}", f"Warm-up. {m.text}")
                for m in make_memories(backbone, compiler.layout, 20, 2)]
        for mode in ("text", "prefix", "hybrid"):  # first-call costs land nowhere
            answer_from_memories(backbone, compiler, "What is this about?", mode, warm, 2)
        measured = asyncio.run(run(InProcess(backbone, compiler), backbone, compiler.layout, args.size_list,
                                   args.k_list, args.reps, args.max_new_tokens))
    report = {
        "command": "python -m amfs_server.session_bench.prefix_cost "
                   + " ".join(sys.argv[1:] if args.argv is None else args.argv),
        "config": {"backbone": backbone.name, "is_random_backbone": backbone.is_random, "device": str(backbone.device),
                   "dtype": str(backbone.dtype).replace("torch.", ""), "torch_threads": torch.get_num_threads(),
                   "reps": args.reps, "max_new_tokens": args.max_new_tokens, "sizes": args.size_list,
                   "top_k": args.k_list, "key_scale": compiler.key_scale, "machine": platform.machine(),
                   "path": "server" if args.via_server else "in-process"},
        **measured,
        "crossover": crossover(measured["cells"]),
        "wall_s": time.perf_counter() - started,
    }
    out = args.out or Path("reports") / "session" / (f"prefix-cost-{backbone.name.split('@')[0]}"
                                                     + ("-server" if args.via_server else ""))
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(markdown(report), encoding="utf-8")
    chart(report, out / "report.png")
    print(markdown(report))
    _progress(f"prefix cost: wrote {out}/report.json, report.md, report.png in {report['wall_s']:.0f}s")
    return report


async def _run_via_server(data_dir: Path, args: argparse.Namespace, backbone: Any, layout: Any) -> dict[str, Any]:
    async with ViaServer(data_dir, args.backbone) as server:
        # Warm-up memories of their own scope: the worker loads the backbone and every mode runs once untimed.
        warm = make_memories(backbone, layout, 20, 2, scope="warm-up")
        await server.prepare(warm)
        for mode in COST_MODES:
            await server.answer(mode, "What is this about?", warm, 2)
        measured = await run(server, backbone, layout, args.size_list, args.k_list, args.reps, args.max_new_tokens)
        measured["server_backbone_load_ms"] = server.load_ms
        return measured


if __name__ == "__main__":
    main()
