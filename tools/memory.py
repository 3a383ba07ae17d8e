"""Tools on single memories: amfs_write, amfs_read, amfs_history, amfs_forget."""

from __future__ import annotations

from typing import Annotated, Any

from fastmcp import Context
from pydantic import Field

from ..core.service import MAX_HISTORY_PAGE, MemoryService, WriteRequest
from ._params import Confidence, EntityPath, Key, MinConfidence, TtlSeconds, Version
from ._registry import ToolRegistry, read_only, writes
from ._views import EntryView, ForgetResult, History, MemoryTypeName, WriteResult

EventTime = Annotated[
    str | None,
    Field(
        max_length=64,
        description="When the event happened, ISO 8601: '2023-05-08' (that day, 00:00 UTC) or "
        "'2023-05-08T14:30:00Z'; years 1800-2200. Temporal ranking and event_after/event_before use it.",
    ),
]


def register(tools: ToolRegistry[MemoryService]) -> None:
    service = tools.service

    @tools.tool(writes("Write memory"))
    async def amfs_write(
        entity_path: EntityPath,
        key: Key,
        value: Annotated[Any, Field(description="Any JSON value: text, number, list or object.")],
        ctx: Context,
        confidence: Confidence = 1.0,
        memory_type: Annotated[
            MemoryTypeName, Field(description="fact (verified), belief (inferred) or experience (what happened).")
        ] = "fact",
        ttl_seconds: TtlSeconds = None,
        importance_score: Annotated[float | None, Field(ge=0, le=1, description="0..1; keeps it hot longer.")] = None,
        event_at: EventTime = None,
    ) -> WriteResult:
        """Store a memory for later sessions and other agents. Writing an existing key adds a new
        version (history is kept). For a conversation, write each message as one memory, in the order
        it was said, as "Speaker: text" with event_at its date: a message is also matched together with
        the one written before it. Returns the entry key, version and confidence."""
        entry = await service.write(
            tools.actor(ctx),
            WriteRequest(
                entity_path=entity_path, key=key, value=value, confidence=confidence, memory_type=memory_type,
                ttl_seconds=ttl_seconds, importance_score=importance_score, event_at=event_at,
            ),
        )
        return WriteResult(
            entry_key=entry.entry_key, entity_path=entry.entity_path, key=entry.key, version=entry.version,
            confidence=entry.confidence, memory_type=entry.memory_type.value, event_at=entry.event_at,
        )

    @tools.tool(read_only("Read memory"))
    async def amfs_read(
        entity_path: EntityPath,
        key: Key,
        ctx: Context,
        version: Version = None,
        min_confidence: MinConfidence = None,
    ) -> EntryView:
        """Read one memory by exact entity_path and key, with its whole value. Counts as a read for
        amfs_commit_outcome. Unsure of the key? Use amfs_retrieve or amfs_list."""
        entry = await service.read(tools.actor(ctx), entity_path, key, version=version, min_confidence=min_confidence)
        return EntryView.of(entry, budget=None)

    @tools.tool(read_only("Memory history"))
    async def amfs_history(
        entity_path: EntityPath,
        key: Key,
        limit: Annotated[int, Field(ge=1, le=MAX_HISTORY_PAGE, description="The newest this many versions.")] = 50,
        before_version: Annotated[
            Version, Field(description="Only versions numbered below this one (the next page back).")
        ] = None,
    ) -> History:
        """Versions of one memory, oldest first, with who wrote it and its confidence: the newest `limit`
        (50), and how many older ones remain (pass before_version=<oldest shown> for them). Long values
        are truncated; amfs_read with version= returns one in full."""
        page, older = await service.history_page(entity_path, key, limit, before_version)
        # One whole value at a time, each cut to its preview before the next is read.
        versions = [EntryView.of(entry, pin_version=True) async for entry in page]
        return History(entity_path=entity_path, key=key, versions=versions, older_versions=older)

    @tools.tool(writes("Forget memory", destructive=True, idempotent=True))
    async def amfs_forget(entity_path: EntityPath, key: Key) -> ForgetResult:
        """Permanently delete every version of one memory, with its read traces and outcome effects,
        from the keyword and vector indexes and the store's files. Cannot be undone; prefer writing a
        corrected version unless the memory must not exist (wrong, secret, personal)."""
        removed = await service.forget(entity_path, key)
        return ForgetResult(entry_key=f"{entity_path}/{key}", versions_removed=removed)
