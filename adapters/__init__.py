"""Storage adapters behind the `MemoryStore` Protocol; `create_store` picks one from settings."""

from __future__ import annotations

from pathlib import Path

from ..core.ports import MemoryStore


def create_store(
    sqlite_path: Path, postgres_dsn: str | None = None, embedding_dimension: int | None = 384
) -> MemoryStore:
    """PostgreSQL when a DSN is given, else the embedded SQLite file. `embedding_dimension`: the embedder's; None
    (no embedder) opens a PostgreSQL store at whatever vector width it has."""
    if postgres_dsn:
        from .postgres import PostgresStore

        return PostgresStore(postgres_dsn, embedding_dimension=embedding_dimension)
    from .sqlite import SQLiteStore

    return SQLiteStore(sqlite_path)
