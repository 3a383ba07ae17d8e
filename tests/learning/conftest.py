"""Fixtures for learning: a LearningStore per adapter (`[sqlite]`, `[postgres]` in a fresh schema that is
dropped afterwards), a controllable clock, and a LearningService over both."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from amfs_server.core.learning import LearningConfig, LearningService
from amfs_server.core.models import Actor

POSTGRES_DSN = os.environ.get("AMFS_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
_probe: list[str] = []


async def postgres_problem() -> str | None:
    """Why the [postgres] learning tests cannot run here (None when they can); probed once."""
    if not _probe:
        try:
            import asyncpg

            await (await asyncpg.connect(POSTGRES_DSN, timeout=5)).close()
            _probe.append("")
        except Exception as error:
            _probe.append(f"{type(error).__name__}: {error}")
    return _probe[0] or None


class Clock:
    """A clock the tests move by hand (no sleeps)."""

    def __init__(self, start: datetime = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["sqlite", "postgres"])
async def learning_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "sqlite":
        from amfs_server.adapters.sqlite_learning import SQLiteLearningStore

        store = SQLiteLearningStore(tmp_path / "learning.db")
        yield store
        await store.close()
        return
    problem = await postgres_problem()
    if problem:
        pytest.skip(f"PostgreSQL unavailable at {POSTGRES_DSN}: {problem}")
    from amfs_server.adapters.postgres_learning import PostgresLearningStore

    store = PostgresLearningStore(POSTGRES_DSN, schema=f"amfs_learning_test_{uuid.uuid4().hex[:12]}")
    try:
        yield store
    finally:
        await store.drop_schema()


@pytest.fixture
def make_learning(learning_store: Any, clock: Clock) -> Callable[..., LearningService]:
    """A LearningService over the test's store; keyword arguments are LearningConfig fields."""

    def make(**config: Any) -> LearningService:
        return LearningService(learning_store, LearningConfig(**config), clock=clock)

    return make


@pytest.fixture
async def learning(make_learning: Callable[..., LearningService]) -> LearningService:
    service = make_learning()
    await service.open()
    return service


@pytest.fixture
def actor() -> Actor:
    return Actor("agent/alice", "session-1")
