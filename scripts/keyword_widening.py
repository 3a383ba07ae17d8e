"""What the widest keyword search of a filtered retrieval costs: FILTERED_POOL_MAX (12,800) rows, read without values.

A retrieval with `min_confidence` (or a tier `depth`) widens its keyword search fourfold until enough candidates
pass, up to FILTERED_POOL_MAX rows. Each row's keyword share is scaled by the length factor of its search text. Until
0.7.13 the stores read every row's search text and counted its distinct words at read; since then they read a count
stored when the row was written. This writes `--entries` entries of about 70 distinct words, every one holding the
query's word, and times that search (wall and this process's CPU, p50 of `--repeats`):

    python scripts/keyword_widening.py --stores sqlite,postgres

Run it on two checkouts (PYTHONPATH pointing at each) to compare; the README's figures came from this.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from amfs_server.core.models import Actor, EntryFilter, MemoryType, NewEntry, Tier, utcnow
from amfs_server.core.service import FILTERED_POOL_MAX

ACTOR = Actor("agent/bench", "keyword-widening")
VOCABULARY = [f"topic{n}" for n in range(5_000)]


def entries(count: int) -> list[NewEntry]:
    rng = random.Random(7)
    now = utcnow()
    drafts = []
    for n in range(count):
        text = "ledger " + " ".join(rng.sample(VOCABULARY, 70))
        drafts.append(NewEntry(
            entity_path=f"svc/s{n % 20}", key=f"k{n}", value=text, value_json=json.dumps(text), confidence=1.0,
            memory_type=MemoryType.FACT, agent_id=ACTOR.agent_id, session_id=ACTOR.session_id, written_at=now,
            ttl_at=None, importance_score=None, importance_dimensions=None, tier=Tier.HOT, priority_score=0.5,
            embedding=None, search_text=text))
    return drafts


async def open_store(kind: str, directory: Path):  # type: ignore[no-untyped-def]
    if kind == "sqlite":
        from amfs_server.adapters.sqlite import SQLiteStore

        sqlite_store = SQLiteStore(directory / "amfs.db")
        await sqlite_store.open()
        return sqlite_store
    from amfs_server.adapters.postgres import PostgresStore

    dsn = os.environ.get("AMFS_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    pg_store = PostgresStore(dsn, embedding_dimension=384, schema=f"keyword_widening_{os.getpid()}")
    await pg_store.open()
    return pg_store


async def run(kind: str, count: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        store = await open_store(kind, Path(directory))
        try:
            drafts = entries(count)
            for start in range(0, count, 1_000):
                await store.insert_versions(drafts[start:start + 1_000], ACTOR)
            walls, cpus = [], []
            for _ in range(repeats):
                wall, cpu = time.perf_counter(), time.process_time()
                found = await store.keyword_candidates(["ledger"], EntryFilter(), utcnow(), FILTERED_POOL_MAX, values=False)
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
            print(f"{kind}: {len(found)} rows, p50 {statistics.median(walls) * 1000:.0f} ms wall, "
                  f"{statistics.median(cpus) * 1000:.0f} ms CPU of this process ({repeats} runs)")
        finally:
            if kind == "postgres":
                await store.drop_schema()  # type: ignore[attr-defined]
            await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stores", default="sqlite", help="comma-separated: sqlite, postgres (default: sqlite)")
    parser.add_argument("--entries", type=int, default=FILTERED_POOL_MAX + 200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for kind in args.stores.split(","):
        asyncio.run(run(kind.strip(), args.entries, args.repeats))


if __name__ == "__main__":
    main()
