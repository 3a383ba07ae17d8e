"""ML state that every server process on one store shares: the trained models and applied multipliers
live in the store (named JSON values, `MemoryService.get_shared_state`). A small version record says when
the models last changed; it is written in the same transaction as the models (`save_ranker_models`), so a
crash never leaves new models unannounced. The multipliers are their own version: a small record, compared
whole.

Each process runs a `SharedStateWatcher`: every `POLL_SECONDS` it reads the version record and the multipliers
(two primary-key lookups) and, when either differs from what the process last loaded, reloads the models (the
parsing runs in a worker thread) or the multipliers. So a retrain or calibration through any process reaches
all of them within a few seconds, without a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from ..core.errors import StoreError
from ..core.service import MULTIPLIERS_META, MemoryService

logger = logging.getLogger("amfs_server.ml")

RANKER_MODELS = "ml.ranker_models"
ML_VERSION = "ml.version"
RANKER = "ranker"
MULTIPLIERS = "multipliers"
POLL_SECONDS = 2.0


async def save_ranker_models(service: MemoryService, change: Callable[[Any], dict[str, Any]]) -> None:
    """Store `change(the models record held)` and a new version mark in one transaction that no other process's
    save interleaves with: two processes training models for two scopes at once keep both (each used to write
    back the record it had read, without the other's model), and a process killed after the save cannot leave
    the others on the old models (the mark used to be a second write)."""
    def update(held: dict[str, Any]) -> dict[str, Any]:
        version = held[ML_VERSION] if isinstance(held[ML_VERSION], dict) else {}
        # A random token, so two processes never pick the same one.
        return {RANKER_MODELS: change(held[RANKER_MODELS]), ML_VERSION: {**version, RANKER: uuid.uuid4().hex}}

    await service.update_shared_state([RANKER_MODELS, ML_VERSION], update)


async def read_version(service: MemoryService) -> dict[str, str]:
    """What the watcher compares per part: the models' version mark, and the multipliers in force as stored."""
    value = await service.get_shared_state(ML_VERSION)
    multipliers = await service.get_shared_state(MULTIPLIERS_META)
    return {RANKER: value.get(RANKER) if isinstance(value, dict) else None,
            MULTIPLIERS: None if multipliers is None else json.dumps(multipliers, sort_keys=True)}


class SharedStateWatcher:
    """Polls the version record and calls `reload[part]()` for each part that changed since the last look."""

    def __init__(
        self,
        service: MemoryService,
        reload: dict[str, Callable[[], Awaitable[Any]]],
        interval: float = POLL_SECONDS,
    ) -> None:
        self.service = service
        self.reload = reload
        self.interval = interval
        self.seen: dict[str, str | None] = {}
        self._task: asyncio.Task[None] | None = None

    async def mark_current(self) -> None:
        """Record the version as loaded (call before loading everything at start-up, so nothing is missed)."""
        version = await read_version(self.service)
        self.seen = {part: version.get(part) for part in self.reload}

    async def check(self) -> list[str]:
        """One look: reload what changed; returns the parts reloaded."""
        version = await read_version(self.service)
        changed = [part for part in self.reload if version.get(part) != self.seen.get(part)]
        for part in changed:
            await self.reload[part]()
            self.seen[part] = version.get(part)
        return changed

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="amfs-ml-watcher")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except StoreError as error:  # the store is away (a database restart): one line, not a traceback a poll
                logger.warning("Checking for newer ML models/multipliers failed (%s); retrying in %.0fs", error,
                               self.interval)
            except Exception:  # a store hiccup must not end the watcher; the next look retries
                logger.exception("Checking for newer ML models/multipliers failed; retrying in %.0fs", self.interval)
