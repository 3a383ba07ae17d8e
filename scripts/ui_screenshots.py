"""Screenshots of every memory-browser view for the README (docs/ui/*.png), taken by headless Chromium.

    PYTHONPATH=<parent of amfs_server> python scripts/ui_screenshots.py [--out docs/ui]

Seeds a demo store (entries over a few services, a rewritten entry with outcomes, agent sessions that read
and then succeed or fail, learned preferences and a workflow pattern, a trained ranker), starts a real
`amfs-server serve --transport http` with an API key on it and photographs each view.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "server"))

from browser import log_in, start_browser, wait_for, wait_until  # noqa: E402  type: ignore[import-not-found]

from amfs_server.core.errors import InsufficientDataError  # noqa: E402
from amfs_server.core.models import Actor  # noqa: E402
from amfs_server.core.service import WriteRequest  # noqa: E402
from amfs_server.ml.service import MLService  # noqa: E402
from amfs_server.server.composition import build_service  # noqa: E402
from amfs_server.server.config_file import build_learning_service  # noqa: E402
from amfs_server.server.settings import load_settings  # noqa: E402
from amfs_server.session_bench.mcp_latency import server_env, spawn_http_server  # noqa: E402

KEY = "demo-key-000000000000000001"
FACTS = {
    "checkout-service": {
        "retry-policy": {"retries": 3, "backoff": "exponential", "max_delay_s": 20},
        "payment-timeout": "The payments gateway times out after 30 s; keep client timeouts above 35 s.",
        "idempotency": "Every charge carries an Idempotency-Key header derived from the order id.",
    },
    "checkout-service/eu": {"provider": "Adyen handles EU card payments; SEPA goes through the bank connector."},
    "search-service": {
        "index-rebuild": "The search index rebuilds nightly at 02:00 UTC; queries fall back to the replica.",
        "synonyms": ["sneakers=trainers", "tee=t-shirt", "hoodie=sweatshirt"],
    },
    "infra/database": {
        "connection-pool": {"max": 50, "idle_timeout_s": 300},
        "lock-timeouts": "Long migrations must set lock_timeout = 5s to avoid blocking checkout writes.",
    },
    "infra/queues": {"dead-letter": "Messages go to the dead-letter queue after 5 failed deliveries."},
}


async def seed(data_dir: Path, model_dir: Path) -> None:
    settings = load_settings({}, data_dir=data_dir, ml_model_dir=model_dir)  # the real embedder: semantic search too
    service = build_service(settings)
    learning = build_learning_service(settings)
    await service.open()
    ml = MLService(service, model_dir)
    try:
        writer = Actor("agent/claude-code", "setup")
        await service.write_many(writer, [
            WriteRequest(path, key, value, confidence=0.9) for path, items in FACTS.items() for key, value in items.items()
        ])
        await service.write(writer, WriteRequest(
            "checkout-service", "retry-policy", {"retries": 5, "backoff": "exponential", "max_delay_s": 30}, confidence=0.8
        ))
        keys = [f"{path}/{key}" for path, items in FACTS.items() for key in items]
        kinds = ["success", "success", "minor_failure", "success", "failure", "success", "critical_failure", "success"]
        for n in range(48):
            actor = Actor(f"agent/worker-{n % 3}", f"session-{n}")
            for key in (keys[n % len(keys)], keys[(n * 5 + 1) % len(keys)], "checkout-service/retry-policy"):
                path, _, name = key.rpartition("/")
                await service.read(actor, path, name)
            await service.commit_outcome(actor, f"task-{n:03d}", kinds[n % len(kinds)])
        for n in range(12):
            user = Actor("agent/claude-code", f"work-{n}")
            await learning.record_interaction(user, "github_create_issue", {"repo": "acme/checkout", "labels": ["bug"]})
            await learning.record_interaction(user, "github_add_comment", {"repo": "acme/checkout"})
            await learning.record_interaction(user, "slack_post_message", {"channel": "#checkout-alerts"})
        await learning.set_preference("agent/claude-code", "style", "test_framework", "pytest")
        await learning.patterns(None)
        try:
            await ml.retrain()
        except InsufficientDataError as error:
            print(f"no ranker for the screenshots: {error}", file=sys.stderr)
    finally:
        await learning.close()
        await service.close()


def shoot(driver, path: Path) -> None:
    height = driver.execute_script("return Math.max(document.body.scrollHeight, 600)")
    driver.set_window_size(1280, min(int(height) + 40, 2400))
    driver.save_screenshot(str(path))
    driver.set_window_size(1280, 900)
    print(f"wrote {path}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "ui")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="amfs-ui-shots-"))
    model_dir = data_dir / "ml"
    asyncio.run(seed(data_dir, model_dir))
    env = server_env(data_dir, AMFS_API_KEYS=KEY, AMFS_ML_MODEL_DIR=str(model_dir))
    server = spawn_http_server("http", env, timeout_s=120)
    driver = start_browser()
    base = server.base_url
    try:
        driver.get(base + "/ui/")
        wait_for(driver, "#login-key")
        shoot(driver, args.out / "login.png")
        log_in(driver, base, KEY)
        driver.get(base + "/ui/#/browse?path=checkout-service")
        wait_for(driver, 'tr[data-entry="checkout-service/retry-policy"]')
        wait_for(driver, 'li[data-path="checkout-service/eu"]')
        shoot(driver, args.out / "browse.png")
        driver.get(base + "/ui/#/entry?path=checkout-service&key=retry-policy")
        wait_for(driver, "#confidence-chart")
        wait_for(driver, "#diff .add")
        driver.find_elements("css selector", "#confidence-chart circle.failure")[0].click()
        wait_for(driver, "#outcome-detail")
        shoot(driver, args.out / "entry.png")
        driver.get(base + "/ui/#/search?q=how%20long%20before%20card%20charges%20give%20up")
        wait_for(driver, "#search-results tbody tr", timeout=120)  # the first search loads the embedding model
        shoot(driver, args.out / "search.png")
        driver.get(base + "/ui/#/outcomes")
        wait_for(driver, "#outcomes tbody tr")
        shoot(driver, args.out / "outcomes.png")
        driver.get(base + "/ui/#/learning")
        wait_for(driver, "#preferences")
        shoot(driver, args.out / "learning.png")
        driver.get(base + "/ui/#/ml")
        wait_for(driver, "#ml-ranker")
        driver.find_element("id", "calibration-run").click()
        wait_until(driver, lambda d: "computing" not in d.find_element("id", "ml-calibration").text)
        shoot(driver, args.out / "ml.png")
    finally:
        driver.quit()
        server.stop()


if __name__ == "__main__":
    main()
