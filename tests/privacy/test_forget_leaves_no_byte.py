"""Forget and clear leave no byte: a unique marker planted in a memory, used (read, retrieve, outcome,
export) through a real MCP client on the real app with the real embedding model, then forgotten
(`amfs_forget`, `amfs-server memory forget`) or cleared (`memory clear`), is found in no file under the
data directory (database, WAL, -shm, vector index, learning database: the raw bytes) and not in
`memory export`; nor is the memory's embedding in the vector index file, nor its sentences' embeddings anywhere. On PostgreSQL: in no table
of the schema. Each test first checks that the marker (and the vector) *were* there, so a pass means
they were removed, not that the check looked in the wrong place."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from fastmcp import Client

from amfs_server.adapters.sqlite import SQLiteStore
from amfs_server.core.models import Actor, EntryFilter, utcnow
from amfs_server.core.service import MemoryService, WriteRequest
from amfs_server.server.app import create_app
from amfs_server.server.cli import cli
from amfs_server.server.composition import build_service
from amfs_server.server.settings import load_settings


ENTITY, KEY = "people/ada", "home-address"
ACTOR = Actor("agent/test", "s1")


def new_marker() -> str:
    # No English suffix for the porter stemmer to cut: the FTS5 index would keep the token as written.
    return "zqx" + uuid.uuid4().hex[:12] + "vk"


def raw_files(data_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(data_dir)): p.read_bytes() for p in sorted(data_dir.rglob("*")) if p.is_file()}


def files_holding(data_dir: Path, needle: bytes) -> list[str]:
    return [name for name, data in raw_files(data_dir).items() if needle in data]


async def run_cli(data_dir: Path, monkeypatch, *args: str) -> str:
    """`amfs-server ARGS` on data_dir; in a thread, since the command runs its own event loop."""
    monkeypatch.setenv("AMFS_DATA_DIR", str(data_dir))
    result = await asyncio.to_thread(CliRunner().invoke, cli, list(args))
    assert result.exit_code == 0, result.output
    return result.output


async def export_text(data_dir: Path, monkeypatch) -> str:
    return await run_cli(data_dir, monkeypatch, "memory", "export")


async def use_the_memory(data_dir: Path, marker: str) -> None:
    """Write, read, retrieve and commit an outcome through MCP, then shut the app down (which saves the
    vector index and checkpoints the WAL): the marker is then at rest in every place it can live."""
    settings = load_settings({}, data_dir=data_dir)
    app = create_app(build_service(settings), settings)
    async with Client(app) as client:
        # Two sentences each: the store keeps their embeddings beside the entry vector.
        await client.call_tool("amfs_write", {"entity_path": ENTITY, "key": KEY,
                                              "value": f"Ada lives at 12 {marker} street. The door is green."})
        await client.call_tool("amfs_write", {"entity_path": ENTITY, "key": KEY,
                                              "value": f"Ada moved to 14 {marker} street. Ring twice.", "confidence": 0.9})
        await client.call_tool("amfs_write", {"entity_path": "services/checkout", "key": "retry",
                                              "value": "exponential backoff, max 3 attempts"})
        await client.call_tool("amfs_read", {"entity_path": ENTITY, "key": KEY})
        hits = (await client.call_tool("amfs_retrieve", {"query": "where does ada live?", "limit": 3})).structured_content
        assert any(h["entry_key"] == f"{ENTITY}/{KEY}" for h in hits["results"]), hits
        await client.call_tool("amfs_commit_outcome", {"outcome_ref": "INC-7", "outcome_type": "success"})


def current_embeddings(data_dir: Path) -> tuple[bytes, bytes]:
    """The current version's vector and its first sentence's embedding, as stored."""
    import sqlite3

    conn = sqlite3.connect(data_dir / "amfs.db")
    try:
        (blob, passages) = conn.execute(
            "SELECT embedding, passage_embeddings FROM entries WHERE entity_path = ? AND key = ? AND is_current = 1",
            (ENTITY, KEY),
        ).fetchone()
    finally:
        conn.close()
    # A prefix of the sentence's embedding: the whole passage column (two 768-dimension rows) spills over SQLite's
    # overflow pages, where a long byte run can be split; 64 bytes of float32 noise still occur nowhere by chance.
    return bytes(blob), bytes(passages)[:64]


async def planted(tmp_path: Path, monkeypatch) -> tuple[Path, str, tuple[bytes, bytes]]:
    data_dir = tmp_path / "data"
    marker = new_marker()
    await use_the_memory(data_dir, marker)
    vector, sentence = current_embeddings(data_dir)
    # the controls: before forgetting, the marker is in the database and the export, the vector in its index,
    # the sentence embedding in the database
    assert "amfs.db" in files_holding(data_dir, marker.encode())
    assert any(name.endswith(".usearch") for name in files_holding(data_dir, vector)), raw_files(data_dir).keys()
    assert "amfs.db" in files_holding(data_dir, sentence)
    assert marker in await export_text(data_dir, monkeypatch)
    return data_dir, marker, (vector, sentence)


async def assert_gone(data_dir: Path, marker: str, vectors: tuple[bytes, bytes], monkeypatch) -> None:
    assert files_holding(data_dir, marker.encode()) == []
    assert [files_holding(data_dir, vector) for vector in vectors] == [[], []]
    exported = await export_text(data_dir, monkeypatch)
    assert marker not in exported and f"{ENTITY}/{KEY}" not in exported and KEY not in exported
    assert files_holding(data_dir, marker.encode()) == []  # the export opened the store again: still nothing


async def test_amfs_forget_leaves_no_byte_of_the_memory_in_any_file_or_the_export(tmp_path, monkeypatch) -> None:
    data_dir, marker, vectors = await planted(tmp_path, monkeypatch)
    settings = load_settings({}, data_dir=data_dir)
    app = create_app(build_service(settings), settings)
    async with Client(app) as client:
        forgotten = (await client.call_tool("amfs_forget", {"entity_path": ENTITY, "key": KEY})).structured_content
        assert forgotten["versions_removed"] == 2
        # checked while the server still runs: nothing waits for the shutdown
        assert files_holding(data_dir, marker.encode()) == []
        assert [files_holding(data_dir, v) for v in vectors] == [[], []]
        left = (await client.call_tool("amfs_retrieve", {"query": "checkout retries", "limit": 5})).structured_content
        assert [h["entry_key"] for h in left["results"]] == ["services/checkout/retry"]
    await assert_gone(data_dir, marker, vectors, monkeypatch)


async def test_memory_forget_command_leaves_no_byte_in_any_file_or_the_export(tmp_path, monkeypatch) -> None:
    data_dir, marker, vectors = await planted(tmp_path, monkeypatch)
    await run_cli(data_dir, monkeypatch, "memory", "forget", f"{ENTITY}/{KEY}")
    await assert_gone(data_dir, marker, vectors, monkeypatch)
    exported = json.loads(await export_text(data_dir, monkeypatch))
    assert [e["entity_path"] for e in exported["entries"]] == ["services/checkout"]  # the rest is untouched


async def test_memory_clear_leaves_no_byte_in_any_file_or_the_export(tmp_path, monkeypatch) -> None:
    data_dir, marker, vectors = await planted(tmp_path, monkeypatch)
    await run_cli(data_dir, monkeypatch, "memory", "clear", "--yes")
    await assert_gone(data_dir, marker, vectors, monkeypatch)
    assert files_holding(data_dir, b"exponential backoff") == []


@pytest.mark.parametrize("superseded", [False, True], ids=["current", "superseded"])
async def test_ttl_expiry_leaves_no_byte_of_the_expired_memory(tmp_path, superseded: bool) -> None:
    """The expired version goes whether it is still current (the key goes) or was overwritten (only it goes)."""
    marker = new_marker()
    store = SQLiteStore(tmp_path / "amfs.db")
    service = MemoryService(store)
    await service.open()
    try:
        actor = Actor("agent/test", "s1")
        await service.write(actor, WriteRequest(ENTITY, KEY, f"temporary {marker}", ttl_seconds=60))
        if superseded:
            await service.write(actor, WriteRequest(ENTITY, KEY, "the lasting version"))
        await service.write(actor, WriteRequest("keep", "this", "a memory that stays"))
        await store.close()
        await store.open()
        assert files_holding(tmp_path, marker.encode())
        assert await store.purge_expired(utcnow() + timedelta(minutes=2)) == 1
        assert files_holding(tmp_path, marker.encode()) == []
        left = [e.value for e in await store.history(ENTITY, KEY)]
        assert left == (["the lasting version"] if superseded else [])
    finally:
        await service.close()
    assert files_holding(tmp_path, marker.encode()) == []
    assert files_holding(tmp_path, b"a memory that stays")


async def test_the_keyword_index_drops_a_forgotten_term_from_its_segments(tmp_path) -> None:
    """FTS5 keeps a deleted row's terms in its segment blobs until they merge; forget rewrites them."""
    marker = new_marker()
    store = SQLiteStore(tmp_path / "amfs.db")
    service = MemoryService(store)
    await service.open()
    try:
        actor = Actor("agent/test", "s1")
        await service.write(actor, WriteRequest(ENTITY, KEY, f"term {marker}"))
        for n in range(3):
            await service.write(actor, WriteRequest("other", f"k{n}", f"unrelated note {n}"))

        def segment_bytes() -> bytes:
            return b"".join(bytes(row[0]) for row in store._connection().execute("SELECT block FROM entries_fts_data"))

        assert marker.encode() in segment_bytes()
        await service.forget(ENTITY, KEY)
        assert marker.encode() not in segment_bytes()
        found = await store.keyword_candidates(["unrelated"], EntryFilter(), utcnow(), 10)
        assert sorted(entry.key for entry, _ in found) == ["k0", "k1", "k2"]  # the rest of the index still works
    finally:
        await service.close()


async def every_table_text(store) -> dict[str, str]:
    """Every table of the store's schema (SQLite: of its file) as text, row by row."""
    if store.name == "postgres":
        pool = store._require_pool()
        names = [r[0] for r in await pool.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", store.schema)]
        return {name: "\n".join(r["row"] for r in await pool.fetch(f'SELECT t::text AS row FROM "{store.schema}"."{name}" t'))
                for name in names}
    conn = store._connection()
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {name: "\n".join(repr(tuple(row)) for row in conn.execute(f'SELECT * FROM "{name}"')) for name in names}


async def tables_holding(store, text: str) -> list[str]:
    tables = await every_table_text(store)
    assert {"entries", "trace_events", "outcomes", "outcome_effects", "meta"} <= set(tables)
    return sorted(name for name, rows in tables.items() if text in rows)


async def test_forget_and_clear_leave_the_memory_in_no_table_of_the_schema(service, actor) -> None:
    marker = new_marker()
    await service.write(actor, WriteRequest(ENTITY, KEY, f"lives at {marker} street"))
    await service.write(actor, WriteRequest(ENTITY, KEY, f"moved to {marker} avenue"))
    await service.write(actor, WriteRequest("keep", "this", "a memory that stays"))
    await service.read(actor, ENTITY, KEY)
    await service.retrieve(actor, "where does ada live", limit=3)
    await service.commit_outcome(actor, "INC-9", "success")
    assert "entries" in await tables_holding(service.store, marker)
    assert {"trace_events", "outcome_effects"} <= set(await tables_holding(service.store, ENTITY))

    assert await service.forget(ENTITY, KEY) == 2
    assert await tables_holding(service.store, marker) == []
    assert await tables_holding(service.store, ENTITY) == []  # its traces and outcome effects went too
    assert await service.outcome_records() == []  # the outcome touched only the forgotten memory
    assert "entries" in await tables_holding(service.store, "a memory that stays")
    await service.clear()
    assert await tables_holding(service.store, "a memory that stays") == []


@asynccontextmanager
async def two_processes(tmp_path: Path, *also: tuple[str, str, str]) -> AsyncIterator[tuple[MemoryService, MemoryService, bytes]]:
    """A holder whose vector index holds ENTITY/KEY (and `also`, written after it) and a forgetter: two services on
    one SQLite file, as two server processes would be. Yields (holder, forgetter, the forgotten vector's bytes)."""
    from amfs_server.session_bench.erase_bench import HashEmbedder

    embedder = HashEmbedder()
    holder = MemoryService(SQLiteStore(tmp_path / "amfs.db"), embedder=embedder)
    forgetter = MemoryService(SQLiteStore(tmp_path / "amfs.db"), embedder=embedder)
    await holder.open()
    await forgetter.open()
    try:
        for entity_path, key, value in [(ENTITY, KEY, "to be forgotten"), ("keep", "this", "a memory that stays"), *also]:
            await holder.write(ACTOR, WriteRequest(entity_path, key, value))
        await holder.retrieve(ACTOR, "anything", limit=2)  # the holder's index now has the vector
        yield holder, forgetter, np.asarray(
            embedder.embed([_text(ENTITY, KEY, "to be forgotten")])[0], dtype=np.float32).tobytes()
    finally:
        await holder.close()
        await forgetter.close()


async def test_a_process_that_still_holds_the_vector_does_not_write_it_back(tmp_path) -> None:
    """Another process (here: a second store on the same file) has the index loaded with the vector;
    after this one forgets, that one writes, and its save on close must not restore the vector."""
    async with two_processes(tmp_path) as (holder, forgetter, vector):
        await forgetter.forget(ENTITY, KEY)
        await holder.write(ACTOR, WriteRequest("keep", "that", "another memory"))
        await holder.retrieve(ACTOR, "anything", limit=2)  # syncs: the holder's index is dirty again
    assert files_holding(tmp_path, vector) == []
    assert any(name.endswith(".usearch") for name in raw_files(tmp_path))


async def test_a_process_that_forgets_something_else_does_not_write_the_vector_back(tmp_path) -> None:
    """The holder's own forget rewrote the file from its index, with the other process's forgotten vector still
    in it (a red-team finding): its forget must drop what others deleted too, as its save does."""
    async with two_processes(tmp_path, ("scratch", "note", "forgotten later, by the holder")) as (
        holder, forgetter, vector,
    ):
        await forgetter.forget(ENTITY, KEY)
        assert files_holding(tmp_path, vector) == []
        await holder.forget("scratch", "note")  # rewrites the file from the holder's index
        assert files_holding(tmp_path, vector) == []
    assert files_holding(tmp_path, vector) == []


def _text(entity_path: str, key: str, value: str) -> str:
    from amfs_server.core.embedding import embedding_text

    return embedding_text(entity_path, key, value)


async def test_forgetting_a_turn_erases_what_it_lent_the_next_turn(tmp_path, monkeypatch) -> None:
    """The turn after a transcript turn keeps a context passage embedded from both turns' text; forgetting the
    first turn erases that embedding too (from every file), while the next turn itself stays."""
    import sqlite3

    data_dir = tmp_path / "data"
    marker = new_marker()
    service = build_service(load_settings({}, data_dir=data_dir))
    await service.open()
    actor = Actor("agent/chat", "s1")
    await service.write(actor, WriteRequest("chat/c1", "t1", f"Ada: I live at 12 {marker} street."))
    await service.write(actor, WriteRequest("chat/c1", "t2", "Ben: Nice, close to the park!"))
    conn = sqlite3.connect(data_dir / "amfs.db")
    blob, size, source = conn.execute(
        "SELECT passage_embeddings, length(embedding), context_key FROM entries WHERE key = 't2'").fetchone()
    conn.close()
    lent = bytes(blob)[-size:]  # the context passage: made from t1's text and t2's
    assert source == "t1" and files_holding(data_dir, lent)  # the control: in the database (or its WAL)
    assert await service.forget("chat/c1", "t1") == 1
    await service.close()
    assert files_holding(data_dir, lent) == [] and files_holding(data_dir, marker.encode()) == []
    exported = await export_text(data_dir, monkeypatch)
    assert marker not in exported and '"context_key": "t1"' not in exported and "Ben: Nice" in exported
