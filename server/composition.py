"""The composition root: settings -> store + embedder -> MemoryService. Front ends call `build_service`."""

from __future__ import annotations

from ..adapters import create_store
from ..core.confidence import DEFAULT_MULTIPLIERS
from ..core.service import MemoryService, ServiceConfig
from .settings import Settings


def build_service(settings: Settings) -> MemoryService:
    embedder = None
    if settings.embedder is not None:
        from ..core.embedding import load_embedder

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
