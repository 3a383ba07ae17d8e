"""Shared fixtures: a store per adapter (`[sqlite]`, `[postgres]`) and a service on top of it.

Postgres tests need a server with pgvector (the README's test command provides one). When none can be
had they are skipped, and the session prints a loud line saying so.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from amfs_server.core.models import Actor
from amfs_server.core.service import MemoryService, ServiceConfig

POSTGRES_DSN = os.environ.get("AMFS_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
_postgres_problem: list[str] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    """Probe PostgreSQL once, before any test's event loop exists."""
    import asyncio

    async def probe() -> None:
        import asyncpg

        conn = await asyncpg.connect(POSTGRES_DSN, timeout=5)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        finally:
            await conn.close()

    try:
        asyncio.run(probe())
        _postgres_problem.append("")
    except Exception as error:  # any failure means: skip, loudly
        _postgres_problem.append(f"{type(error).__name__}: {error}")


def postgres_unavailable_reason() -> str | None:
    """Why Postgres tests cannot run here (None when they can)."""
    return _postgres_problem[0] if _postgres_problem and _postgres_problem[0] else None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _postgres_problem and _postgres_problem[0]:
        terminalreporter.write_line(
            f"!!! POSTGRES TESTS WERE SKIPPED: no PostgreSQL with pgvector at {POSTGRES_DSN} "
            f"({_postgres_problem[0]}). Run scripts/ensure_postgres.sh. !!!",
            red=True,
            bold=True,
        )


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[object]:
    if request.param == "sqlite":
        from amfs_server.adapters.sqlite import SQLiteStore

        sqlite_store = SQLiteStore(tmp_path / "amfs.db")
        await sqlite_store.open()
        yield sqlite_store
        await sqlite_store.close()
        return
    reason = postgres_unavailable_reason()
    if reason:
        pytest.skip(f"PostgreSQL with pgvector unavailable: {reason}")
    from amfs_server.adapters.postgres import PostgresStore

    schema = f"amfs_test_{uuid.uuid4().hex[:12]}"
    pg_store = PostgresStore(POSTGRES_DSN, embedding_dimension=384, schema=schema)
    await pg_store.open()
    try:
        yield pg_store
    finally:
        await pg_store.drop_schema()
        await pg_store.close()


@pytest.fixture
def make_store(store: object) -> Callable[..., object]:
    """New handles on the `store` fixture's data (the same file or schema; the fixture cleans it up), unopened, for
    an embedder of `dimension` (None: no embedder, as the commands that need none open a store)."""
    from amfs_server.adapters.sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        return lambda dimension=384: SQLiteStore(store.path)
    from amfs_server.adapters.postgres import PostgresStore

    return lambda dimension=384: PostgresStore(store.dsn, embedding_dimension=dimension, schema=store.schema)


@pytest.fixture
async def service(store) -> MemoryService:
    svc = MemoryService(store, ServiceConfig())
    await svc.open()
    return svc


@pytest.fixture
def actor() -> Actor:
    return Actor("agent/test", f"session-{uuid.uuid4().hex[:8]}")
