"""Two amfs-server versions timed over MCP stdio on one store, question by question: this checkout's server and a
baseline's (another commit), both open at once, each question asked of both in turn (the order alternating). On a
shared two-core machine p50s of separate runs differ by 2-10 ms from minute to minute; pairing each question cancels
what the machine does meanwhile, so a change of a few milliseconds shows (research; docs/retrieval-record.md, "0.7.21").

    python scripts/paired_latency.py --baseline-ref HEAD~2 --store postgres       # a fresh schema, dropped after
    python scripts/paired_latency.py --baseline-ref 8e512bc --dir /tmp/paired     # SQLite, made once in DIR

The store is `mcp_latency`'s preload (`--entries` conversational turns over 40 entity paths, `--real-vectors` of them
embedded, the rest mixtures of their vectors), written by this checkout: a baseline must open that schema (a release
with an older schema refuses it, and says so). For each of `amfs_retrieve`, the same scoped to one conversation, and
`amfs_read` of an absent key (the cheapest call that reaches the store), it prints both p50s, the median of the
per-question differences (baseline minus this checkout: positive means this checkout is faster) and how many
questions this checkout answered faster.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import subprocess
import tarfile
import tempfile
from contextlib import AsyncExitStack, nullcontext
from pathlib import Path
from typing import Any

from amfs_server.session_bench import fresh_postgres_schema, postgres_dsn, postgres_problem
from amfs_server.session_bench.mcp_latency import (
    PRELOAD_CONVERSATIONS, bench_questions, preloaded_env, stdio_session, timed_call,
)

REPO = Path(__file__).resolve().parent.parent


def unpack_baseline(ref: str, into: Path) -> Path:
    """`ref`'s tree as an importable `amfs_server` package under `into` (the repository root is the package)."""
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    except subprocess.CalledProcessError as error:
        raise SystemExit(f"--baseline-ref {ref}: git archive failed: {error.stderr.decode().strip()}") from error
    package = into / "amfs_server"
    package.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(package, filter="data")
    return into


def calls(questions: list[str]) -> dict[str, list[tuple[str, dict[str, Any], bool]]]:
    """What is timed: (tool, arguments, whether the call answers with an error) per question."""
    return {
        "amfs_retrieve": [("amfs_retrieve", {"query": q}, False) for q in questions],
        "amfs_retrieve, scoped": [("amfs_retrieve", {"query": q, "entity_path": f"conv-{n % PRELOAD_CONVERSATIONS:02d}"},
                                   False) for n, q in enumerate(questions)],
        "amfs_read, absent key": [("amfs_read", {"entity_path": "absent", "key": f"none-{n}"}, True)
                                  for n in range(len(questions))],
    }


async def paired(env: dict[str, str], baseline_path: Path, questions: int) -> dict[str, dict[str, float]]:
    asked = bench_questions(questions)
    async with AsyncExitStack() as stack:
        baseline = await stack.enter_async_context(stdio_session(dict(env, PYTHONPATH=str(baseline_path))))
        current = await stack.enter_async_context(stdio_session(env))
        for question in asked[:16]:  # warm both: models, statement caches
            for session in (baseline, current):
                await session.call_tool("amfs_retrieve", {"query": question})
        rows = {}
        for label, timed in calls(asked).items():
            base_ms: list[float] = []
            current_ms: list[float] = []
            for n, (tool, arguments, error) in enumerate(timed):
                turns = [(baseline, base_ms), (current, current_ms)]
                for session, samples in turns if n % 2 == 0 else turns[::-1]:  # who goes first alternates
                    samples.append(await timed_call(session, tool, arguments, expect_error=error))
            rows[label] = {
                "baseline p50": round(statistics.median(base_ms), 2),
                "this checkout p50": round(statistics.median(current_ms), 2),
                "median difference": round(statistics.median(b - c for b, c in zip(base_ms, current_ms)), 2),
                "faster here": sum(c < b for b, c in zip(base_ms, current_ms)),
            }
        return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-ref", required=True, help="the git commit (or tag, branch) to compare against")
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the SQLite store is made once and reused (default: a temporary folder)")
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--real-vectors", type=int, default=1000)
    parser.add_argument("--questions", type=int, default=400)
    args = parser.parse_args()
    if args.questions < 2:
        parser.error(f"--questions must be 2 or more, got {args.questions}")
    if args.store == "postgres" and (problem := asyncio.run(postgres_problem(postgres_dsn()))):
        parser.error(f"--store postgres: {problem}")
    with tempfile.TemporaryDirectory(prefix="amfs-baseline-") as unpacked, \
            (nullcontext(args.dir) if args.dir else tempfile.TemporaryDirectory(prefix="amfs-paired-")) as data, \
            (fresh_postgres_schema("amfs_bench_paired") if args.store == "postgres" else nullcontext()) as dsn:
        baseline_path = unpack_baseline(args.baseline_ref, Path(unpacked))
        env = preloaded_env(Path(data) / f"preloaded-{args.entries}-{args.real_vectors}", args.entries,
                            args.real_vectors, dsn)
        env.pop("PYTHONPATH", None)  # this checkout's server imports this checkout
        rows = asyncio.run(paired(env, baseline_path, args.questions))
    print(f"{args.store}, {args.entries} entries ({args.real_vectors} embedded), {args.questions} questions asked of "
          f"both, baseline {args.baseline_ref}; ms, difference = baseline - this checkout:")
    for label, row in rows.items():
        print(f"{label:<24} baseline {row['baseline p50']:>7}  here {row['this checkout p50']:>7}  "
              f"difference {row['median difference']:>6}  faster here in {row['faster here']}/{args.questions}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
