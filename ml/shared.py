"""ML state that every server process on one store shares: the trained models and applied multipliers
live in the store (named JSON values, `MemoryService.get_shared_state`), and a small version record
says when either last changed.

Each process runs a `SharedStateWatcher`: every `POLL_SECONDS` it reads the version record (one
primary-key lookup) and, when it differs from what the process last loaded, reloads the models (the
parsing runs in a worker thread) and the multipliers. So a retrain or calibration through any process
reaches all of them within a few seconds, without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from ..core.errors import StoreError
from ..core.service import MemoryService

logger = logging.getLogger("amfs_server.ml")

RANKER_MODELS = "ml.ranker_models"
ML_VERSION = "ml.version"
RANKER = "ranker"
MULTIPLIERS = "multipliers"
POLL_SECONDS = 2.0


async def bump_version(service: MemoryService, part: str) -> dict[str, str]:
    """Mark `part` (RANKER or MULTIPLIERS) as changed; a random token, so two processes never pick the same one."""
    current = await read_version(service)
    updated = {**current, part: uuid.uuid4().hex}
    await service.set_shared_state(ML_VERSION, updated)
    return updated


async def read_version(service: MemoryService) -> dict[str, str]:
    value = await service.get_shared_state(ML_VERSION)
    return dict(value) if isinstance(value, dict) else {}


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
