"""Page-load benchmark of the memory browser on a big SQLite store.

    python -m amfs_server.session_bench.ui_bench --entries 100000 [--browser]

Bulk-loads `--entries` entries (embedder off) over 1,000 entity paths into a fresh SQLite store, starts a
real `amfs-server serve --transport http` with an API key on it, and times the first view: the page, its
two assets, whoami and the tree API (cold: the first requests after start; warm: median of `--repeat`),
then the other list APIs. With `--browser` (chromium + chromedriver + selenium) it also times, in headless
Chromium, navigation to the tree shown on screen. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KEY = "bench-key-0000000000000000001"


def entity_path(i: int) -> str:
    return f"org-{i % 10}/team-{(i // 10) % 20}/svc-{(i // 200) % 5}"


def load(data_dir: Path, entries: int, batch: int = 5000) -> float:
    from ..core.models import Actor
    from ..core.service import WriteRequest
    from ..server.composition import build_service
    from ..server.settings import load_settings

    async def main() -> float:
        service = build_service(load_settings({}, data_dir=data_dir, embedder="none"))
        await service.open()
        actor = Actor("agent/bench", "bench")
        started = time.perf_counter()
        try:
            for start in range(0, entries, batch):
                await service.write_many(actor, [
                    WriteRequest(entity_path(i), f"note-{i:06d}", {"text": f"note {i} about deploys and retries", "n": i})
                    for i in range(start, min(entries, start + batch))
                ])
        finally:
            await service.close()
        return time.perf_counter() - started

    return asyncio.run(main())


def time_get(client: Any, path: str, headers: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    response = client.get(path, headers=headers or {})
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise SystemExit(f"GET {path}: HTTP {response.status_code}: {response.text[:200]}")
    return elapsed


def first_view(client: Any) -> dict[str, float]:
    auth = {"Authorization": f"Bearer {KEY}"}
    parts = {
        "page": time_get(client, "/ui/"),
        "app.js": time_get(client, "/ui/static/app.js"),
        "style.css": time_get(client, "/ui/static/style.css"),
        "whoami": time_get(client, "/ui/api/whoami", auth),
        "tree": time_get(client, "/ui/api/tree", auth),
    }
    parts["total"] = sum(parts.values())
    return parts


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--browser", action="store_true", help="Also time the page in headless Chromium.")
    args = parser.parse_args(argv)
    if args.entries < 1 or args.repeat < 1:
        parser.error("--entries and --repeat must be at least 1")

    import httpx2  # the default install's HTTP client (mcp's); httpx is a test dependency only

    from .mcp_latency import server_env, spawn_http_server

    data_dir = Path(tempfile.mkdtemp(prefix="amfs-ui-bench-"))
    load_s = load(data_dir, args.entries)
    server = spawn_http_server("http", server_env(data_dir, AMFS_EMBEDDER="none", AMFS_API_KEYS=KEY), timeout_s=120)
    result: dict[str, Any] = {"entries": args.entries, "entity_paths": min(args.entries, 1000), "load_s": round(load_s, 1)}
    try:
        with httpx2.Client(base_url=server.base_url, timeout=60) as client:
            result["first_view_cold_ms"] = {name: ms(s) for name, s in first_view(client).items()}
            warm = [first_view(client) for _ in range(args.repeat)]
            result["first_view_warm_median_ms"] = {name: ms(statistics.median(w[name] for w in warm)) for name in warm[0]}
            auth = {"Authorization": f"Bearer {KEY}"}
            # Addresses of data this run loaded, so any --entries works (the figures in the README use 100,000).
            probe = args.entries * 3 // 4
            path = entity_path(probe)
            apis = {
                "tree of one org": f"/ui/api/tree?path={path.split('/')[0]}",
                "entries page (50)": f"/ui/api/entries?path={path}&limit=50",
                "entry detail": f"/ui/api/entry?path={path}&key=note-{probe:06d}",
                "search (keyword; embedder off)": f"/ui/api/search?q=note%20{probe}%20deploys",
                "outcomes page": "/ui/api/outcomes",
            }
            result["apis_warm_median_ms"] = {
                name: ms(statistics.median(time_get(client, path, auth) for _ in range(args.repeat)))
                for name, path in apis.items()
            }
        if args.browser:
            result["browser_ms"] = browser_load(server.base_url, args.repeat)
    finally:
        server.stop()
    json.dump(result, sys.stdout, indent=2)
    print()


def browser_load(base_url: str, repeat: int) -> dict[str, float]:
    """Navigation start to the tree rendered (the page's `amfs-tree-shown` performance mark), key in sessionStorage."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))
    from browser import start_browser, wait_for  # type: ignore[import-not-found]

    driver = start_browser()
    try:
        driver.get(base_url + "/ui/")
        driver.execute_script("sessionStorage.setItem('amfs-ui-key', arguments[0])", KEY)
        times = []
        for n in range(repeat):
            driver.get(f"{base_url}/ui/?load={n}")  # a new URL each time: a full navigation, not a hash change
            wait_for(driver, "#tree-total", timeout=60)
            times.append(driver.execute_script(
                "return performance.getEntriesByName('amfs-tree-shown')[0].startTime") / 1000)
        return {"navigation_to_tree_shown_median": ms(statistics.median(times)), "navigation_to_tree_shown_max": ms(max(times))}
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
