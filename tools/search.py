"""Tools that find memories: amfs_retrieve (by meaning), amfs_search (by filters), amfs_list (what exists)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastmcp import Context
from pydantic import Field

from ..core.models import ValueHead
from ..core.service import MAX_QUERY_CHARS, MemoryService
from ._params import EntityFilter, MinConfidence
from ._registry import ToolRegistry, read_only
from ._views import LIST_VALUE_CHARS, LISTING_VALUE_CHARS, EntryList, Listing, MemoryTypeName, RetrieveResult, entry_views

MemoryTypeFilter = Annotated[MemoryTypeName | None, Field(description="Only this memory type.")]
Verbose = Annotated[
    bool,
    Field(description="Full entries (type, tier, provenance, counters, timestamps) instead of key, value, "
          "confidence, version and age."),
]
EventAfter = Annotated[
    str | None,
    Field(max_length=64, description="Only entries whose event time (event_at, else write time) is at or after "
                                     "this ISO 8601 date/datetime, e.g. '2023-05-01'."),
]
EventBefore = Annotated[
    str | None,
    Field(max_length=64, description="Only entries whose event time (event_at, else write time) is at or before "
                                     "this ISO 8601 date/datetime, e.g. '2023-05-31T23:59:59Z'."),
]


def register(tools: ToolRegistry[MemoryService]) -> None:
    service = tools.service

    if tools.has("retrieve"):

        @tools.tool(read_only("Retrieve memories"))
        async def amfs_retrieve(
            query: Annotated[
                str, Field(min_length=1, max_length=MAX_QUERY_CHARS, description="What you need, in words.")
            ],
            ctx: Context,
            entity_path: EntityFilter = None,
            limit: Annotated[int, Field(ge=1, le=100)] = 10,
            min_confidence: MinConfidence = None,
            memory_type: MemoryTypeFilter = None,
            depth: Annotated[int, Field(ge=1, le=3, description="Tiers searched: 1 hot, 2 hot+warm, 3 all.")] = 3,
            explain: Annotated[bool, Field(description="Add each strategy's rank and score per result.")] = False,
            verbose: Verbose = False,
            event_after: EventAfter = None,
            event_before: EventBefore = None,
        ) -> RetrieveResult:
            """Find the memories most relevant to a question (semantic + keyword + recency + confidence),
            best first. Use before starting a task. Results count as reads for amfs_commit_outcome;
            long values are truncated (amfs_read returns them whole)."""
            results = await service.retrieve(
                tools.actor(ctx), query, entity_path=entity_path, limit=limit, min_confidence=min_confidence,
                memory_type=memory_type, depth=depth, explain=explain, event_after=event_after,
                event_before=event_before, whole_values=False,  # the views cut values to LISTING_VALUE_CHARS
            )
            return await asyncio.to_thread(RetrieveResult.of, results, verbose=verbose)

    @tools.tool(read_only("Search memories"))
    async def amfs_search(
        entity_path: EntityFilter = None,
        memory_type: MemoryTypeFilter = None,
        min_confidence: MinConfidence = None,
        agent_id: Annotated[str | None, Field(min_length=1, description="Only entries this agent wrote.")] = None,
        since: Annotated[
            str | None,
            Field(max_length=64, description="Only entries written at or after this ISO 8601 date/datetime, e.g. "
                                             "'2023-05-01' (UTC if no zone)."),
        ] = None,
        sort_by: Literal["confidence", "recency", "recall_count", "priority"] = "confidence",
        limit: Annotated[int, Field(ge=1, le=100)] = 20,
        verbose: Verbose = False,
        event_after: EventAfter = None,
        event_before: EventBefore = None,
    ) -> EntryList:
        """Filter current memories by entity, type, confidence, author or age (no query text), sorted.
        Does not count as reading them. To search by meaning use amfs_retrieve."""
        entries = await service.search(
            entity_path=entity_path, memory_type=memory_type, min_confidence=min_confidence, agent_id=agent_id,
            since=since, sort_by=sort_by, limit=limit, event_after=event_after, event_before=event_before,
            value_head=ValueHead.enough_for(LISTING_VALUE_CHARS),  # a long value is never read whole to be cut
        )
        return EntryList(count=len(entries), entries=await asyncio.to_thread(entry_views, entries, verbose))

    @tools.tool(read_only("List memories"))
    async def amfs_list(
        entity_path: EntityFilter = None,
        limit: Annotated[int, Field(ge=1, le=1000)] = 100,
        verbose: Verbose = False,
    ) -> Listing:
        """List what memories exist (entry keys with a short value preview), ordered by path and key."""
        entries = await service.list(entity_path, limit=limit + 1, value_head=ValueHead.enough_for(LIST_VALUE_CHARS))
        return Listing(
            count=min(len(entries), limit), more=len(entries) > limit,
            entries=await asyncio.to_thread(entry_views, entries[:limit], verbose, LIST_VALUE_CHARS),
        )
