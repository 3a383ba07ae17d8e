"""Round-trip latency of amfs_write and amfs_retrieve through the MCP server, over stdio and streamable HTTP.

Each transport gets a fresh `amfs-server` subprocess on a temporary store, driven by the official MCP
SDK client (what Claude Desktop, Cursor and the Inspector speak): seed entries, warm up, then time
sequential calls end to end (client serialisation, transport, tool, store, embedding). Also measured per
transport: the time from spawning the server to the answer of its first `amfs_write` (cold start; the client's
own imports are done before the clock starts), and the server process's resident memory after all calls.

    python -m amfs_server.session_bench.mcp_latency                    # both transports, default embedder
    python -m amfs_server.session_bench.mcp_latency --embedder none --calls 300 --json out.json
    python -m amfs_server.session_bench.mcp_latency --transport stdio --preload-entries 10000   # retrieve at 10k
    python -m amfs_server.session_bench.mcp_latency --transport stdio --store postgres   # on PostgreSQL (a fresh schema)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import DEFAULT_POSTGRES_DSN, add_query_encoder_option, fresh_postgres_schema, postgres_dsn, postgres_problem

SERVER_COMMAND = [sys.executable, "-c", "from amfs_server.server.cli import main; main()"]
TOPICS = ["payments", "retries", "timeouts", "deploys", "caching", "auth tokens", "database locks", "queues"]


def server_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """The parent environment without AMFS_* settings (but AMFS_MODEL_CACHE, where fetched models are), plus a data
    dir and `extra` (AMFS_EMBEDDER=none...)."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("AMFS_") or name == "AMFS_MODEL_CACHE"}
    env.update({"AMFS_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}, **extra)
    return env


@dataclass
class HttpServer:
    process: subprocess.Popen[str]
    port: int
    log: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def spawn_http_server(
    transport: str, env: dict[str, str], timeout_s: float = 60.0, command: list[str] | None = None,
    program: Sequence[str] = SERVER_COMMAND,
) -> HttpServer:
    """Start `amfs-server serve --transport {http,sse}` (or `amfs-server <command>`, e.g. `["ui"]`) on
    127.0.0.1:0; wait (bounded) for the bound port. `program` is how `amfs-server` is run."""
    args = command if command is not None else ["serve", "--transport", transport]
    process = subprocess.Popen(
        [*program, *args, "--host", "127.0.0.1", "--port", "0"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    log: list[str] = []

    def pump() -> None:  # keeps `log` growing for the server's whole life, not just until it has started
        assert process.stderr is not None
        for line in process.stderr:
            log.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            process.kill()
            raise RuntimeError(f"amfs-server did not start within {timeout_s}s:\n{''.join(log)}") from None
        if line is None:
            raise RuntimeError(f"amfs-server exited with {process.wait()}:\n{''.join(log)}")
        match = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
        if match:
            return HttpServer(process, int(match.group(1)), log)


@asynccontextmanager
async def stdio_session(env: dict[str, str]) -> AsyncIterator[Any]:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=SERVER_COMMAND[0], args=SERVER_COMMAND[1:], env=env)
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


@asynccontextmanager
async def http_session(env: dict[str, str]) -> AsyncIterator[Any]:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    server = await asyncio.to_thread(spawn_http_server, "http", env)
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            async with streamable_http_client(f"{server.base_url}/mcp", http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    yield session
    finally:
        server.stop()


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def timed_call(session: Any, tool: str, arguments: dict[str, Any], *, expect_error: bool = False) -> float:
    """Milliseconds of one tool call; raises unless it answered as expected (an error only with `expect_error`)."""
    start = time.perf_counter()
    result = await session.call_tool(tool, arguments)
    elapsed = (time.perf_counter() - start) * 1000
    if result.is_error != expect_error:
        raise RuntimeError(f"{tool} answered unexpectedly: {result.content[0].text}")
    return elapsed


def bench_questions(count: int) -> list[str]:
    """The questions the latency benchmarks ask, one per topic in turn."""
    return [f"how do we handle {TOPICS[n % len(TOPICS)]} safely?" for n in range(count)]


def _note(n: int) -> dict[str, Any]:
    topic = TOPICS[n % len(TOPICS)]
    return {
        "entity_path": f"service-{n % 10}",
        "key": f"note-{n}",
        "value": f"Lesson {n} about {topic}: prefer idempotent handlers and bounded retries for {topic}.",
        "confidence": 0.5 + (n % 5) / 10,
    }


def _turn(n: int) -> str:
    """A conversational memory, so that a preloaded store looks like chat turns, not copies of one note."""
    rng = random.Random(n)
    speaker = rng.choice(["Ana", "Ben", "Chen", "Dara", "Eli", "Femi"])
    verb = rng.choice(["went to", "booked", "cancelled", "talked about", "finally tried", "is planning"])
    thing = rng.choice([
        "the pottery class", "a trip to Porto", "the dentist", "a new running route", "the book club",
        "a cooking workshop", "the job interview", "a concert downtown", "the garden project", "a camping weekend",
    ])
    when = rng.choice(["yesterday", "last week", "next Friday", "this morning", "in March", "after work"])
    return f"{speaker}: I {verb} {thing} {when}, and it reminded me of conversation {n % 97}."


PRELOAD_CONVERSATIONS = 40  # the preload's turns are spread over this many conversations (entity paths)


def preloaded_env(folder: Path, entries: int, real_vectors: int, dsn: str | None = None) -> dict[str, str]:
    """The server environment of a store holding `preload`'s `entries` turns (`real_vectors` of them embedded): a
    SQLite store in `folder`, preloaded once and reused by later runs (a second preload would add to it), or, with
    `dsn`, the PostgreSQL schema it names, preloaded now (a fresh one, from `fresh_postgres_schema`)."""
    env = server_env(folder, **({"AMFS_POSTGRES_DSN": dsn} if dsn is not None else {}))
    made = folder / "preloaded"
    if dsn is not None or not made.exists():
        folder.mkdir(parents=True, exist_ok=True)
        asyncio.run(preload(env, entries, real_vectors=real_vectors))
        if dsn is None:
            made.touch()
    return env


async def preload(env: dict[str, str], entries: int, batch: int = 256, real_vectors: int | None = None) -> None:
    """Write `entries` memories straight into the server's store (batched embeddings), before it starts. With
    `real_vectors` only that many are embedded and the rest get mixtures of two of those vectors
    (`retrieval_bench.mixed_vectors`, their texts real), inserted as the scale benchmark inserts its notes: without
    a turn's context passage (one passage vector fewer a turn for the second look than `write_many` stores) and at
    confidence 1.0. Embedding 10,000 turns takes half an hour on two cores without VNNI, while a retrieve's cost
    depends mostly on how many vectors the store holds, not on what they say."""
    from ..core.models import Actor
    from ..core.service import WriteRequest
    from ..server.composition import build_service
    from ..server.settings import load_settings

    service = build_service(load_settings(environ=env))
    await service.open()
    try:
        if real_vectors is not None and service.embedder is not None:
            from ..core.embedding import embed_entries, entry_texts
            from .retrieval_bench import fill_store, mixed_vectors

            turns = [(f"conv-{n % PRELOAD_CONVERSATIONS:02d}", f"turn-{n:06d}", _turn(n)) for n in range(entries)]
            real = embed_entries(service.embedder.embed, [entry_texts(*turn) for turn in turns[:real_vectors]])
            await fill_store(service.store, turns, mixed_vectors(real, entries), 0, entries)
            print(f"preloaded {entries} ({min(entries, real_vectors)} embedded, the rest mixtures)", file=sys.stderr,
                  flush=True)
            return
        actor = Actor("bench/preload", "preload")
        for start in range(0, entries, batch):
            requests = [
                WriteRequest(f"conv-{n % PRELOAD_CONVERSATIONS:02d}", f"turn-{n:06d}", _turn(n)) for n in range(start, min(entries, start + batch))
            ]
            await service.write_many(actor, requests)
            print(f"preloaded {min(entries, start + batch)}/{entries}", file=sys.stderr, flush=True)
    finally:
        await service.close()


def _server_process() -> Any | None:
    """The amfs-server child process (the newest one), or None without psutil."""
    try:
        import psutil
    except ImportError:
        return None
    children = [c for c in psutil.Process().children(recursive=True) if "amfs_server" in " ".join(c.cmdline())]
    return children[-1] if children else None


def server_rss_mb() -> float | None:
    """Resident memory of the amfs-server child process, or None without psutil."""
    process = _server_process()
    return round(process.memory_info().rss / 2**20, 1) if process else None


def server_cpu_s() -> float | None:
    """CPU seconds (user + system, all threads) the amfs-server child has used so far: on a loaded machine the
    wall-clock cold start mostly measures the other jobs, this measures the server's own work."""
    process = _server_process()
    if process is None:
        return None
    times = process.cpu_times()
    return round(times.user + times.system, 2)


def import_client(transport: str) -> None:
    """The client's own imports (the mcp package: about a second of CPU) happen before the cold-start clock
    starts: it measures the server, from spawn to answer, and the transport measured first would pay them.
    jsonschema is what the client imports on its first call_tool to check the result's structured content."""
    import jsonschema  # noqa: F401
    from mcp import ClientSession  # noqa: F401
    from mcp.client.stdio import stdio_client  # noqa: F401

    if transport != "stdio":
        import httpx2  # noqa: F401
        from mcp.client.streamable_http import streamable_http_client  # noqa: F401


async def concurrent_retrieves(session: Any, queries: list[str], concurrent: int) -> dict[str, Any]:
    """`queries` as `amfs_retrieve` calls `concurrent` at a time (the next group when the last one is answered), as
    several agents sharing one server ask: each call's latency, and calls answered per second over the whole run."""
    started = time.perf_counter()
    timings: list[float] = []
    for start in range(0, len(queries), concurrent):
        group = queries[start:start + concurrent]
        timings += await asyncio.gather(*(timed_call(session, "amfs_retrieve", {"query": query}) for query in group))
    return {**_summary(timings), "concurrent": concurrent,
            "calls_per_s": round(len(timings) / (time.perf_counter() - started), 1)}


async def measure(transport: str, env: dict[str, str], calls: int, seed: int, warmup: int,
                  concurrent: int = 1, scopes: Sequence[str] = ()) -> dict[str, Any]:
    """Times `calls` writes and retrieves; with `scopes`, the same retrieves again, each scoped to one of them in
    turn, as a conversation benchmark asks (one conversation among many in the store)."""
    session_factory = stdio_session if transport == "stdio" else http_session
    import_client(transport)
    spawned = time.perf_counter()
    async with session_factory(env) as session:
        await timed_call(session, "amfs_write", {"entity_path": "bench", "key": "cold-start", "value": "first write"})
        first_write_s = time.perf_counter() - spawned
        first_write_cpu_s = server_cpu_s()
        tools = {tool.name for tool in (await session.list_tools()).tools}
        for n in range(seed):
            await session.call_tool("amfs_write", _note(n))
        for n in range(warmup):
            await timed_call(session, "amfs_write", _note(seed + n))
        writes = [await timed_call(session, "amfs_write", _note(seed + warmup + n)) for n in range(calls)]
        row: dict[str, Any] = {"transport": transport, "amfs_write": _summary(writes)}
        if "amfs_retrieve" in tools:
            queries = bench_questions(calls + warmup)
            for query in queries[:warmup]:
                await timed_call(session, "amfs_retrieve", {"query": query})
            started = time.perf_counter()
            timings = [await timed_call(session, "amfs_retrieve", {"query": query}) for query in queries[warmup:]]
            row["amfs_retrieve"] = {**_summary(timings),
                                    "calls_per_s": round(len(timings) / (time.perf_counter() - started), 1)}
            if scopes:
                scoped = [await timed_call(session, "amfs_retrieve", {"query": query, "entity_path": scopes[n % len(scopes)]})
                          for n, query in enumerate(queries[warmup:])]
                row["amfs_retrieve_scoped"] = {**_summary(scoped), "scopes": len(scopes)}
            if concurrent > 1:
                row["amfs_retrieve_concurrent"] = await concurrent_retrieves(session, queries[warmup:], concurrent)
        else:
            row["amfs_retrieve"] = None
        row["cold_start_first_write_s"] = round(first_write_s, 2)
        row["cold_start_server_cpu_s"] = first_write_cpu_s
        row["server_rss_mb"] = server_rss_mb()
        return row


def query_embedding_latency(embedder_name: str | None, calls: int, warmup: int,
                            threads: int | None = None, query_encoder: str = "auto") -> dict[str, Any] | None:
    """One query at a time through the embedder the server uses (built the same way, in this process): the part
    of a retrieve that the model costs. None with embeddings off."""
    from ..adapters.embedders import load_embedder, question_side
    from ..core.embedding import DEFAULT_EMBEDDER, embed_queries

    name = DEFAULT_EMBEDDER if embedder_name is None else embedder_name
    if name.strip().lower() in {"", "none", "off"}:
        return None
    embedder = load_embedder(name, threads, query_encoder)
    queries = [f"how do we handle {TOPICS[n % len(TOPICS)]} in service {n}?" for n in range(calls + warmup)]
    embed_queries(embedder, queries[:warmup])
    timings, cpu = [], []
    for query in queries[warmup:]:
        started, started_cpu = time.perf_counter(), time.process_time()
        embed_queries(embedder, [query])
        timings.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
    # CPU time (all threads of this otherwise idle process) is what a query costs on a quiet core; wall time on a
    # shared machine adds the waits for one.
    return {"embedder": embedder.name, "question_side": question_side(embedder), **_summary(timings),
            "cpu_p50_ms": round(percentile(cpu, 0.50), 2)}


def _summary(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples), "p50_ms": round(percentile(samples, 0.50), 2), "p95_ms": round(percentile(samples, 0.95), 2),
        "mean_ms": round(statistics.fmean(samples), 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m amfs_server.session_bench.mcp_latency", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--transport", choices=["stdio", "http", "both"], default="both")
    parser.add_argument(
        "--store", choices=["sqlite", "postgres"], default="sqlite",
        help="The server's store: a fresh SQLite file (default) or a fresh schema of the PostgreSQL at "
             f"AMFS_POSTGRES_DSN (default {DEFAULT_POSTGRES_DSN}), dropped after the run.",
    )
    parser.add_argument("--calls", type=int, default=200, help="Timed calls per tool (default 200).")
    parser.add_argument("--seed-entries", type=int, default=200, help="Entries written before timing (default 200).")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--embedder", default=None,
        help="AMFS_EMBEDDER for the server (default: the server's default; 'none' to skip embeddings).",
    )
    parser.add_argument(
        "--embed-threads", type=int, default=None, metavar="N",
        help="AMFS_EMBED_THREADS for the server: the embedder's intra-op threads (default: its own, two where two cores are free).",
    )
    add_query_encoder_option(parser)
    from ..adapters.embedders import QUERY_ENCODERS

    parser.add_argument(
        "--then-query-encoder", default=None, choices=QUERY_ENCODERS,
        help="Time the same store again with the server restarted on this AMFS_QUERY_ENCODER (e.g. --query-encoder "
             "full --then-query-encoder auto): a paired comparison on one preload.",
    )
    parser.add_argument(
        "--concurrent", type=int, default=1, metavar="N",
        help="Also time the retrieves N at a time on the one session (several agents on one server); default 1: off.",
    )
    parser.add_argument(
        "--preload-entries", type=int, default=0,
        help="Memories written straight into the store (batched) before the server starts, e.g. 10000.",
    )
    parser.add_argument(
        "--real-vectors", type=int, default=None, metavar="N",
        help="With --preload-entries: embed only the first N preloaded turns and give the rest mixtures of two of "
             "those vectors (their texts real), as `bench retrieval scale --real-vectors` does; for timing only.",
    )
    parser.add_argument("--json", type=Path, default=None, help="Also write the results here.")
    args = parser.parse_args(argv)
    if args.real_vectors is not None:
        from .retrieval_bench import real_vectors_problem

        problem = real_vectors_problem(args.real_vectors, args.preload_entries) if args.preload_entries else \
            "needs --preload-entries"
        if problem:
            parser.error(f"--real-vectors: {problem}")
    if args.embed_threads is not None and args.embed_threads < 1:
        parser.error("--embed-threads must be >= 1")
    if args.concurrent < 1:
        parser.error("--concurrent must be >= 1")
    encoders = [args.query_encoder] + ([args.then_query_encoder] if args.then_query_encoder else [])
    if args.store == "postgres" and (problem := asyncio.run(postgres_problem(postgres_dsn()))):
        parser.error(f"--store postgres: {problem}")

    rows = []
    transports = ["stdio", "http"] if args.transport == "both" else [args.transport]
    with tempfile.TemporaryDirectory(prefix="amfs-mcp-latency-") as tmp:
        for transport in transports:
            extra = {"AMFS_EMBEDDER": args.embedder} if args.embedder is not None else {}
            if args.embed_threads is not None:
                extra["AMFS_EMBED_THREADS"] = str(args.embed_threads)
            # each transport its own store, as on SQLite
            with fresh_postgres_schema("amfs_bench_latency") if args.store == "postgres" else nullcontext() as dsn:
                if dsn is not None:
                    extra["AMFS_POSTGRES_DSN"] = dsn
                for number, encoder in enumerate(encoders):
                    env = server_env(Path(tmp) / transport, **extra, AMFS_QUERY_ENCODER=encoder)
                    if args.preload_entries and number == 0:
                        asyncio.run(preload(env, args.preload_entries, real_vectors=args.real_vectors))
                    # Scoped to one conversation of the preload, else to one service of the seed notes (_note).
                    scopes = ([f"conv-{n:02d}" for n in range(min(PRELOAD_CONVERSATIONS, args.preload_entries))]
                              if args.preload_entries else [f"service-{n}" for n in range(10)])
                    row = asyncio.run(measure(transport, env, args.calls, args.seed_entries, args.warmup,
                                              args.concurrent, scopes))
                    rows.append({**row, "query_encoder": encoder})
    embeddings = [query_embedding_latency(args.embedder, args.calls, args.warmup, args.embed_threads, encoder)
                  for encoder in encoders]

    print(
        f"MCP round-trip latency, sequential calls ({'PostgreSQL' if args.store == 'postgres' else 'SQLite'}; "
        f"embedder: {args.embedder or 'default'}, "
        f"query encoder: {' then '.join(encoders)}, "
        f"{args.embed_threads or 'default'} thread(s); "
        f"{args.preload_entries + args.seed_entries} entries before timing"
        f"{f', {args.real_vectors} of the preloaded embedded, the rest mixtures' if args.real_vectors else ''}"
        f"{', each later encoder its seed entries more' if len(encoders) > 1 else ''}; {os.cpu_count()} CPUs)"
    )
    print(f"{'transport':<10} {'tool':<14} {'n':>5} {'p50 ms':>9} {'p95 ms':>9} {'mean ms':>9}")
    def line(transport: str, tool: str, stats: dict[str, Any]) -> str:
        return f"{transport:<10} {tool:<14} {stats['n']:>5} {stats['p50_ms']:>9} {stats['p95_ms']:>9} {stats['mean_ms']:>9}"

    for row in rows:
        if len(encoders) > 1:
            print(f"query encoder {row['query_encoder']}:")
        for tool in ("amfs_write", "amfs_retrieve"):
            if row[tool] is None:
                print(f"{row['transport']:<10} {tool:<14} (not registered: MemoryService.retrieve missing)")
            else:
                print(line(row["transport"], tool, row[tool]))
        if "amfs_retrieve_scoped" in row:
            stats = row["amfs_retrieve_scoped"]
            print(line(row["transport"], "amfs_retrieve", stats) + f"  (scoped: each to one of {stats['scopes']} entity paths)")
        if "amfs_retrieve_concurrent" in row:
            stats = row["amfs_retrieve_concurrent"]
            print(line(row["transport"], "amfs_retrieve", stats) + f"  ({stats['concurrent']} at a time: {stats['calls_per_s']} calls/s "
                  f"against {row['amfs_retrieve']['calls_per_s']} one at a time)")
        print(
            f"{row['transport']:<10} cold start to first amfs_write answered: {row['cold_start_first_write_s']} s "
            f"({row['cold_start_server_cpu_s']} CPU s in the server); server RSS after the run: {row['server_rss_mb']} MB"
        )
    for encoder, embedding in zip(encoders, embeddings):
        if embedding is not None:
            print(
                f"query embedding alone ({embedding['question_side']}, query encoder {encoder}, in this process): "
                f"p50 {embedding['p50_ms']} ms, p95 {embedding['p95_ms']} ms; CPU time p50 {embedding['cpu_p50_ms']} ms"
            )
    if args.json is not None:
        document = {"store": args.store, "embedder": args.embedder or "default", "embed_threads": args.embed_threads,
                    "query_encoder": args.query_encoder, "results": rows,
                    "query_embedding": embeddings[0],
                    **({"then": [{"query_encoder": e, "query_embedding": q} for e, q in zip(encoders[1:], embeddings[1:])]}
                       if len(encoders) > 1 else {})}
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
