"""Where a retrieve's time goes, in process: the whole retrieve, the same with the question's vector cached (the
store and the fusion alone), and each store call of it timed on its own (research; docs/retrieval-record.md, "0.7.19").

The store is `mcp_latency`'s preload (conversational turns over 40 entity paths, `--real-vectors` of them embedded,
the rest mixtures of their vectors), made once in DIR and reused by later runs; the questions are `mcp_latency`'s
too, so the figures sit beside its MCP ones (whose difference is the transport).

    python scripts/retrieve_breakdown.py --dir /tmp/breakdown --entries 10000 --real-vectors 1000
    python scripts/retrieve_breakdown.py --dir /tmp/breakdown --store postgres   # a fresh schema, dropped after
    python scripts/retrieve_breakdown.py --dir /tmp/breakdown --via-mcp          # and through the MCP server

Each figure is a p50 over `--questions` retrieves (default 200), after 16 unmeasured ones. A store call's time
includes waiting for the store's lock while the other search holds it, so the calls' times do not add up to the
retrieve's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from amfs_server.core import service as service_module
from amfs_server.core.models import Actor
from amfs_server.server.composition import build_service
from amfs_server.server.settings import load_settings
from amfs_server.session_bench import fresh_postgres_schema, postgres_dsn, postgres_problem
from amfs_server.session_bench.mcp_latency import (
    PRELOAD_CONVERSATIONS, bench_questions, preloaded_env, stdio_session, timed_call,
)

STORE_CALLS = ("semantic_candidates", "keyword_candidates", "common_terms", "passage_vectors", "entry_values",
               "record_reads")


def p50(samples: list[float]) -> float:
    return round(statistics.median(samples), 2)


async def breakdown(env: dict[str, str], questions: int, run_length: int = 1) -> dict[str, Any]:
    service = build_service(load_settings(environ=env))
    await service.open()
    real_embed = service_module.embed_queries
    cache: dict[tuple[str, ...], Any] = {}

    def cached_embed(embedder: Any, texts: list[str]) -> Any:
        if tuple(texts) not in cache:
            cache[tuple(texts)] = real_embed(embedder, texts)
        return cache[tuple(texts)]

    calls: dict[str, list[float]] = defaultdict(list)

    def timed(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await call(*args, **kwargs)
            finally:
                calls[name].append((time.perf_counter() - started) * 1000)
        return wrapper

    actor = Actor("bench/breakdown", "breakdown")
    asked = bench_questions(questions)
    # each scope asked `run_length` questions in a row (1: a different scope every time, the least any cache can do)
    scopes = [f"conv-{n // run_length % PRELOAD_CONVERSATIONS:02d}" for n in range(questions)]
    rows: dict[str, Any] = {}
    try:
        for question in asked[:16]:
            await service.retrieve(actor, question)
        for label, embed, scoped in (("retrieve", real_embed, False), ("retrieve, question's vector cached", cached_embed, False),
                                     ("the same, scoped to one conversation", cached_embed, True)):
            service_module.embed_queries = embed
            samples = []
            for question, scope in zip(asked, scopes):
                started = time.perf_counter()
                await service.retrieve(actor, question, entity_path=scope if scoped else None)
                samples.append((time.perf_counter() - started) * 1000)
            rows[label] = p50(samples)
        originals = {name: getattr(service.store, name) for name in STORE_CALLS}
        for name, call in originals.items():
            setattr(service.store, name, timed(name, call))
        for question in asked:  # unscoped, the question's vector cached
            await service.retrieve(actor, question)
        for name in STORE_CALLS:
            if calls[name]:
                rows[f"  {name} (x{len(calls[name]) / questions:.1f} a retrieve)"] = p50(calls[name])
        service_module.embed_queries = real_embed
        samples = []
        for question in asked:
            started = time.perf_counter()
            service_module.embed_queries(service.embedder, [question])
            samples.append((time.perf_counter() - started) * 1000)
        rows["the question's embedding alone"] = p50(samples)
    finally:
        service_module.embed_queries = real_embed
        await service.close()
    return rows


async def over_mcp(env: dict[str, str], questions: int) -> dict[str, Any]:
    """The same store through the MCP server over stdio: amfs_retrieve, and amfs_read of a key that does not exist,
    the cheapest call that reaches the store (what the transport, the MCP framework and the client cost a call)."""
    asked = bench_questions(questions)
    async with stdio_session(env) as session:
        for question in asked[:16]:
            await session.call_tool("amfs_retrieve", {"query": question})
        retrieves = [await timed_call(session, "amfs_retrieve", {"query": question}) for question in asked]
        reads = [await timed_call(session, "amfs_read", {"entity_path": "absent", "key": f"none-{n}"}, expect_error=True)
                 for n in range(questions)]  # "not found"
    return {"over MCP stdio: amfs_retrieve": p50(retrieves),
            "over MCP stdio: amfs_read of an absent key": p50(reads)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="where the SQLite store of each size is made once and reused")
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--real-vectors", type=int, default=1000)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--run-length", type=int, default=1,
                        help="scoped questions asked of one conversation in a row (default 1: the next one each time)")
    parser.add_argument("--via-mcp", action="store_true",
                        help="also time amfs_retrieve, and amfs_read of an absent key, through the MCP server over stdio")
    args = parser.parse_args()
    if args.run_length < 1:
        parser.error(f"--run-length must be 1 or more, got {args.run_length}")
    if args.store == "postgres" and (problem := asyncio.run(postgres_problem(postgres_dsn()))):
        parser.error(f"--store postgres: {problem}")
    folder = args.dir / f"preloaded-{args.entries}-{args.real_vectors}"
    with fresh_postgres_schema("amfs_bench_breakdown") if args.store == "postgres" else nullcontext() as dsn:
        env = preloaded_env(folder, args.entries, args.real_vectors, dsn)
        rows = asyncio.run(breakdown(env, args.questions, args.run_length))
        if args.via_mcp:
            rows.update(asyncio.run(over_mcp(env, args.questions)))
    print(f"{args.store}, {args.entries} entries ({args.real_vectors} embedded), p50 ms over {args.questions} retrieves:")
    for label, value in rows.items():
        print(f"{label:<48} {value:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
