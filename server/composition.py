"""The composition root: settings -> store + embedder -> MemoryService. Front ends call `build_service`."""

from __future__ import annotations

import logging
import threading

from ..adapters import create_store
from ..core.confidence import DEFAULT_MULTIPLIERS
from ..core.service import MemoryService, ServiceConfig
from .settings import Settings


def build_service(settings: Settings) -> MemoryService:
    embedder = None
    if settings.embedder is not None:
        from ..adapters.embedders import load_embedder

        embedder = load_embedder(settings.embedder)
    store = create_store(
        settings.sqlite_path, settings.postgres_dsn, embedding_dimension=embedder.dimension if embedder else 384
    )
    config = ServiceConfig(
        decay_half_life_days=settings.decay_half_life_days,
        max_value_bytes=settings.max_value_bytes,
        multipliers=dict(DEFAULT_MULTIPLIERS),
    )
    return MemoryService(store, config, embedder=embedder)


def preload_embedder(settings: Settings) -> None:
    """Start loading the configured embedding model in a background thread, before the caller imports the MCP
    stack: the two overlap (onnxruntime builds its session without the GIL), so the first write waits less.
    The same cached instance serves the service; a failure is left to the server's warm-up and first write,
    which report it."""
    if settings.embedder is None:
        return

    def load() -> None:
        try:
            from ..adapters.embedders import load_embedder

            load_embedder(settings.embedder).load()
        except Exception:
            logging.getLogger(__name__).debug("Preloading the embedder failed", exc_info=True)

    threading.Thread(target=load, name="amfs-embedder-preload", daemon=True).start()
