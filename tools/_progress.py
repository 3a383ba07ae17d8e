"""MCP progress notifications for long tools (retrain, calibrate, export).

In a tool body, `await ctx.report_progress(done, total, message)` is enough. Work that runs in a
worker thread (`asyncio.to_thread`) takes a `ThreadProgress(ctx)` instead: it is called from the
thread, forwards to the client on the event loop, and `drain()` before returning the result makes sure
no notification trails it. Notifications are no-ops when the client did not ask for progress.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable

from fastmcp import Context

logger = logging.getLogger("amfs_server.tools")

ProgressCallback = Callable[[float, float | None, str | None], None]
DRAIN_TIMEOUT_S = 5.0


class ThreadProgress:
    """`progress(done, total, message)` callable from the event loop or a worker thread; `drain()` waits
    (bounded) until every notification it scheduled was sent."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._loop = asyncio.get_running_loop()
        self._pending: list[concurrent.futures.Future[None]] = []

    def __call__(self, done: float, total: float | None = None, message: str | None = None) -> None:
        self._pending.append(
            asyncio.run_coroutine_threadsafe(self._ctx.report_progress(done, total, message), self._loop)
        )

    async def drain(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        done, not_done = await asyncio.wait([asyncio.wrap_future(f) for f in pending], timeout=DRAIN_TIMEOUT_S)
        failed = [f.exception() for f in done if f.exception() is not None]
        if failed or not_done:
            logger.warning("%d progress notifications failed, %d unsent", len(failed), len(not_done))
