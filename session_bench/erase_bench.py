"""What "forget leaves no byte" costs on SQLite: write throughput with `PRAGMA secure_delete` off and
on, and the latency of one forget (every version, traces, outcome effects, FTS5 'optimize', WAL
checkpoint, vector index file scrubbed) at several store sizes.

    amfs-server bench erase [--writes 2000] [--sizes 1000,10000] [--repeats 3] [--out FILE.json]

Writes go one per transaction (`MemoryService.write`, the MCP tool's path), a third of them new
versions of an earlier key (so old cells and FTS rows are deleted, where secure_delete does its
work). Vectors come from a hashing embedder (deterministic unit vectors, 384 dimensions) so the
numbers are the store's and not the model's; secure_delete off and on alternate, `--repeats` times,
and the median is reported. Results on a shared machine are noisy: compare runs on the same one.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..adapters.sqlite import SQLiteStore
from ..core.models import Actor
from ..core.service import MemoryService, WriteRequest
from . import log, percentile
from .retrieval_bench import synthetic_notes


class HashEmbedder:
    """Deterministic unit vectors from a text's hash: realistic vector bytes at no model cost."""

    name = "hash-384"
    dimension = 384

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            row = np.random.default_rng(seed).standard_normal(self.dimension).astype(np.float32)
            rows.append(row / np.linalg.norm(row))
        return np.stack(rows) if rows else np.empty((0, self.dimension), dtype=np.float32)


async def open_service(path: Path, secure_delete: bool) -> MemoryService:
    store = SQLiteStore(path)
    store.secure_delete = secure_delete
    service = MemoryService(store, embedder=HashEmbedder())
    await service.open()
    return service


async def writes_per_second(workdir: Path, count: int, secure_delete: bool, run: int) -> float:
    notes = synthetic_notes(count, seed=41 + run)
    service = await open_service(workdir / f"writes-{secure_delete}-{run}.db", secure_delete)
    actor = Actor("agent/bench", "erase")
    try:
        started = time.perf_counter()
        for n, (entity_path, key, text) in enumerate(notes):
            if n % 3 == 2:  # a new version of an earlier key
                entity_path, key, _ = notes[n - 2]
            await service.write(actor, WriteRequest(entity_path, key, text))
        return count / (time.perf_counter() - started)
    finally:
        await service.close()


async def forget_latency(workdir: Path, size: int, forgets: int) -> dict[str, float]:
    notes = synthetic_notes(size, seed=5)
    path = workdir / f"forget-{size}.db"
    service = await open_service(path, True)
    actor = Actor("agent/bench", "erase")
    try:
        for start in range(0, size, 256):
            await service.write_many(actor, [WriteRequest(p, k, t) for p, k, t in notes[start:start + 256]])
        await service.retrieve(actor, "how are retries configured?", limit=5)  # builds the vector index
    finally:
        await service.close()  # saves the index: forget then scrubs a real file
    service = await open_service(path, True)
    samples = []
    try:
        for entity_path, key, _ in notes[:forgets]:
            started = time.perf_counter()
            await service.forget(entity_path, key)
            samples.append(time.perf_counter() - started)
    finally:
        await service.close()
    return {"entries": size, "forgets": forgets, "p50_ms": percentile(samples, 50) * 1000,
            "p95_ms": percentile(samples, 95) * 1000}


async def run(writes: int, sizes: list[int], repeats: int, forgets: int) -> dict[str, Any]:
    rates: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="amfs-erase-bench-") as tmp:
        workdir = Path(tmp)
        for r in range(repeats):
            for secure in ((False, True) if r % 2 == 0 else (True, False)):
                rates[secure].append(await writes_per_second(workdir, writes, secure, r))
                log(f"[erase] run {r + 1}/{repeats} secure_delete={'on' if secure else 'off'}: "
                    f"{rates[secure][-1]:.0f} writes/s")
        off, on = statistics.median(rates[False]), statistics.median(rates[True])
        report: dict[str, Any] = {
            "writes": writes, "repeats": repeats,
            "writes_per_s": {"secure_delete_off": round(off, 1), "secure_delete_on": round(on, 1)},
            "write_cost_pct": round((off - on) / off * 100, 1),
            "forget": [],
        }
        for size in sizes:
            report["forget"].append(await forget_latency(workdir, size, forgets))
            log(f"[erase] forget at {size} entries: p50 {report['forget'][-1]['p50_ms']:.1f} ms")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="amfs-server bench erase", description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=2000, help="single writes per measurement")
    parser.add_argument("--sizes", default="1000,10000", help="store sizes for the forget latency")
    parser.add_argument("--repeats", type=int, default=3, help="alternating off/on runs; the median is reported")
    parser.add_argument("--forgets", type=int, default=20, help="forgets timed per store size")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here (JSON)")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args.writes, [int(s) for s in args.sizes.split(",") if s.strip()], args.repeats,
                             args.forgets))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
