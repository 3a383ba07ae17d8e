"""A full disk: writes are refused with a clear error naming the data directory; reads keep working.

The SQLite test fills a real 3 MB tmpfs (needs root to mount; skipped otherwise); the bookkeeping and
PostgreSQL checks simulate the error where a full disk cannot be made on demand."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastmcp import Client

from amfs_server.adapters.sqlite import SQLiteStore
from amfs_server.core.errors import StorageFullError
from amfs_server.core.models import Actor
from amfs_server.core.service import MemoryService, ServiceConfig, WriteRequest

ACTOR = Actor("agent/test", "session-1")


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


async def fill(service: MemoryService) -> int:
    written = 0
    with pytest.raises(StorageFullError) as full:
        for n in range(1000):
            await service.write(ACTOR, WriteRequest(entity_path="svc", key=f"k{n}", value="x" * 100_000))
            written += 1
    assert "is full" in str(full.value)
    return written


async def test_a_full_disk_refuses_writes_by_name_and_reads_keep_working(tiny_disk: Path) -> None:
    store = SQLiteStore(tiny_disk / "amfs.db")
    service = MemoryService(store, ServiceConfig())
    await service.open()
    try:
        written = await fill(service)
        assert written > 0
        with pytest.raises(StorageFullError, match=str(tiny_disk)):
            await service.write(ACTOR, WriteRequest(entity_path="svc", key="one-more", value="x" * 100_000))
        entry = await service.read(ACTOR, "svc", "k0")
        assert entry.value == "x" * 100_000
        assert len(await service.search(entity_path="svc")) == written
        assert len(await service.list(entity_path="svc")) == written
    finally:
        await service.close()


async def test_over_mcp_a_full_disk_is_a_clear_tool_error_and_reads_still_answer(tiny_disk: Path) -> None:
    from amfs_server.server.app import create_app
    from amfs_server.server.composition import build_service
    from amfs_server.server.settings import load_settings

    settings = load_settings({}, data_dir=tiny_disk, embedder="none")
    app = create_app(build_service(settings), settings)
    async with Client(app) as client:
        refused = None
        for n in range(1000):
            result = await client.call_tool(
                "amfs_write", {"entity_path": "svc", "key": f"k{n}", "value": "x" * 100_000}, raise_on_error=False
            )
            if result.is_error:
                refused = result.content[0].text
                break
        assert refused is not None and "is full" in refused and str(tiny_disk) in refused
        assert "Internal error" not in refused
        read = await client.call_tool("amfs_read", {"entity_path": "svc", "key": "k0"})
        assert read.structured_content["value"] == "x" * 100_000
        assert (await client.call_tool("amfs_list", {})).structured_content["count"] == n


async def test_read_bookkeeping_that_fails_for_lack_of_space_does_not_fail_the_read(
    service: MemoryService, store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await service.write(ACTOR, WriteRequest(entity_path="svc", key="k", value="v"))

    async def full(*args: object, **kwargs: object) -> None:
        raise StorageFullError("The disk holding the store is full")

    monkeypatch.setattr(store, "record_reads", full)
    assert (await service.read(ACTOR, "svc", "k")).value == "v"
    assert any("without its bookkeeping" in record.getMessage() for record in caplog.records)


async def test_postgres_disk_full_becomes_a_storage_full_error(store) -> None:
    if not hasattr(store, "_tx"):
        pytest.skip("PostgreSQL only")
    import asyncpg

    async def no_space(conn: object) -> None:
        raise asyncpg.DiskFullError("could not extend file: No space left on device")

    with pytest.raises(StorageFullError, match="no space left"):
        await store._tx(no_space)
