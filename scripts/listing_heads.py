"""How long amfs_list, amfs_search and amfs_retrieve take, and how much memory the process peaks at, over large values.

Writes `--values` values of about 0.9 MB (lists of 22,000 small objects) through the in-memory MCP client on the
embedded store (no embedder), then times one amfs_list, one amfs_search, one amfs_search sorted by priority and one
amfs_retrieve (keyword search alone, without an embedder; `limit` 1, every value a candidate):

    python scripts/listing_heads.py --values 30

Run it on two checkouts (PYTHONPATH pointing at each) to compare; the figures in the README's Security table
(0.7.10 against 0.7.11, and 0.7.11 against 0.7.12 for amfs_retrieve) came from this on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from pathlib import Path

from fastmcp import Client

from amfs_server.server.app import create_app
from amfs_server.server.composition import build_service
from amfs_server.server.settings import load_settings


async def run(values: int) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        settings = load_settings({}, data_dir=Path(data_dir), embedder="none")
        async with Client(create_app(build_service(settings), settings)) as client:
            big = [{"row": n, "text": "payload words here"} for n in range(22_000)]
            for i in range(values):
                await client.call_tool("amfs_write", {"entity_path": "big", "key": f"k{i}", "value": big})
            for tool, args in [("amfs_list", {"entity_path": "big"}),
                               ("amfs_search", {"entity_path": "big", "limit": 100}),
                               ("amfs_search", {"entity_path": "big", "limit": 100, "sort_by": "priority"}),
                               ("amfs_retrieve", {"query": "payload words", "entity_path": "big", "limit": 1})]:
                started = time.perf_counter()
                await client.call_tool(tool, args)
                print(f"{tool} {args.get('sort_by', '')}: {time.perf_counter() - started:.2f} s")
    print(f"peak memory of the process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--values", type=int, default=30)
    asyncio.run(run(parser.parse_args().values))


if __name__ == "__main__":
    main()
