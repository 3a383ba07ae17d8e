"""One model for all processes: trained ranker models and applied multipliers live in the store, and
every process on that store picks up newer ones within seconds, without a restart."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from fastmcp import Client

from amfs_server.core.ports import StoreSnapshot
from amfs_server.adapters.sqlite import SQLiteStore
from amfs_server.core.confidence import DEFAULT_MULTIPLIERS
from amfs_server.core.service import MemoryService
from amfs_server.ml import MLService
from amfs_server.server.settings import load_settings
from amfs_server.session_bench.mcp_latency import server_env, spawn_http_server

from .conftest import planted_history

PICK_UP_LIMIT_S = 10.0
POSTGRES_DSN = os.environ.get("AMFS_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")


async def _postgres_unavailable_reason() -> str | None:
    """Same probe as tests/conftest.py (conftest is not importable under --import-mode=importlib)."""
    try:
        import asyncpg

        conn = await asyncpg.connect(POSTGRES_DSN, timeout=5)
        await conn.close()
        return None
    except Exception as error:  # any failure means: skip
        return f"{type(error).__name__}: {error}"


async def _learned_in_retrieval(client: Client) -> bool:
    result = await client.call_tool("amfs_retrieve", {"query": "payments retry", "explain": True})
    hits = result.structured_content["results"]
    assert hits, "the seeded history must match the query"
    return any("learned" in (hit.get("explain") or {}) for hit in hits)


@pytest.mark.postgres
@pytest.mark.slow
async def test_a_retrain_through_one_server_reaches_another_server_on_the_same_postgres_within_10_s(
    simulated_history: StoreSnapshot, tmp_path: Path
) -> None:
    from amfs_server.adapters.postgres import PostgresStore

    if reason := await _postgres_unavailable_reason():
        pytest.skip(f"PostgreSQL with pgvector unavailable: {reason}")
    schema = f"amfs_mlshare_{uuid.uuid4().hex[:12]}"
    seeding = MemoryService(PostgresStore(POSTGRES_DSN, embedding_dimension=384, schema=schema))
    await seeding.open()
    await seeding.import_snapshot(simulated_history)
    await seeding.close()
    dsn = f"{POSTGRES_DSN}{'&' if '?' in POSTGRES_DSN else '?'}options={quote(f'-csearch_path={schema}', safe='')}"
    servers = []
    try:
        for name in ("a", "b"):
            env = server_env(tmp_path / f"data-{name}", AMFS_EMBEDDER="none", AMFS_POSTGRES_DSN=dsn)
            servers.append(await asyncio.to_thread(spawn_http_server, "http", env, 90))
        first, second = servers
        async with Client(f"{first.base_url}/mcp") as a, Client(f"{second.base_url}/mcp") as b:
            assert not await _learned_in_retrieval(b)
            await a.call_tool("amfs_retrain", {})
            assert await _learned_in_retrieval(a)
            retrained = time.monotonic()
            while not await _learned_in_retrieval(b):
                assert time.monotonic() - retrained < PICK_UP_LIMIT_S, "server b never picked up the new model"
                await asyncio.sleep(0.25)
    finally:
        for server in servers:
            server.stop()
        dropping = PostgresStore(POSTGRES_DSN, embedding_dimension=384, schema=schema)
        await dropping.open()
        await dropping.drop_schema()
        await dropping.close()


async def test_multipliers_applied_through_one_process_drive_outcomes_in_another_without_a_restart(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shared.db"
    first, second = MemoryService(SQLiteStore(path)), MemoryService(SQLiteStore(path))
    await first.open()
    await second.open()
    await first.import_snapshot(planted_history(outcomes=1500))
    watching = MLService(second, tmp_path / "exports", poll_seconds=0.1)
    await watching.start()
    try:
        report = await MLService(first, tmp_path / "exports").calibrate(apply=True)
        assert report.applied and first.multipliers != DEFAULT_MULTIPLIERS
        deadline = time.monotonic() + PICK_UP_LIMIT_S
        while second.multipliers != first.multipliers:
            assert time.monotonic() < deadline, "the other process kept the old multipliers"
            await asyncio.sleep(0.05)
        await MLService(first, tmp_path / "exports").revert_calibration()
        while second.multipliers != DEFAULT_MULTIPLIERS:
            assert time.monotonic() < deadline + PICK_UP_LIMIT_S, "the other process kept the reverted multipliers"
            await asyncio.sleep(0.05)
    finally:
        await watching.stop()
        await first.close()
        await second.close()


def test_the_ml_directory_defaults_under_the_data_directory_never_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir("/")
    settings = load_settings({"AMFS_DATA_DIR": str(tmp_path / "data")})
    assert settings.ml_dir == tmp_path / "data" / "ml"
    assert load_settings({}).ml_dir == Path.home() / ".amfs" / "ml"
    assert load_settings({"AMFS_ML_MODEL_DIR": str(tmp_path / "elsewhere")}).ml_dir == tmp_path / "elsewhere"
