"""The Python SDK: `AsyncAgentMemory` (async core) and `AgentMemory` (its sync facade).

Both bind one agent and one session to a `MemoryService`; the session's reads feed auto-causal
linking in `commit_outcome`.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Coroutine, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from .core.errors import AmfsError, NotFoundError, ValidationError
from .core.models import Actor, MemoryEntry, MemoryType, OutcomeRecord, OutcomeType, SortBy
from .core.retrieval import RetrievedEntry
from .core.service import MemoryService, WriteRequest

T = TypeVar("T")
CLOSED = "This {name} is closed; create a new one (or keep using it inside its `with` block)."


class OutcomeEntries(list[MemoryEntry]):
    """What `commit_outcome` returns: the updated entries (a plain list to iterate or unpack), plus
    `already_applied`, True when this `outcome_ref` was committed before and nothing changed now
    (the entries are then those the first commit updated), and the `outcome_ref` itself."""

    def __init__(self, entries: list[MemoryEntry], outcome_ref: str, already_applied: bool) -> None:
        super().__init__(entries)
        self.outcome_ref = outcome_ref
        self.already_applied = already_applied


def _write_request(request: WriteRequest | dict[str, Any], position: int) -> WriteRequest:
    if isinstance(request, WriteRequest):
        return request
    if isinstance(request, dict):
        try:
            return WriteRequest(**request)
        except TypeError as error:  # a missing or unknown field
            raise ValidationError(f"write_many request {position}: {error}; fields are those of WriteRequest.") from None
    raise ValidationError(
        f"write_many request {position} is a {type(request).__name__}; pass WriteRequest objects or dicts of their fields."
    )


class AsyncAgentMemory:
    """Memory for one agent and session. Opens its store on first use; close it with `await mem.close()`."""

    def __init__(
        self,
        agent_id: str | None = None,
        session_id: str | None = None,
        decay_half_life_days: float | None = None,
        *,
        data_dir: str | Path | None = None,
        postgres_dsn: str | None = None,
        embedder: str | None = None,
        service: MemoryService | None = None,
    ) -> None:
        from .server.composition import build_service
        from .server.settings import load_settings

        settings = load_settings(
            agent_id=agent_id, decay_half_life_days=decay_half_life_days, data_dir=data_dir,
            postgres_dsn=postgres_dsn, embedder=embedder,
        )
        self.agent_id = settings.agent_id or "sdk"
        self.session_id = session_id or uuid.uuid4().hex
        self.actor = Actor(self.agent_id, self.session_id)
        self.service = service or build_service(settings)
        self._opened = service is not None
        self._open_lock = asyncio.Lock()
        self._closed = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @asynccontextmanager
    async def _using(self) -> AsyncIterator[MemoryService]:
        """The open service for one call, counted so that `close` lets it finish first."""
        if self._closed:
            raise AmfsError(CLOSED.format(name=type(self).__name__))
        self._in_flight += 1
        self._idle.clear()
        try:
            if not self._opened:
                async with self._open_lock:
                    if not self._opened:
                        await self.service.open()
                        self._opened = True
            yield self.service
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def __aenter__(self) -> AsyncAgentMemory:
        async with self._using():
            return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Refuse new calls, let the calls in flight finish, then close the store. Closed for good: a later call
        is refused (it used to reopen the store, which nothing closed again)."""
        self._closed = True
        await self._idle.wait()
        if self._opened:
            self._opened = False
            await self.service.close()

    async def write(
        self,
        entity_path: str,
        key: str,
        value: Any,
        *,
        confidence: float = 1.0,
        memory_type: MemoryType | str = MemoryType.FACT,
        ttl_seconds: float | None = None,
        ttl_at: datetime | None = None,
        importance_score: float | None = None,
        importance_dimensions: dict[str, float] | None = None,
        event_at: datetime | str | None = None,
    ) -> MemoryEntry:
        """`event_at`: when the remembered event happened (ISO 8601 date or datetime); see WriteRequest."""
        request = WriteRequest(
            entity_path, key, value, confidence, memory_type, ttl_seconds, ttl_at, importance_score, importance_dimensions,
            event_at,
        )
        async with self._using() as service:
            return await service.write(self.actor, request)

    async def write_many(self, requests: list[WriteRequest | dict[str, Any]]) -> list[MemoryEntry]:
        """Bulk write in one transaction, embedding in batches. Each request is a `WriteRequest` or a dict of its
        fields ({"entity_path": ..., "key": ..., "value": ...})."""
        async with self._using() as service:
            return await service.write_many(self.actor, [_write_request(r, n) for n, r in enumerate(requests)])

    async def read(
        self, entity_path: str, key: str, *, version: int | None = None, min_confidence: float | None = None
    ) -> MemoryEntry | None:
        """The newest live version (or `version`); None when absent, expired or below min_confidence."""
        try:
            async with self._using() as service:
                return await service.read(self.actor, entity_path, key, version, min_confidence)
        except NotFoundError:
            return None

    async def search(
        self,
        entity_path: str | None = None,
        *,
        memory_type: MemoryType | str | None = None,
        min_confidence: float | None = None,
        agent_id: str | None = None,
        since: datetime | None = None,
        sort_by: SortBy = "confidence",
        limit: int = 20,
        event_after: datetime | str | None = None,
        event_before: datetime | str | None = None,
    ) -> list[MemoryEntry]:
        async with self._using() as service:
            return await service.search(
                entity_path, memory_type, min_confidence, agent_id, since, sort_by, limit, event_after, event_before
            )

    async def list(self, entity_path: str | None = None) -> list[MemoryEntry]:
        async with self._using() as service:
            return await service.list(entity_path)

    async def retrieve(
        self,
        query: str,
        *,
        entity_path: str | None = None,
        limit: int = 10,
        min_confidence: float | None = None,
        memory_type: MemoryType | str | None = None,
        depth: int = 3,
        explain: bool = False,
        event_after: datetime | str | None = None,
        event_before: datetime | str | None = None,
        fusion: str | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> list[RetrievedEntry]:
        """Hybrid search (semantic, keyword, temporal, confidence, learned), fused as configured. `event_after` /
        `event_before` keep entries whose event time (event_at, else the write time) lies in that range. `fusion`
        ("hybrid" or "rrf", the seed's weighted RRF) and `weights` (per strategy, e.g. {"speaker": 0.1}) override
        the configured fusion and weights for this call."""
        async with self._using() as service:
            return await service.retrieve(
                self.actor, query, entity_path, limit, min_confidence, memory_type, depth, explain, weights, fusion,
                event_after=event_after, event_before=event_before,
            )

    async def history(self, entity_path: str, key: str) -> list[MemoryEntry]:
        async with self._using() as service:
            return await service.history(entity_path, key)

    async def commit_outcome(
        self, outcome_ref: str, outcome_type: OutcomeType | str, causal_entry_keys: list[str] | None = None
    ) -> OutcomeEntries:
        """Apply an outcome; returns the updated entries (confidence after) with `already_applied` set
        when the ref was committed before. See `commit_outcome_record` for the confidence before/after."""
        async with self._using() as service:
            record = await service.commit_outcome(self.actor, outcome_ref, outcome_type, causal_entry_keys)
            updated = [
                await service.store.get_version(effect.entity_path, effect.key, effect.version_updated)
                for effect in record.effects
            ]
        return OutcomeEntries([entry for entry in updated if entry is not None], record.outcome_ref, record.already_applied)

    async def commit_outcome_record(
        self, outcome_ref: str, outcome_type: OutcomeType | str, causal_entry_keys: list[str] | None = None
    ) -> OutcomeRecord:
        async with self._using() as service:
            return await service.commit_outcome(self.actor, outcome_ref, outcome_type, causal_entry_keys)

    async def forget(self, entity_path: str, key: str) -> int:
        async with self._using() as service:
            return await service.forget(entity_path, key)


class AgentMemory:
    """The synchronous facade: the same methods as `AsyncAgentMemory`, run on a private event loop thread.

    The private loop lets it work from plain scripts and from inside a running event loop (notebooks) alike.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="amfs-sdk-loop", daemon=True)
        self._thread.start()
        # `close` sets `_closing` under this lock: no call is handed to the loop after it, so none waits on a loop
        # that stopped (a call in flight in another thread at `close` waited forever; red-team finding, 0.7.15).
        self._lock = threading.Lock()
        self._closing = False
        self._async = self._call(self._make(args, kwargs))

    @staticmethod
    async def _make(args: tuple[Any, ...], kwargs: dict[str, Any]) -> AsyncAgentMemory:
        return AsyncAgentMemory(*args, **kwargs)

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._closing:
                coroutine.close()
                raise AmfsError(CLOSED.format(name=type(self).__name__))
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result()

    @property
    def agent_id(self) -> str:
        return self._async.agent_id

    @property
    def session_id(self) -> str:
        return self._async.session_id

    @property
    def service(self) -> MemoryService:
        return self._async.service

    def write(self, entity_path: str, key: str, value: Any, **kwargs: Any) -> MemoryEntry:
        return self._call(self._async.write(entity_path, key, value, **kwargs))

    def write_many(self, requests: list[WriteRequest | dict[str, Any]]) -> list[MemoryEntry]:
        return self._call(self._async.write_many(requests))

    def read(self, entity_path: str, key: str, **kwargs: Any) -> MemoryEntry | None:
        return self._call(self._async.read(entity_path, key, **kwargs))

    def search(self, entity_path: str | None = None, **kwargs: Any) -> list[MemoryEntry]:
        return self._call(self._async.search(entity_path, **kwargs))

    def list(self, entity_path: str | None = None) -> list[MemoryEntry]:
        return self._call(self._async.list(entity_path))

    def retrieve(self, query: str, **kwargs: Any) -> list[RetrievedEntry]:
        return self._call(self._async.retrieve(query, **kwargs))

    def history(self, entity_path: str, key: str) -> list[MemoryEntry]:
        return self._call(self._async.history(entity_path, key))

    def commit_outcome(
        self, outcome_ref: str, outcome_type: OutcomeType | str, causal_entry_keys: list[str] | None = None
    ) -> OutcomeEntries:
        return self._call(self._async.commit_outcome(outcome_ref, outcome_type, causal_entry_keys))

    def commit_outcome_record(
        self, outcome_ref: str, outcome_type: OutcomeType | str, causal_entry_keys: list[str] | None = None
    ) -> OutcomeRecord:
        return self._call(self._async.commit_outcome_record(outcome_ref, outcome_type, causal_entry_keys))

    def forget(self, entity_path: str, key: str) -> int:
        return self._call(self._async.forget(entity_path, key))

    def close(self) -> None:
        """Refuse new calls, let those in flight in other threads finish, close the store and stop the loop."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        asyncio.run_coroutine_threadsafe(self._async.close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> AgentMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
