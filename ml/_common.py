"""Small pieces every ML module shares: the progress callback type and how a store-or-service is resolved."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.ports import MemoryStore
from ..core.service import MemoryService

Progress = Callable[[float, "float | None", "str | None"], None]
"""`progress(done, total, message)`; may be called from a worker thread (the MCP tools pass a thread-safe one)."""


def no_progress(done: float, total: float | None = None, message: str | None = None) -> None:
    return None


def resolve_service(service_or_store: MemoryService | MemoryStore | Any) -> tuple[MemoryService, bool]:
    """The service to read through, and whether the caller gave one (only then can ML install or apply)."""
    if isinstance(service_or_store, MemoryService):
        return service_or_store, True
    # A bare store: a default service gives the same derived values (tiers) without owning the store's lifecycle.
    return MemoryService(service_or_store), False
