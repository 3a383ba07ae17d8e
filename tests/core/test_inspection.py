"""Side-effect-free reads for people inspecting the store (the memory browser), on every adapter:
`peek`, `entity_counts`, `entries_at` and `retrieve(count_as_read=False)` change no recall count, tier or trace."""

from __future__ import annotations

import asyncio

import pytest

from amfs_server.core.errors import NotFoundError, ValidationError
from amfs_server.core.models import Actor
from amfs_server.core.service import MemoryService, WriteRequest


async def seed(service: MemoryService, actor: Actor) -> None:
    await service.write_many(actor, [
        WriteRequest("a", "k0", "root entry about deploys"),
        WriteRequest("a/b", "k2", "second entry about deploys"),
        WriteRequest("a/b", "k1", "first entry about deploys"),
        WriteRequest("a/b", "k3", "third entry about deploys"),
        WriteRequest("a/b/c", "k4", "deep entry"),
        WriteRequest("ab", "k5", "a sibling whose name starts like a"),
        WriteRequest("a/b", "gone", "expired entry", ttl_seconds=0.001),
    ])
    await asyncio.sleep(0.05)  # "gone" has expired before anything is counted


async def test_entity_counts_count_live_entries_per_exact_path_within_a_prefix(service: MemoryService, actor: Actor) -> None:
    await seed(service, actor)
    assert await service.entity_counts() == {"a": 1, "a/b": 3, "a/b/c": 1, "ab": 1}
    assert await service.entity_counts("a") == {"a": 1, "a/b": 3, "a/b/c": 1}
    assert await service.entity_counts("a/b/c") == {"a/b/c": 1}
    assert await service.entity_counts("zzz") == {}


async def test_entries_at_pages_the_entries_of_exactly_one_path_by_key(service: MemoryService, actor: Actor) -> None:
    await seed(service, actor)
    pages = [[e.key for e in await service.entries_at("a/b", offset, 2)] for offset in (0, 2, 4)]
    assert pages == [["k1", "k2"], ["k3"], []]
    with pytest.raises(ValidationError, match="offset"):
        await service.entries_at("a/b", -1, 2)


async def test_peek_and_an_uncounted_retrieve_leave_recall_counts_and_traces_alone(
    service: MemoryService, actor: Actor
) -> None:
    await seed(service, actor)
    traces = await service.store.trace_events()
    peeked = await service.peek("a/b", "k1")
    assert (peeked.value, peeked.recall_count) == ("first entry about deploys", 0)
    quiet = await service.retrieve(actor, "deploys", explain=True, count_as_read=False)
    assert quiet and all(hit.strategies for hit in quiet)
    assert await service.store.trace_events() == traces
    assert await service.store.session_reads(actor.session_id) == []
    assert (await service.peek("a/b", "k1")).recall_count == 0
    counted = await service.retrieve(actor, "deploys", explain=True)
    assert [(h.entry.entry_key, h.rank) for h in counted] == [(h.entry.entry_key, h.rank) for h in quiet]
    assert (await service.peek("a/b", "k1")).recall_count == 1
    assert len(await service.store.session_reads(actor.session_id)) == len(counted)


async def test_peek_of_a_missing_entry_says_so(service: MemoryService) -> None:
    with pytest.raises(NotFoundError, match="No memory at 'a/nope'"):
        await service.peek("a", "nope")
