"""MCP progress notifications for long tools (retrain, calibrate, export, bulk import).

In a tool body, `await ctx.report_progress(done, total, message)` is enough. Work that runs in a
worker thread (`asyncio.to_thread`) takes the callback from `thread_progress(ctx)` instead: it is
called from the thread and forwards to the client on the event loop. Both are no-ops when the
client did not ask for progress (no progress token).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable

from fastmcp import Context

logger = logging.getLogger("amfs_server.tools")

ProgressCallback = Callable[[float, float | None, str | None], None]


def thread_progress(ctx: Context) -> ProgressCallback:
    """A thread-safe `progress(done, total, message)` callback that sends MCP progress notifications."""
    loop = asyncio.get_running_loop()

    def report(done: float, total: float | None = None, message: str | None = None) -> None:
        future = asyncio.run_coroutine_threadsafe(ctx.report_progress(done, total, message), loop)
        future.add_done_callback(_log_failure)

    return report


def _log_failure(future: concurrent.futures.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.warning("Could not send a progress notification: %s", future.exception())
