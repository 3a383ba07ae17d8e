"""The `MemoryStore` contract (core/ports.py), proven at the store level on every adapter ([sqlite], [postgres]).

Every test runs on both stores through the shared `store` fixture and expects the same answer from each: a
behaviour that differs between them is a bug in one adapter. Time is a fixed clock (`NOW`), passed explicitly,
so nothing depends on when the suite runs. Behaviour through `MemoryService` is in tests/core/test_service.py;
what only PostgreSQL has (migrations, index options, statistics, concurrency) is in test_postgres_specific.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
import math
import unicodedata
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest

from amfs_server.core.embedding import embedding_text
from amfs_server.core.errors import ConflictError, NotFoundError, ValidationError
from amfs_server.core.models import (
    AMFS_VERSION,
    Actor,
    EntryFilter,
    MemoryEntry,
    MemoryType,
    NewEntry,
    OutcomeRecord,
    OutcomeType,
    Provenance,
    Tier,
    TraceEvent,
    ValueHead,
)
from amfs_server.core.ports import MemoryStore, OutcomeTarget, StoreSnapshot, TierUpdate
from amfs_server.core.retrieval import KEYWORD_LENGTH_PIVOT, keyword_terms

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)
DIM = 384  # the [postgres] fixture's embedding dimension
ACTOR = Actor("agent/contract", "session-contract")
OTHER = Actor("agent/other", "session-other")


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def draft(
    entity_path: str,
    key: str,
    value: Any = None,
    *,
    written_at: datetime = NOW,
    actor: Actor = ACTOR,
    confidence: float = 1.0,
    memory_type: MemoryType = MemoryType.FACT,
    ttl_at: datetime | None = None,
    importance_score: float | None = None,
    importance_dimensions: dict[str, float] | None = None,
    tier: Tier = Tier.HOT,
    priority_score: float = 0.5,
    embedding: list[float] | None = None,
    search_text: str | None = None,
    passage_embeddings: list[list[float]] | None = None,
    context_key: str | None = None,
) -> NewEntry:
    value = {"note": key} if value is None else value
    return NewEntry(
        entity_path=entity_path, key=key, value=value, value_json=json.dumps(value, ensure_ascii=False),
        confidence=confidence, memory_type=memory_type, agent_id=actor.agent_id, session_id=actor.session_id,
        written_at=written_at, ttl_at=ttl_at, importance_score=importance_score,
        importance_dimensions=importance_dimensions, tier=tier, priority_score=priority_score, embedding=embedding,
        search_text=embedding_text(entity_path, key, value) if search_text is None else search_text,
        passage_embeddings=passage_embeddings, context_key=context_key,
    )


def direction(degrees: float, width: int = DIM) -> list[float]:
    """The unit vector at `degrees` from axis 0 towards axis 1: its cosine with `direction(0)` is cos(degrees)."""
    vector = np.zeros(width, dtype=np.float64)
    vector[0], vector[1] = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    return vector.tolist()


def as_float32(vector: list[float]) -> list[float]:
    """What a store gives back: embeddings are kept as float32 by both."""
    return np.asarray(vector, dtype=np.float32).astype(np.float64).tolist()


def keys(entries: list[MemoryEntry] | list[tuple[MemoryEntry, float]]) -> list[str]:
    return [item[0].key if isinstance(item, tuple) else item.key for item in entries]


async def write(store: MemoryStore, *drafts: NewEntry, actor: Actor = ACTOR) -> list[MemoryEntry]:
    return await store.insert_versions(list(drafts), actor)


def tier_kept(entry: MemoryEntry) -> MemoryEntry:
    return entry


async def outcome(
    store: MemoryStore,
    ref: str,
    outcome_type: OutcomeType,
    multiplier: float,
    actor: Actor,
    now: datetime,
    targets: list[OutcomeTarget] | None,
) -> OutcomeRecord:
    """apply_outcome for tests about confidences and records: every updated version keeps its tier."""
    record, _ = await store.apply_outcome(ref, outcome_type, multiplier, actor, now, targets, tier_kept)
    return record


async def current(store: MemoryStore, entity_path: str, key: str, now: datetime = NOW) -> MemoryEntry:
    entry = await store.get_current(entity_path, key, now)
    assert entry is not None, f"{entity_path}/{key} is not current at {now}"
    return entry


def test_both_adapters_satisfy_the_protocol(store: MemoryStore) -> None:
    assert isinstance(store, MemoryStore)


# -- insert_versions, get_current, get_version, history ----------------------------------------------


async def test_each_write_of_a_key_is_the_next_version_and_history_keeps_them_oldest_first(store: MemoryStore) -> None:
    for number in range(1, 4):
        [entry] = await write(store, draft("svc/a", "k", {"n": number}, written_at=at(number)))
        assert (entry.version, entry.value) == (number, {"n": number})
    [other] = await write(store, draft("svc/a", "other"))
    assert other.version == 1  # versions count per key
    history = await store.history("svc/a", "k")
    assert [(e.version, e.value, e.provenance.written_at) for e in history] == [
        (1, {"n": 1}, at(1)), (2, {"n": 2}, at(2)), (3, {"n": 3}, at(3))
    ]
    assert (await current(store, "svc/a", "k")).version == 3
    for number in (1, 2, 3):
        found = await store.get_version("svc/a", "k", number)
        assert found is not None and found.value == {"n": number}
    assert await store.get_version("svc/a", "k", 4) is None
    assert await store.get_version("svc/a", "missing", 1) is None
    assert await store.history("svc/a", "missing") == []
    assert await store.get_current("svc/a", "missing", NOW) is None
    light = await store.history("svc/a", "k", values=False)  # what a preview listing reads first
    assert [e.with_changes(value=None, embedding=None, passage_embeddings=None, context_key=None) for e in history] == light
    assert all(e.value is None and e.embedding is None for e in light)


async def test_a_batch_returns_its_entries_in_draft_order_with_per_key_versions(store: MemoryStore) -> None:
    stored = await write(
        store, draft("svc/b", "k", {"n": 1}), draft("svc/a", "k", {"n": 2}), draft("svc/b", "k", {"n": 3})
    )
    assert [(e.entity_path, e.version, e.value) for e in stored] == [
        ("svc/b", 1, {"n": 1}), ("svc/a", 1, {"n": 2}), ("svc/b", 2, {"n": 3})
    ]
    assert (await current(store, "svc/b", "k")).value == {"n": 3}
    assert [e.version for e in await store.history("svc/b", "k")] == [1, 2]


async def test_every_field_of_a_draft_is_stored_and_returned(store: MemoryStore) -> None:
    new = draft(
        "myapp/auth", "decision", {"summary": "use JWT"}, written_at=at(1.234567), confidence=0.85,
        memory_type=MemoryType.BELIEF, ttl_at=at(3600.5), importance_score=0.7,
        importance_dimensions={"behavioral_alignment": 0.8, "novelty": 0.25}, tier=Tier.WARM, priority_score=0.375,
        embedding=direction(30),
    )
    [returned] = await write(store, new)
    for entry in (returned, await current(store, "myapp/auth", "decision"), await store.get_version("myapp/auth", "decision", 1)):
        assert entry is not None
        assert entry == MemoryEntry(
            entity_path="myapp/auth", key="decision", value={"summary": "use JWT"}, version=1, confidence=0.85,
            provenance=Provenance(ACTOR.agent_id, ACTOR.session_id, at(1.234567)), outcome_count=0, recall_count=0,
            ttl_at=at(3600.5), memory_type=MemoryType.BELIEF, tier=Tier.WARM, priority_score=0.375,
            importance_score=0.7, importance_dimensions={"behavioral_alignment": 0.8, "novelty": 0.25},
            embedding=as_float32(direction(30)), amfs_version=AMFS_VERSION,
        )
        assert entry.provenance.written_at.utcoffset() == timedelta(0)


async def test_a_batch_is_traced_one_write_per_draft(store: MemoryStore) -> None:
    await write(store, draft("svc/a", "k", written_at=at(1)))
    await write(store, draft("svc/a", "k", written_at=at(2)), draft("svc/b", "k", written_at=at(2)), actor=OTHER)
    assert await store.trace_events() == [
        TraceEvent(ACTOR.session_id, ACTOR.agent_id, "write", "svc/a", "k", 1, at(1)),
        TraceEvent(OTHER.session_id, OTHER.agent_id, "write", "svc/a", "k", 2, at(2)),
        TraceEvent(OTHER.session_id, OTHER.agent_id, "write", "svc/b", "k", 1, at(2)),
    ]


async def test_a_batch_that_fails_part_way_writes_nothing(store: MemoryStore) -> None:
    await write(store, draft("svc/a", "k", {"n": 1}))
    broken = draft("svc/z", "k")
    object.__setattr__(broken, "tier", None)  # fails inside the transaction, after svc/a's version 2 was inserted
    with pytest.raises(Exception):
        await write(store, draft("svc/a", "k", {"n": 2}), broken)
    assert [e.version for e in await store.history("svc/a", "k")] == [1]
    assert (await current(store, "svc/a", "k")).value == {"n": 1}
    assert await store.history("svc/z", "k") == []
    assert len(await store.trace_events()) == 1
    [entry] = await write(store, draft("svc/a", "k", {"n": 2}))  # the store is still usable
    assert entry.version == 2


async def test_an_empty_batch_writes_nothing(store: MemoryStore) -> None:
    assert await store.insert_versions([], ACTOR) == []
    assert await store.trace_events() == []


async def test_expired_versions_are_invisible_to_get_current_at_now(store: MemoryStore) -> None:
    await write(store, draft("svc/a", "temp", ttl_at=at(60)))
    assert (await current(store, "svc/a", "temp", at(59.999999))).key == "temp"
    assert await store.get_current("svc/a", "temp", at(60)) is None  # expiry is exclusive: gone at ttl_at
    assert await store.get_current("svc/a", "temp", at(3600)) is None
    assert await store.get_current("svc/a", "temp", at(-3600)) is not None  # `now` is the caller's, not the wall clock
    # get_version and history show every stored version, expired or not.
    assert await store.get_version("svc/a", "temp", 1) is not None
    assert [e.version for e in await store.history("svc/a", "temp")] == [1]
    # Written again before its TTL passes, the key gets a new version that lives on; written after, it starts
    # anew (the expired key is gone: test_writing_a_key_whose_current_version_expired_starts_it_anew).
    [entry] = await write(store, draft("svc/a", "temp", written_at=at(30)))
    assert entry.version == 2 and (await current(store, "svc/a", "temp", at(3600))).version == 2


async def test_reopening_the_store_keeps_its_data(store: MemoryStore) -> None:
    await store.open()  # open is idempotent
    await write(store, draft("svc/a", "k"))
    await store.close()
    await store.open()
    await store.open()
    assert (await current(store, "svc/a", "k")).version == 1


# -- find_current --------------------------------------------------------------------------------


async def test_find_current_applies_every_filter(store: MemoryStore) -> None:
    await write(
        store,
        draft("svc", "root", written_at=at(0), confidence=1.0),
        draft("svc/a", "child", written_at=at(10), confidence=0.4, memory_type=MemoryType.BELIEF),
        draft("svc-other", "sibling", written_at=at(20), confidence=0.5),
        draft("svcx/a", "lookalike", written_at=at(30), confidence=0.5, actor=OTHER),
        draft("svc/b", "expired", written_at=at(40), ttl_at=at(100)),
        draft("a_b", "underscore", written_at=at(50)),  # `_` and `%` are LIKE wildcards: prefixes must be exact
        draft("axb/c", "wildcard-lookalike", written_at=at(60)),
        draft("a%b", "percent", written_at=at(70)),
    )
    await write(store, draft("svc/a", "superseded", written_at=at(5)))
    await write(store, draft("svc/a", "superseded", written_at=at(80), confidence=0.9))
    now = at(100)
    cases = [
        (EntryFilter(), {"root", "child", "sibling", "lookalike", "underscore", "wildcard-lookalike", "percent", "superseded"}),
        (EntryFilter(entity_path="svc"), {"root", "child", "superseded"}),
        (EntryFilter(entity_path="svc/a"), {"child", "superseded"}),
        (EntryFilter(entity_path="svc/a/child"), set()),  # a path is not a key
        (EntryFilter(entity_path="a_b"), {"underscore"}),
        (EntryFilter(entity_path="a%b"), {"percent"}),
        (EntryFilter(memory_type=MemoryType.BELIEF), {"child"}),
        (EntryFilter(agent_id=OTHER.agent_id), {"lookalike"}),
        (EntryFilter(since=at(60)), {"wildcard-lookalike", "percent", "superseded"}),  # since is inclusive
        (EntryFilter(min_stored_confidence=0.5), {"root", "sibling", "lookalike", "underscore", "wildcard-lookalike",
                                                  "percent", "superseded"}),  # inclusive too
        (EntryFilter(entity_path="svc", min_stored_confidence=0.95), {"root"}),
        (EntryFilter(entity_path="svc", memory_type=MemoryType.BELIEF, since=at(11)), set()),
    ]
    for flt, expected in cases:
        found = await store.find_current(flt, now, "recency", None)
        assert set(keys(found)) == expected, flt
        assert all(e.embedding is None for e in found)
    superseded = [e for e in await store.find_current(EntryFilter(entity_path="svc/a"), now, "recency", None)
                  if e.key == "superseded"]
    assert [e.version for e in superseded] == [2]
    assert "expired" in keys(await store.find_current(EntryFilter(), at(99), "recency", None))


async def test_find_current_sorts_by_each_sort_key_best_first(store: MemoryStore) -> None:
    await write(
        store,
        draft("svc", "a", written_at=at(1), confidence=0.2, priority_score=0.9),
        draft("svc", "b", written_at=at(3), confidence=0.9, priority_score=0.1),
        draft("svc", "c", written_at=at(2), confidence=0.5, priority_score=0.5),
    )
    reads = [TierUpdate("svc", key, 1, Tier.HOT, priority) for key, priority in [("c", 0.5), ("c", 0.5), ("a", 0.9)]]
    await store.record_reads(ACTOR, "read", reads, at(10))
    await write(store, draft("other", "z", written_at=at(4), confidence=0.1, priority_score=0.0))
    expected = {"confidence": ["b", "c", "a", "z"], "recency": ["z", "b", "c", "a"], "recall_count": ["c", "a", "z", "b"],
                "priority": ["a", "c", "b", "z"], "path": ["z", "a", "b", "c"]}
    for sort_by, order in expected.items():
        assert keys(await store.find_current(EntryFilter(), at(10), sort_by, None)) == order, sort_by  # type: ignore[arg-type]
        light = await store.find_current(EntryFilter(), at(10), sort_by, None, values=False)  # type: ignore[arg-type]
        full = await store.find_current(EntryFilter(), at(10), sort_by, None)  # type: ignore[arg-type]
        assert [e.value for e in light] == [None] * 4 and [e.value for e in full] == [{"note": k} for k in order]
        assert [e.with_changes(value=None) for e in full] == light  # everything but the value, as read with it
        assert keys(await store.find_current(EntryFilter(), at(10), sort_by, 2)) == order[:2], sort_by  # type: ignore[arg-type]
        assert await store.find_current(EntryFilter(), at(10), sort_by, 0) == []  # type: ignore[arg-type]
        assert await store.find_current(EntryFilter(), at(10), sort_by, -1) == []  # type: ignore[arg-type]


async def test_listings_read_a_long_value_as_its_head_and_length_and_a_short_one_whole(store: MemoryStore) -> None:
    """A listing asks for heads: a value whose stored JSON is longer than the head comes as its first characters
    and its length, so 100 values of 1 MiB are not parsed to show 200 characters of each (red-team finding)."""
    long_text = "Ünïcode \u0001 \"quoted\" " * 50  # 1,150 characters, escapes and non-ASCII in its JSON
    await write(store, draft("svc", "long", long_text), draft("svc", "short", "fits"),
                draft("svc", "list", list(range(300))))
    stored = {e.key: json.dumps(e.value, ensure_ascii=False) for e in await store.find_current(EntryFilter(), at(1), "path", None)}
    headed = {e.key: e for e in await store.find_current(EntryFilter(), at(1), "path", None, value_head=100)}
    assert headed["short"].value == "fits"
    for key in ("long", "list"):
        head = headed[key].value
        assert isinstance(head, ValueHead) and head.json_head == stored[key][:100]
        assert head.json_chars == len(stored[key])
    text = headed["long"].value.text_head()  # the string's own characters, whatever the head cut
    assert long_text.startswith(text) and len(text) >= (100 - 16) // 6
    assert [e.with_changes(value=None) for e in headed.values()] == [
        e.with_changes(value=None) for e in await store.find_current(EntryFilter(), at(1), "path", None)]
    page = {e.key: e.value for e in await store.entries_at("svc", at(1), 0, 10, value_head=100)}
    assert page == {key: e.value for key, e in headed.items()}
    values = await store.entry_values(list(headed.values()), value_head=100)
    assert values == {("svc", key, 1): e.value for key, e in headed.items()}
    assert await store.entry_values(list(headed.values())) == {("svc", "long", 1): long_text, ("svc", "short", 1): "fits",
                                                                ("svc", "list", 1): list(range(300))}


async def test_find_current_breaks_ties_newest_write_first_the_same_way_on_every_store(store: MemoryStore) -> None:
    """A batch (write_many) stamps one `written_at` on all its drafts, so every entry below ties on every sort key.

    Ties go to the later write; within one batch, rows are stored in (entity_path, key) order, so the batch's
    last key in that order counts as its newest write."""
    await write(store, draft("svc", "x", written_at=NOW), draft("svc", "m", written_at=NOW), draft("svc", "b", written_at=NOW))
    await write(store, draft("svc", "c", written_at=NOW), draft("svc", "a", written_at=NOW))
    await write(store, draft("other", "z", written_at=NOW))
    order = ["z", "c", "a", "x", "m", "b"]
    for sort_by in ("confidence", "recency", "recall_count", "priority"):
        assert keys(await store.find_current(EntryFilter(), NOW, sort_by, None)) == order, sort_by  # type: ignore[arg-type]
        assert keys(await store.find_current(EntryFilter(), NOW, sort_by, 4)) == order[:4], sort_by  # type: ignore[arg-type]
    # A tie on the sort key alone goes to the newer written_at.
    await write(store, draft("svc", "late", written_at=at(-1), confidence=1.0))
    assert keys(await store.find_current(EntryFilter(entity_path="svc"), NOW, "confidence", 2)) == ["c", "a"]
    assert [t.key for t in await store.trace_events()][:3] == ["b", "m", "x"]  # the batch, traced in stored order


async def test_priority_sort_puts_entries_without_a_priority_last(store: MemoryStore) -> None:
    snapshot = StoreSnapshot(entries=[
        _entry("svc", "none", priority_score=None, written_at=at(3)),
        _entry("svc", "low", priority_score=0.1, written_at=at(1)),
        _entry("svc", "high", priority_score=0.8, written_at=at(2)),
    ])
    await store.import_snapshot(snapshot)
    assert keys(await store.find_current(EntryFilter(), NOW, "priority", None)) == ["high", "low", "none"]


# -- record_reads, session_reads, trace_events --------------------------------------


async def test_record_reads_bumps_each_read_version_once_per_read_and_keeps_the_last_tier(store: MemoryStore) -> None:
    await write(store, draft("svc/a", "k"), draft("svc/b", "k"))
    await write(store, draft("svc/a", "k", written_at=at(1)))  # version 2
    reads = [
        TierUpdate("svc/a", "k", 2, Tier.WARM, 0.4),
        TierUpdate("svc/b", "k", 1, Tier.HOT, 0.9),
        TierUpdate("svc/a", "k", 2, Tier.ARCHIVE, 0.05, {"query": "retry?", "rank": 1}),  # duplicates count
        TierUpdate("svc/a", "k", 1, Tier.WARM, 0.3),  # an old version is bumped, not the current one
    ]
    await store.record_reads(ACTOR, "retrieve", reads, at(5))
    a2, b1, a1 = await current(store, "svc/a", "k"), await current(store, "svc/b", "k"), await store.get_version("svc/a", "k", 1)
    assert a1 is not None
    assert (a2.recall_count, a2.tier, a2.priority_score) == (2, Tier.ARCHIVE, 0.05)
    assert (b1.recall_count, b1.tier, b1.priority_score) == (1, Tier.HOT, 0.9)
    assert (a1.recall_count, a1.tier, a1.priority_score) == (1, Tier.WARM, 0.3)
    assert a2.version == 2 and len(await store.history("svc/a", "k")) == 2  # reads create no version
    traces = [t for t in await store.trace_events(ACTOR.session_id) if t.kind != "write"]
    assert traces == [
        TraceEvent(ACTOR.session_id, ACTOR.agent_id, "retrieve", r.entity_path, r.key, r.version, at(5), r.detail)
        for r in reads
    ]
    await store.record_reads(ACTOR, "read", [], at(6))  # nothing read: no trace
    assert len(await store.trace_events(ACTOR.session_id)) == len(traces) + 3


async def test_a_read_of_a_version_forgotten_since_leaves_no_trace_and_counts_for_no_other_memory(
    store: MemoryStore,
) -> None:
    """A read records its trace after it fetched the entry; a forget in another process between the two left a
    trace naming the erased key (with the query), and once the key was written again at version 1 the reader's
    outcome was charged to the new memory (red-team repro, both stores). A version is the same one only if it was
    written at the same time."""
    await write(store, draft("svc/a", "k", written_at=at(1)), draft("svc/b", "k", written_at=at(1)))
    assert await store.forget("svc/a", "k") == 1  # after the reader fetched v1, before it recorded the read
    await write(store, draft("svc/a", "k", written_at=at(2)))  # a new memory, at version 1 again
    await store.record_reads(ACTOR, "retrieve", [
        TierUpdate("svc/a", "k", 1, Tier.HOT, 0.5, {"query": "secret launch code"}, written_at=at(1)),
        TierUpdate("svc/b", "k", 1, Tier.HOT, 0.5, None, written_at=at(1)),
    ], at(3))
    assert (await current(store, "svc/a", "k")).recall_count == 0
    assert (await current(store, "svc/b", "k")).recall_count == 1
    reads = [t for t in await store.trace_events(ACTOR.session_id) if t.kind != "write"]
    assert [(t.entity_path, t.key) for t in reads] == [("svc/b", "k")]
    assert await store.session_reads(ACTOR.session_id) == [OutcomeTarget("svc/b", "k", 1)]


async def test_trace_detail_round_trips_with_its_key_order(store: MemoryStore) -> None:
    await write(store, draft("svc/a", "k"))
    detail = {"query": "why retries? ünï", "rank": 1, "ranks": {"semantic": 2, "keyword": 1}, "score": 0.125}
    await store.record_reads(ACTOR, "retrieve", [TierUpdate("svc/a", "k", 1, Tier.HOT, 0.7, detail)], at(1))
    traces = await store.trace_events(ACTOR.session_id)
    assert [(t.kind, t.detail) for t in traces] == [("write", None), ("retrieve", detail)]
    assert list(traces[1].detail["ranks"]) == ["semantic", "keyword"]  # type: ignore[index]


async def test_trace_events_are_in_event_order_and_filter_by_session(store: MemoryStore) -> None:
    await write(store, draft("svc/a", "k", written_at=at(1)))
    await store.record_reads(OTHER, "read", [TierUpdate("svc/a", "k", 1, Tier.HOT, 0.5)], at(2))
    await store.record_reads(ACTOR, "read", [TierUpdate("svc/a", "k", 1, Tier.HOT, 0.5)], at(0))  # an earlier `now`
    assert [(t.session_id, t.kind, t.at) for t in await store.trace_events()] == [
        (ACTOR.session_id, "write", at(1)), (OTHER.session_id, "read", at(2)), (ACTOR.session_id, "read", at(0))
    ]
    assert [t.kind for t in await store.trace_events(OTHER.session_id)] == ["read"]
    assert await store.trace_events("no-such-session") == []


async def test_session_reads_lists_each_entry_read_once_with_the_newest_version_read(store: MemoryStore) -> None:
    await write(store, draft("svc/a", "k"), draft("svc/b", "k"), draft("svc/c", "k"))
    await write(store, draft("svc/a", "k", written_at=at(1)))
    read = [TierUpdate("svc/b", "k", 1, Tier.HOT, 0.5), TierUpdate("svc/a", "k", 1, Tier.HOT, 0.5)]
    await store.record_reads(ACTOR, "read", read, at(2))
    await store.record_reads(ACTOR, "retrieve", [TierUpdate("svc/a", "k", 2, Tier.HOT, 0.5)], at(3))
    await store.record_reads(ACTOR, "read", [TierUpdate("svc/a", "k", 1, Tier.HOT, 0.5)], at(4))
    await store.record_reads(OTHER, "read", [TierUpdate("svc/c", "k", 1, Tier.HOT, 0.5)], at(5))
    assert await store.session_reads(ACTOR.session_id) == [
        OutcomeTarget("svc/b", "k", 1), OutcomeTarget("svc/a", "k", 2)  # first read first; writes do not count
    ]
    assert await store.session_reads(OTHER.session_id) == [OutcomeTarget("svc/c", "k", 1)]
    assert await store.session_reads("no-such-session") == []


# -- apply_outcome, outcome_records ---------------------------------------------------------------


async def test_an_outcome_multiplies_the_current_version_of_each_target(store: MemoryStore) -> None:
    await write(store, draft("svc/a", "k", confidence=0.8), draft("svc/b", "k", confidence=0.5))
    await write(store, draft("svc/a", "k", confidence=0.6, written_at=at(1)))
    targets = [OutcomeTarget("svc/b", "k", None), OutcomeTarget("svc/a", "k", 1)]  # session read version 1 of svc/a
    record = await outcome(store, "INC-1", OutcomeType.FAILURE, 1.1, ACTOR, at(10), targets)
    assert (record.outcome_ref, record.outcome_type, record.multiplier, record.committed_at) == (
        "INC-1", OutcomeType.FAILURE, 1.1, at(10)
    )
    assert (record.agent_id, record.session_id, record.already_applied) == (ACTOR.agent_id, ACTOR.session_id, False)
    assert [(e.entity_path, e.key, e.version_read, e.version_updated) for e in record.effects] == [
        ("svc/b", "k", None, 1), ("svc/a", "k", 1, 2)  # in target order; the current version is the one changed
    ]
    assert [(e.confidence_before, e.confidence_after) for e in record.effects] == [
        (0.5, pytest.approx(0.55)), (0.6, pytest.approx(0.66))
    ]
    a, b = await current(store, "svc/a", "k"), await current(store, "svc/b", "k")
    assert (a.confidence, a.outcome_count, a.version, a.value) == (pytest.approx(0.66), 1, 2, {"note": "k"})
    assert (b.confidence, b.outcome_count) == (pytest.approx(0.55), 1)
    old = await store.get_version("svc/a", "k", 1)
    assert old is not None and (old.confidence, old.outcome_count) == (0.8, 0)
    assert await store.outcome_records() == [record]


async def test_an_outcome_ref_applies_once_and_a_repeat_returns_the_stored_record(store: MemoryStore) -> None:
    await write(store, draft("svc/a", "k", confidence=0.5), draft("svc/b", "k", confidence=0.5))
    first = await outcome(store, "INC-7", OutcomeType.FAILURE, 1.1, ACTOR, at(1), [OutcomeTarget("svc/a", "k", None)])
    again = await outcome(store, 
        "INC-7", OutcomeType.SUCCESS, 0.5, ACTOR, at(2), [OutcomeTarget("svc/a", "k", None), OutcomeTarget("svc/b", "k", None)]
    )
    assert again.already_applied and not first.already_applied
    assert (again.outcome_type, again.multiplier, again.committed_at, again.effects) == (
        OutcomeType.FAILURE, 1.1, at(1), first.effects
    )  # the stored record, whatever the repeat asked for
    assert ((await current(store, "svc/a", "k")).confidence, (await current(store, "svc/a", "k")).outcome_count) == (
        pytest.approx(0.55), 1
    )
    assert (await current(store, "svc/b", "k")).confidence == 0.5
    assert await store.outcome_records() == [first]
    second = await outcome(store, "INC-8", OutcomeType.FAILURE, 1.1, ACTOR, at(3), [OutcomeTarget("svc/a", "k", None)])
    assert second.effects[0].confidence_before == pytest.approx(0.55)  # another ref compounds
    assert (await current(store, "svc/a", "k")).outcome_count == 2
    # A retry is answered by the stored record before anything is checked: from a new session that has read
    # nothing (a reconnect after a lost reply), or naming an entry forgotten since.
    reconnected = Actor("agent/contract", "session-after-reconnect")
    retried = await outcome(store, "INC-8", OutcomeType.FAILURE, 1.1, reconnected, at(4), None)
    assert retried.already_applied and retried.effects == second.effects
    await store.forget("svc/b", "k")
    named = await outcome(store, "INC-7", OutcomeType.FAILURE, 1.1, ACTOR, at(5), [OutcomeTarget("svc/b", "k", None)])
    assert named.already_applied and named.effects == first.effects
    assert (await current(store, "svc/a", "k")).outcome_count == 2


async def test_an_outcome_naming_a_missing_entry_among_several_changes_nothing_and_keeps_the_ref_free(
    store: MemoryStore,
) -> None:
    await write(store, draft("svc/a", "k"), draft("svc/z", "k"))
    # The missing key sits between two live ones: the live one after it must not be touched either.
    targets = [OutcomeTarget("svc/a", "k", 1), OutcomeTarget("svc/a", "missing", None), OutcomeTarget("svc/z", "k", None)]
    before = await store.export_snapshot()
    with pytest.raises(NotFoundError, match=r"No memory at 'svc/a/missing'; no outcome was recorded.*amfs_list"):
        await outcome(store, "ref", OutcomeType.FAILURE, 1.1, ACTOR, NOW, targets)
    assert await store.export_snapshot() == before
    # The ref was not consumed: it can be committed once the targets exist.
    record = await outcome(store, "ref", OutcomeType.FAILURE, 1.1, ACTOR, NOW, targets[:1])
    assert not record.already_applied and len(record.effects) == 1
    await store.forget("svc/a", "k")
    with pytest.raises(NotFoundError, match="svc/a/k"):  # a forgotten entry is missing too
        await outcome(store, "ref-2", OutcomeType.SUCCESS, 0.9, ACTOR, NOW, [OutcomeTarget("svc/a", "k", 1)])


async def test_an_outcome_naming_an_expired_entry_is_refused_like_a_missing_one(store: MemoryStore) -> None:
    await write(store, draft("svc", "live"), draft("svc", "expiring", ttl_at=at(10)))
    targets = [OutcomeTarget("svc", "live", None), OutcomeTarget("svc", "expiring", None)]
    before = await store.export_snapshot()
    with pytest.raises(NotFoundError, match="No memory at 'svc/expiring'"):
        await outcome(store, "ref", OutcomeType.FAILURE, 1.1, ACTOR, at(10), targets)  # expiry at exactly now counts
    assert await store.export_snapshot() == before
    record = await outcome(store, "ref", OutcomeType.FAILURE, 1.1, ACTOR, at(9), targets)  # still live a second earlier
    assert [e.key for e in record.effects] == ["live", "expiring"]


async def test_an_outcome_stores_the_tier_retier_gives_each_updated_version_in_the_same_call(store: MemoryStore) -> None:
    await write(store, draft("svc/a", "k", confidence=0.8, tier=Tier.HOT, priority_score=0.9), draft("svc/b", "k"))
    await write(store, draft("svc/a", "k", confidence=0.6, tier=Tier.HOT, priority_score=0.9, written_at=at(1)))
    seen: list[MemoryEntry] = []

    def retier(entry: MemoryEntry) -> MemoryEntry:
        seen.append(entry)
        return entry.with_changes(tier=Tier.ARCHIVE, priority_score=0.01 * len(seen))

    targets = [OutcomeTarget("svc/a", "k", None), OutcomeTarget("svc/b", "k", None)]
    record, entries = await store.apply_outcome("INC-1", OutcomeType.FAILURE, 1.1, ACTOR, at(5), targets, retier)
    # retier sees each current version as the outcome left it.
    assert [(e.entity_path, e.version, e.confidence, e.outcome_count) for e in seen] == [
        ("svc/a", 2, pytest.approx(0.66), 1), ("svc/b", 1, pytest.approx(1.1), 1)
    ]
    assert [(e.entity_path, e.version, e.tier, e.priority_score) for e in entries] == [
        ("svc/a", 2, Tier.ARCHIVE, 0.01), ("svc/b", 1, Tier.ARCHIVE, 0.02)
    ]
    assert [(e.entity_path, e.version_updated) for e in record.effects] == [("svc/a", 2), ("svc/b", 1)]
    stored = [await current(store, "svc/a", "k"), await current(store, "svc/b", "k")]
    # The updated entries come without values (an outcome never reads them) and are otherwise what is stored.
    assert all(e.value is None for e in entries) and all(e.value is not None for e in stored)
    assert [e.with_changes(embedding=None, value=None) for e in stored] == entries
    old = await store.get_version("svc/a", "k", 1)
    assert old is not None and (old.tier, old.priority_score) == (Tier.HOT, 0.9)  # only the current version
    again, none = await store.apply_outcome("INC-1", OutcomeType.FAILURE, 1.1, ACTOR, at(6), targets, retier)
    assert again.already_applied and none == [] and len(seen) == 2  # a repeat re-tiers nothing


async def test_an_outcome_without_targets_applies_to_what_the_session_read_that_still_lives(store: MemoryStore) -> None:
    await write(store, draft("svc", "kept"), draft("svc", "gone"), draft("svc", "expiring", ttl_at=at(10)))
    await write(store, draft("svc", "kept", written_at=at(1)))
    reads = [TierUpdate("svc", key, 1, Tier.HOT, 0.5) for key in ("gone", "kept", "expiring")]
    await store.record_reads(ACTOR, "read", reads, at(2))
    await store.forget("svc", "gone")
    record = await outcome(store, "INC-1", OutcomeType.SUCCESS, 0.9, ACTOR, at(10), None)
    assert [(e.key, e.version_read, e.version_updated) for e in record.effects] == [("kept", 1, 2)]
    # A named target the session read carries the version read too; one it did not read carries None.
    named = [OutcomeTarget("svc", "kept", None)]
    assert (await outcome(store, "INC-2", OutcomeType.SUCCESS, 0.9, ACTOR, at(10), named)).effects[0].version_read == 1
    assert (await outcome(store, "INC-3", OutcomeType.SUCCESS, 0.9, OTHER, at(10), named)).effects[0].version_read is None
    before = await store.export_snapshot()
    with pytest.raises(ValidationError, match="'session-other' has read nothing that still exists"):
        await outcome(store, "INC-4", OutcomeType.SUCCESS, 0.9, OTHER, at(10), None)
    assert await store.export_snapshot() == before


async def test_outcome_records_come_in_commit_order_and_filter_by_entity_path_prefix(store: MemoryStore) -> None:
    await write(store, draft("svc", "root"), draft("svc/a", "k"), draft("svc-other", "k"), draft("web", "k"))
    one = await outcome(store, "R1", OutcomeType.SUCCESS, 0.9, ACTOR, at(5), [OutcomeTarget("svc/a", "k", None)])
    two = await outcome(store, 
        "R2", OutcomeType.FAILURE, 1.1, ACTOR, at(1), [OutcomeTarget("web", "k", None), OutcomeTarget("svc", "root", None)]
    )
    three = await outcome(store, "R3", OutcomeType.MINOR_FAILURE, 1.08, ACTOR, at(5), [OutcomeTarget("svc-other", "k", None)])
    assert await store.outcome_records() == [two, one, three]  # by committed_at, then commit order
    assert await store.outcome_records("svc") == [two, one]  # a record with any effect in scope comes whole
    assert await store.outcome_records("svc/a") == [one]
    assert await store.outcome_records("svc-other") == [three]
    assert await store.outcome_records("sv") == []
    assert [await store.count_outcomes(p) for p in (None, "svc", "svc/a", "sv")] == [3, 2, 1, 0]


async def test_outcome_records_page_newest_first_and_filter_by_one_entry_in_the_store(store: MemoryStore) -> None:
    await write(store, draft("svc", "k"), draft("svc", "k2"), draft("svc/k", "x"))
    records = [
        await outcome(store, f"R{n}", OutcomeType.SUCCESS, 0.9, ACTOR, at(n),
                      [OutcomeTarget("svc", "k" if n % 2 else "k2", None), OutcomeTarget("svc/k", "x", None)])
        for n in range(1, 8)
    ]
    assert await store.outcome_records(newest_first=True) == records[::-1]
    assert await store.outcome_records(newest_first=True, offset=2, limit=3) == records[::-1][2:5]
    assert await store.outcome_records(offset=5, limit=10) == records[5:]
    assert await store.outcome_records(limit=0) == []
    on_k = [r for r in records if any(e.key == "k" and e.entity_path == "svc" for e in r.effects)]
    assert await store.outcome_records("svc", key="k") == on_k  # each with all its effects
    assert await store.outcome_records("svc", key="k", newest_first=True, limit=2) == on_k[::-1][:2]
    assert await store.count_outcomes("svc", key="k") == len(on_k) == 4
    assert await store.count_outcomes("svc/k", key="x") == 7 and await store.count_outcomes("sv", key="k") == 0


# -- keyword_candidates, common_terms ---------------------------------------------------------------


async def test_keyword_candidates_match_any_term_best_first(store: MemoryStore) -> None:
    await write(
        store,
        draft("svc/payments", "retry", search_text="svc payments retry: retry failed charges with exponential backoff"),
        draft("svc/payments", "timeout", search_text="svc payments timeout: gateway timeout is 30 seconds"),
        draft("svc/auth", "tokens", search_text="svc auth tokens: rotate signing keys monthly"),
    )
    hits = await store.keyword_candidates(["retry backoff", "gateway", "unicorn"], EntryFilter(), NOW, 10)
    assert [(e.entity_path, e.key) for e, _ in hits] == [("svc/payments", "retry"), ("svc/payments", "timeout")]
    assert hits[0][1] > hits[1][1] > 0
    assert all(e.embedding is None for e, _ in hits)
    assert keys(await store.keyword_candidates(["retries"], EntryFilter(), NOW, 10)) == ["retry"]  # stemmed
    assert keys(await store.keyword_candidates(["monthly"], EntryFilter(), NOW, 10)) == ["tokens"]
    assert await store.keyword_candidates(["unicorn"], EntryFilter(), NOW, 10) == []
    assert await store.keyword_candidates([], EntryFilter(), NOW, 10) == []
    assert await store.keyword_candidates(['"quoted"', "&|!():*'"], EntryFilter(), NOW, 10) == []
    assert len(await store.keyword_candidates(["svc"], EntryFilter(), NOW, 2)) == 2
    assert await store.keyword_candidates(["svc"], EntryFilter(), NOW, 0) == []
    assert await store.keyword_candidates(["svc"], EntryFilter(), NOW, -1) == []


async def test_keyword_search_finds_text_stored_with_decomposed_accents(store: MemoryStore) -> None:
    """macOS input often arrives in NFD ("e" + combining acute); the query words come in NFC (`keyword_terms`)."""
    await write(
        store,
        draft("menu", "nfc", search_text="The Zo\u00eb caf\u00e9 serves cr\u00e8me br\u00fbl\u00e9e"),
        draft("menu", "nfd", search_text=unicodedata.normalize("NFD", "The Zo\u00eb caf\u00e9 serves cr\u00e8me br\u00fbl\u00e9e")),
    )
    for query in ("caf\u00e9", "Cafe\u0301", "zo\u00eb"):
        assert sorted(keys(await store.keyword_candidates(keyword_terms(query), EntryFilter(), NOW, 10))) == ["nfc", "nfd"]


@pytest.mark.parametrize(("stored", "query"), [
    ("we deployed build v2.3.1 to staging", "v2.3.1"),
    ("the bug is in src/app/main.py near the top", "main.py"),
    ("write to bob@example.com for access", "bob@example.com"),
    ("docs at https://example.org/guide?lang=fr", "guide lang"),
    ("the ratio was 15.4 percent", "15.4"),
    ("the meeting runs 10-20 minutes", "20"),
    ("मुझे हिन्दी संगीत बहुत पसंद है", "हिन्दी"),  # Indic vowel signs and virama inside the word
    ("كَتَبَ الطالب الدرس", "كَتَبَ"),  # Arabic vowel marks
])
async def test_keyword_search_finds_every_word_of_joined_and_marked_text(store: MemoryStore, stored: str, query: str) -> None:
    """Words joined by dots, slashes, @ or a sign (PostgreSQL's parser took `v2.3.1` or `-20` for one token) and words
    carrying combining marks (a query cut "हिन्दी" at its vowel signs into letters that matched nothing, on both
    stores) are each found by their words, with the whole query's weight."""
    await write(store, draft("c", "it", search_text=stored),
                *[draft("c", f"other{i}", search_text=f"the weather was {word} today")
                  for i, word in enumerate(("lovely", "grey", "cold", "windy"))])
    hits = await store.keyword_candidates(keyword_terms(query), EntryFilter(), NOW, 10)
    assert [(e.key, score) for e, score in hits] == [("it", pytest.approx(1.0))]
    assert keyword_terms("\u0301\u0903 " + query) == keyword_terms(query)  # marks alone make no word


async def test_keyword_candidates_rank_a_rare_word_above_a_common_one(store: MemoryStore) -> None:
    await write(store, *[draft("svc/common", f"k{i}", search_text=f"deploy pipeline step {i}") for i in range(6)])
    await write(store, draft("svc/rare", "k", search_text="kubernetes cluster"))
    hits = await store.keyword_candidates(["pipeline", "kubernetes"], EntryFilter(), NOW, 3)
    assert hits[0][0].entity_path == "svc/rare"
    assert [score for _, score in hits] == sorted((score for _, score in hits), reverse=True)


async def test_keyword_score_is_the_share_of_the_query_word_weight_an_entry_holds(store: MemoryStore) -> None:
    """Scores mean the same for every query: an entry holding every word scores 1, one holding only a common word
    scores far less, and the scale does not move with how many entries match."""
    await write(store, *[draft("svc/noise", f"k{i}", search_text=f"deploy note {i} about the dashboard") for i in range(8)])
    await write(store, draft("svc/all", "k", search_text="flamegraph of the deploy dashboard"))
    hits = dict((e.entity_path + "/" + e.key, score) for e, score in
                await store.keyword_candidates(["flamegraph", "deploy", "dashboard"], EntryFilter(), NOW, 20))
    assert hits["svc/all/k"] == pytest.approx(1.0)
    assert 0 < hits["svc/noise/k0"] < 0.5  # two common words of three: a small share of the weight
    (entry, share), = await store.keyword_candidates(["flamegraph", "unicorn"], EntryFilter(), NOW, 5)
    assert entry.entity_path == "svc/all" and 0 < share < 0.9  # an unmatched rare word still counts in the query's weight


async def test_keyword_scores_shrink_for_a_search_text_of_very_many_words_and_the_order_follows(store: MemoryStore) -> None:
    """Both stores scale a share by `keyword_length_factor` of the text they matched (the stored search text, not the
    value, which a 1 MiB memory would have to be read for): 160 distinct words are twice the pivot, a quarter."""
    stuffed = "flamegraph " + " ".join(f"word{i}" for i in range(2 * KEYWORD_LENGTH_PIVOT - 1))
    await write(store, draft("svc", "stuffed", "short value", search_text=stuffed),
                draft("svc", "plain", search_text="flamegraph of the deploy dashboard", written_at=at(-1)))
    hits = await store.keyword_candidates(["flamegraph"], EntryFilter(), NOW, 10)
    assert keys(hits) == ["plain", "stuffed"]  # the stuffed entry is newer: unscaled it would come first
    assert hits[1][1] == pytest.approx(hits[0][1] * 0.25)
    unvalued = await store.keyword_candidates(["flamegraph"], EntryFilter(), NOW, 10, values=False)
    assert [(e.key, score) for e, score in unvalued] == [(e.key, score) for e, score in hits]


async def test_candidate_searches_read_long_values_as_heads_when_asked(store: MemoryStore) -> None:
    """A retrieval's searches read each value up to a head: a long one comes as a `ValueHead`, a short one whole,
    and everything else about the entries and their scores is the same."""
    long_text = "ledger " * 400
    await write(store, draft("svc", "long", long_text, embedding=direction(0), search_text="ledger long"),
                draft("svc", "short", "ledger short", embedding=direction(10), search_text="ledger short"))
    for search in (lambda **kw: store.keyword_candidates(["ledger"], EntryFilter(), NOW, 10, **kw),
                   lambda **kw: store.semantic_candidates(direction(0), EntryFilter(), NOW, 10, **kw)):
        whole, headed = await search(), await search(value_head=100)
        assert {e.key: e.value for e, _ in whole} == {"long": long_text, "short": "ledger short"}
        values = {e.key: e.value for e, _ in headed}
        assert values["short"] == "ledger short"
        assert isinstance(values["long"], ValueHead) and values["long"].json_chars == len(json.dumps(long_text))
        assert values["long"].json_head == json.dumps(long_text)[:100]
        assert [(e.with_changes(value=None), score) for e, score in headed] == [
            (e.with_changes(value=None), score) for e, score in whole]


async def test_only_current_live_versions_are_keyword_candidates(store: MemoryStore) -> None:
    await write(store, draft("svc/a", "k", search_text="svc a k: exponential backoff"))
    await write(store, draft("svc/a", "k", search_text="svc a k: give up", written_at=at(1)))
    await write(store, draft("svc/b", "temp", search_text="svc b temp: backoff later", ttl_at=at(60)))
    hits = await store.keyword_candidates(["backoff", "give"], EntryFilter(), at(2), 10)
    assert [(e.key, e.version) for e, _ in hits] == [("k", 2), ("temp", 1)]
    assert keys(await store.keyword_candidates(["backoff"], EntryFilter(), at(60), 10)) == []
    await store.forget("svc/a", "k")
    assert await store.keyword_candidates(["give"], EntryFilter(), at(2), 10) == []


async def test_keyword_candidates_break_ties_newest_write_first(store: MemoryStore) -> None:
    text = "identical text about ledgers"
    await write(store, draft("svc", "x", search_text=text), draft("svc", "b", search_text=text))
    await write(store, draft("svc", "m", search_text=text))
    await write(store, draft("svc", "old", search_text=text, written_at=at(-5)))
    hits = await store.keyword_candidates(["ledgers"], EntryFilter(), NOW, 10)
    assert keys(hits) == ["m", "x", "b", "old"]
    assert len({score for _, score in hits}) == 1
    assert keys(await store.keyword_candidates(["ledgers"], EntryFilter(), NOW, 2)) == ["m", "x"]


async def test_common_terms_are_those_matching_more_than_max_matches_current_entries(store: MemoryStore) -> None:
    await write(store, *[draft("svc", f"k{i}", search_text=f"alpha widget number {i}") for i in range(6)])
    await write(store, draft("svc", "beta", search_text="beta widget gamma"))
    assert await store.common_terms(["alpha", "beta", "gamma", "unicorn"], 3) == {"alpha"}
    assert await store.common_terms(["alpha", "widget"], 6) == {"widget"}
    assert await store.common_terms([], 0) == set()


async def test_a_scoped_common_word_is_counted_within_the_scope(store: MemoryStore) -> None:
    """Entries outside a retrieval's scope neither switch its words off nor reveal themselves (red-team repro:
    team-b writing a word 1,100 times dropped team-a's exact keyword match)."""
    await write(store, *[draft("team-b", f"k{i}", search_text=f"alpha widget number {i}") for i in range(6)])
    await write(store, draft("team-a", "own", search_text="alpha beta"))
    assert await store.common_terms(["alpha", "beta"], 3) == {"alpha"}
    assert await store.common_terms(["alpha", "beta"], 3, "team-a") == set()
    assert await store.common_terms(["alpha", "beta"], 3, "team-b") == {"alpha"}
    assert await store.common_terms(["alpha"], 3, "team") == set()  # a path, not a string prefix


async def test_scoped_keyword_scores_do_not_depend_on_entries_outside_the_scope(store: MemoryStore) -> None:
    """Red-team repro: with N the whole store's row count, team-a's score for its own entry moved when team-b wrote
    unrelated memories, and N could be solved from it."""
    await write(store, draft("team-a", "own", search_text="quasar nebulon"), draft("team-a", "other", search_text="x"))
    scoped = EntryFilter(entity_path="team-a")
    before = await store.keyword_candidates(["quasar", "nebulon", "pulsar"], scoped, NOW, 10)
    await write(store, *[draft("team-b", f"k{i}", search_text=f"filler {i}") for i in range(60)])
    await write(store, draft("team-b", "quasar", search_text="quasar pulsar"), draft("team-a-evil", "x", search_text="pulsar"))
    after = await store.keyword_candidates(["quasar", "nebulon", "pulsar"], scoped, NOW, 10)
    assert [(e.key, score) for e, score in after] == [(e.key, score) for e, score in before]
    assert keys(before) == ["own"]
    everywhere = await store.keyword_candidates(["quasar", "nebulon", "pulsar"], EntryFilter(), NOW, 10)
    assert set(keys(everywhere)) == {"own", "quasar", "x"}  # unscoped, the whole store counts


# -- semantic_candidates --------------------------------------------------------------------------


async def test_semantic_candidates_are_nearest_first_by_cosine(store: MemoryStore) -> None:
    angles = {"same": 0, "near": 30, "mid": 60, "right": 90, "opposite": 180}
    await write(store, *[draft("svc", key, embedding=direction(degrees)) for key, degrees in angles.items()])
    await write(store, draft("svc", "no-vector"))
    hits = await store.semantic_candidates(direction(0), EntryFilter(), NOW, 10)
    assert keys(hits) == ["same", "near", "mid", "right", "opposite"]
    for (entry, score), degrees in zip(hits, angles.values()):
        assert score == pytest.approx(math.cos(math.radians(degrees)), abs=1e-5)
        assert entry.embedding is None
    assert keys(await store.semantic_candidates(direction(50), EntryFilter(), NOW, 2)) == ["mid", "near"]
    assert await store.semantic_candidates(direction(0), EntryFilter(), NOW, 0) == []
    assert await store.semantic_candidates(direction(0), EntryFilter(), NOW, -1) == []


@pytest.mark.parametrize("scope", [None, "svc"])  # SQLite scans a small scope's own vectors: both paths
async def test_candidates_without_values_are_the_same_hits_and_entry_values_fills_them_in(
    store: MemoryStore, scope: str | None
) -> None:
    """The widened searches of a filtered retrieve read no values; the few kept get theirs by `entry_values`."""
    await write(store, *[draft("svc", key, value={"text": f"payments retry {key}"}, embedding=direction(degrees))
                         for key, degrees in {"a": 0, "b": 40, "c": 80}.items()])
    await write(store, draft("svc", "a", value={"text": "payments retry a, again"}, embedding=direction(0),
                             written_at=at(1)))
    flt = EntryFilter(entity_path=scope)
    for with_values, without in [
        (await store.semantic_candidates(direction(0), flt, at(2), 10),
         await store.semantic_candidates(direction(0), flt, at(2), 10, values=False)),
        (await store.keyword_candidates(["payments", "retry"], flt, at(2), 10),
         await store.keyword_candidates(["payments", "retry"], flt, at(2), 10, values=False)),
    ]:
        assert [(e.key, e.version, s) for e, s in without] == [(e.key, e.version, s) for e, s in with_values]
        assert {e.value for e, _ in without} == {None}
        assert [e.with_changes(value=None) for e, _ in with_values] == [e for e, _ in without]
    stored = await store.entry_values([e for e, _ in without])
    assert stored == {("svc", e.key, e.version): e.value for e, _ in with_values}
    old = (await store.get_version("svc", "a", 1))
    assert old is not None and await store.entry_values([old]) == {("svc", "a", 1): {"text": "payments retry a"}}
    await store.forget("svc", "b")
    assert ("svc", "b", 1) not in await store.entry_values([e for e, _ in without])  # gone: not listed
    assert await store.entry_values([]) == {}


async def test_semantic_candidates_use_only_current_live_versions(store: MemoryStore) -> None:
    await write(store, draft("svc", "moved", embedding=direction(0)), draft("svc", "temp", embedding=direction(10), ttl_at=at(60)))
    await write(store, draft("svc", "moved", embedding=direction(90), written_at=at(1)))
    await write(store, draft("svc", "gone", embedding=direction(5)))
    await store.forget("svc", "gone")
    hits = await store.semantic_candidates(direction(0), EntryFilter(), at(2), 10)
    assert [(e.key, e.version) for e, _ in hits] == [("temp", 1), ("moved", 2)]
    assert hits[1][1] == pytest.approx(0.0, abs=1e-5)
    assert keys(await store.semantic_candidates(direction(0), EntryFilter(), at(60), 10)) == ["moved"]


async def test_semantic_candidates_break_ties_newest_write_first(store: MemoryStore) -> None:
    await write(store, draft("svc", "x", embedding=direction(20)), draft("svc", "b", embedding=direction(20)))
    await write(store, draft("svc", "m", embedding=direction(20)))
    await write(store, draft("svc", "old", embedding=direction(20), written_at=at(-5)))
    hits = await store.semantic_candidates(direction(20), EntryFilter(), NOW, 10)
    assert keys(hits) == ["m", "x", "b", "old"]


async def test_a_scoped_semantic_search_ranks_the_scope_as_a_scan_of_it_would(store: MemoryStore) -> None:
    """A conversation among many in one store: its nearest entries are the scope's nearest, in cosine order, whether
    the scope is a small share of the store (SQLite scans the scope's own vectors) or most of it (the index's
    search, widened until enough hits pass the filter)."""
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((160, DIM))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    paths = ["chat/small"] * 12 + ["chat/large"] * 148
    await write(store, *[draft(path, f"t{i}", embedding=vectors[i].tolist()) for i, path in enumerate(paths)])
    query = rng.standard_normal(DIM)
    for scope, wanted in [("chat/small", 5), ("chat/large", 40), ("chat", 10)]:
        members = [i for i, path in enumerate(paths) if path == scope or path.startswith(scope + "/")]
        cosines = {f"t{i}": float(vectors[i] @ query / np.linalg.norm(query)) for i in members}
        expected = sorted(cosines, key=lambda key: -cosines[key])[:wanted]
        hits = await store.semantic_candidates(query.tolist(), EntryFilter(entity_path=scope), NOW, wanted)
        assert keys(hits) == expected, scope
        assert [score for _, score in hits] == pytest.approx([cosines[key] for key in expected], abs=1e-5)


async def test_passage_vectors_are_those_of_the_exact_versions_asked_for(store: MemoryStore) -> None:
    two = [direction(0), direction(90)]
    await write(store, draft("svc", "turn", embedding=direction(45), passage_embeddings=two),
                draft("svc", "one", embedding=direction(10)))
    newer = await write(store, draft("svc", "turn", embedding=direction(30), passage_embeddings=[direction(20), direction(40)],
                                     written_at=at(1)))
    hits = await store.semantic_candidates(direction(0), EntryFilter(), at(2), 10)
    found = await store.passage_vectors([entry for entry, _ in hits])
    assert list(found) == ["svc/turn"]  # "one" has none: its single passage is its vector
    assert found["svc/turn"].dtype == np.float32 and found["svc/turn"].shape == (2, DIM)
    assert np.allclose(found["svc/turn"], [direction(20), direction(40)], atol=1e-6)
    older = await store.get_version("svc", "turn", 1)
    assert older is not None and older.passage_embeddings == [as_float32(row) for row in two]
    assert np.allclose((await store.passage_vectors([older]))["svc/turn"], two, atol=1e-6)
    assert (await store.get_current("svc", "turn", at(2))).passage_embeddings == [
        as_float32(row) for row in newer[0].passage_embeddings]
    assert await store.passage_vectors([]) == {}
    await store.forget("svc", "turn")
    assert await store.passage_vectors([older, newer[0]]) == {}  # forgotten: gone with the entry


async def test_passage_vectors_of_another_dimension_are_refused_and_nothing_is_written(store: MemoryStore) -> None:
    with pytest.raises(ValidationError, match="same dimension"):
        await write(store, draft("svc", "ok", embedding=direction(0)),
                    draft("svc", "bad", embedding=direction(0), passage_embeddings=[[1.0, 0.0]]))
    with pytest.raises(ValidationError, match="same dimension"):
        await write(store, draft("svc", "none", passage_embeddings=[direction(0)]))
    assert await store.export_snapshot() == StoreSnapshot()


async def test_a_zero_query_vector_has_no_candidates(store: MemoryStore) -> None:
    await write(store, draft("svc", "k", embedding=direction(0)))
    assert await store.semantic_candidates([0.0] * DIM, EntryFilter(), NOW, 5) == []


async def test_candidate_searches_apply_every_filter(store: MemoryStore) -> None:
    rows = [
        ("svc", "root", MemoryType.FACT, None, 1.0, ACTOR),
        ("svc/a", "child", MemoryType.BELIEF, None, 0.4, ACTOR),
        ("svc-other", "sibling", MemoryType.FACT, None, 1.0, ACTOR),
        ("svcx/a", "lookalike", MemoryType.FACT, None, 1.0, OTHER),
        ("svc/b", "expired", MemoryType.FACT, at(-1), 1.0, ACTOR),
    ]
    await write(store, *[
        draft(path, key, search_text=f"shared words {key}", embedding=direction(0), memory_type=kind, ttl_at=ttl,
              confidence=conf, actor=actor, written_at=at(-10))
        for path, key, kind, ttl, conf, actor in rows
    ])
    await write(store, draft("svc/new", "fresh", search_text="shared words fresh", embedding=direction(0), written_at=at(-2)))
    for flt, expected in [
        (EntryFilter(), {"root", "child", "sibling", "lookalike", "fresh"}),
        (EntryFilter(entity_path="svc"), {"root", "child", "fresh"}),
        (EntryFilter(entity_path="svc/a"), {"child"}),
        (EntryFilter(memory_type=MemoryType.BELIEF), {"child"}),
        (EntryFilter(min_stored_confidence=0.5), {"root", "sibling", "lookalike", "fresh"}),
        (EntryFilter(agent_id=OTHER.agent_id), {"lookalike"}),
        (EntryFilter(since=at(-2)), {"fresh"}),
        (EntryFilter(since=at(5)), set()),
    ]:
        keyword = await store.keyword_candidates(["shared"], flt, NOW, 10)
        semantic = await store.semantic_candidates(direction(0), flt, NOW, 10)
        assert set(keys(keyword)) == expected, flt
        assert set(keys(semantic)) == expected, flt
        assert all(score == pytest.approx(1.0, abs=1e-5) for _, score in semantic)


# -- forget, purge_expired, clear -------------------------------------------------------------------


async def test_writing_a_key_whose_current_version_expired_starts_it_anew(store: MemoryStore) -> None:
    """Red-team finding: the expired key was reported gone, yet writing it again brought its older, untimed
    versions back into history, and no sweep erased them."""
    await write(store, draft("svc", "e", "OLD v1", embedding=direction(0)))
    await write(store, draft("svc", "e", "v2 with a TTL", ttl_at=at(10), written_at=at(1)))
    await write(store, draft("svc", "kept", "v1"))
    [fresh] = await write(store, draft("svc", "e", "new", written_at=at(20)))
    assert fresh.version == 1
    assert [(e.version, e.value) for e in await store.history("svc", "e")] == [(1, "new")]
    assert sorted(keys(await store.find_current(EntryFilter(), at(30), "recency", None))) == ["e", "kept"]
    [next_version] = await write(store, draft("svc", "e", "newer", written_at=at(21)))  # not expired: a new version
    assert next_version.version == 2


async def test_forget_deletes_every_version_of_one_key(store: MemoryStore) -> None:
    await write(store, draft("svc/a", "k", embedding=direction(0)), draft("svc/a", "kept"))
    await write(store, draft("svc/a", "k", written_at=at(1), embedding=direction(0)))
    await outcome(store, "R1", OutcomeType.SUCCESS, 0.9, ACTOR, at(2), [OutcomeTarget("svc/a", "k", None)])
    await outcome(store, "R2", OutcomeType.FAILURE, 1.1, ACTOR, at(2), [OutcomeTarget("svc/a", "kept", None)])
    assert await store.forget("svc/a", "k") == 2
    assert await store.history("svc/a", "k") == [] and await store.get_current("svc/a", "k", at(3)) is None
    assert keys(await store.find_current(EntryFilter(), at(3), "recency", None)) == ["kept"]
    assert await store.forget("svc/a", "k") == 0
    assert await store.forget("svc/a", "never") == 0
    # An outcome whose only effect was on the forgotten key goes with it (no copy of it stays); others stay.
    assert [r.outcome_ref for r in await store.outcome_records()] == ["R2"]
    [again] = await write(store, draft("svc/a", "k", written_at=at(4)))
    assert again.version == 1  # a forgotten key starts over


async def test_purge_expired_deletes_keys_whose_current_version_expired_and_superseded_versions_that_did(
    store: MemoryStore,
) -> None:
    await write(store, draft("svc", "gone", ttl_at=at(100)), draft("svc", "boundary", ttl_at=at(50)), draft("svc", "live"))
    await write(store, draft("svc", "gone", ttl_at=at(10), written_at=at(1)))  # its current version expires first
    await write(store, draft("svc", "renewed", ttl_at=at(5)))
    await write(store, draft("svc", "renewed", written_at=at(2)))  # the old version expired, the current one lives
    await write(store, draft("svc", "later", ttl_at=at(500)))
    await write(store, draft("svc", "later", written_at=at(3)))  # a superseded version whose TTL has not passed
    assert await store.purge_expired(at(49)) == 3  # both versions of gone, renewed's first version
    assert await store.purge_expired(at(50)) == 1  # expiry at exactly `now` counts
    assert await store.purge_expired(at(50)) == 0
    assert sorted(keys(await store.find_current(EntryFilter(), at(1000), "recency", None))) == ["later", "live", "renewed"]
    assert [e.version for e in await store.history("svc", "renewed")] == [2]
    assert [e.version for e in await store.history("svc", "later")] == [1, 2]
    assert await store.purge_expired(at(500)) == 1
    assert [e.version for e in await store.history("svc", "later")] == [2]
    assert await store.history("svc", "gone") == []


async def test_clear_empties_the_store_and_leaves_it_usable(store: MemoryStore) -> None:
    await write(store, draft("svc", "k", embedding=direction(0)))
    await store.record_reads(ACTOR, "read", [TierUpdate("svc", "k", 1, Tier.HOT, 0.5)], NOW)
    await outcome(store, "R1", OutcomeType.SUCCESS, 0.9, ACTOR, NOW, [OutcomeTarget("svc", "k", None)])
    await store.set_meta("m", {"x": 1})
    await store.clear()
    assert await store.export_snapshot() == StoreSnapshot()
    assert await store.semantic_candidates(direction(0), EntryFilter(), NOW, 5) == []
    assert await store.keyword_candidates(["svc"], EntryFilter(), NOW, 5) == []
    [entry] = await write(store, draft("svc", "k", embedding=direction(90)))
    assert entry.version == 1
    assert keys(await store.semantic_candidates(direction(90), EntryFilter(), NOW, 5)) == ["k"]


# -- export_snapshot, import_snapshot, meta ---------------------------------------------------------

# Values that must come back exactly: unicode, nested JSON in its key order, big and negative integers beyond
# 64 bits, floats at the edges of double precision, empty strings, and strings that look binary.
EXACT_VALUES: dict[str, Any] = {
    "unicode": {"text": "ünïcødé — 中文 — עברית — 🧪👩‍💻", "combining": "e\u0301", "astral": "\U0010fffd"},
    "nested": {"z": 1, "a": [1.5, None, True, False, "s", {"y": 2, "b": [[], {}]}], "m": {"": ""}},
    "ints": [12345678901234567890, -(2**63), 2**64 + 1, 0, -1, 10**30],
    "floats": [0.1, 1e300, 5e-324, -2.5e-10, 1.7976931348623157e308, 3.141592653589793, -0.5],
    "empty": "",
    "empty_structures": [[], {}, ""],
    "binaryish": ["\x00nul\x00", "\x01\x02\x1f\x7f", "\u00ff\u00fe", "\\x00\\xff", "AAEC/w==", "\ufeffbom", "\u2028\u2029"],
    "top_level_string": "plain",
}


def _entry(
    entity_path: str, key: str, value: Any = None, *, version: int = 1, priority_score: float | None = 0.5,
    written_at: datetime = NOW, embedding: list[float] | None = None, **changes: Any,
) -> MemoryEntry:
    entry = MemoryEntry(
        entity_path=entity_path, key=key, value={"note": key} if value is None else value, version=version,
        confidence=0.75, provenance=Provenance("agent/importer", "session-import", written_at), outcome_count=0,
        recall_count=0, ttl_at=None, memory_type=MemoryType.FACT, tier=Tier.WARM, priority_score=priority_score,
        importance_score=None, importance_dimensions=None, embedding=embedding, amfs_version="0.2.0",
    )
    return entry.with_changes(**changes) if changes else entry


async def test_values_round_trip_exactly_through_writes(store: MemoryStore) -> None:
    for name, value in EXACT_VALUES.items():
        await write(store, draft("svc/values", name, value))
    for name, value in EXACT_VALUES.items():
        stored = await current(store, "svc/values", name)
        assert stored.value == value and json.dumps(stored.value) == json.dumps(value), name
    nested = (await current(store, "svc/values", "nested")).value
    assert list(nested) == ["z", "a", "m"] and list(nested["a"][5]) == ["y", "b"]


async def test_a_value_holding_nul_is_stored_and_still_found_by_its_words(store: MemoryStore) -> None:
    value = {"raw": "nul\x00widget"}
    await write(store, draft("svc/a", "k", value, search_text="svc a k: nul\x00widget"))
    assert (await current(store, "svc/a", "k")).value == value
    assert keys(await store.keyword_candidates(["widget"], EntryFilter(), NOW, 5)) == ["k"]


async def test_export_then_import_restores_everything_exactly(store: MemoryStore) -> None:
    await write(store, *[
        draft("svc/values", name, value, written_at=at(0.000001 * index), embedding=direction(index * 7))
        for index, (name, value) in enumerate(EXACT_VALUES.items())
    ])
    await write(store, draft("svc/values", "nested", {"second": "version"}, written_at=at(1), confidence=0.3,
                             ttl_at=at(10**6), importance_score=0.2, importance_dimensions={"novelty": 0.5},
                             memory_type=MemoryType.EXPERIENCE, embedding=direction(100),
                             passage_embeddings=[direction(95), direction(105)]))
    await write(store, draft("ünï/çødé", "ключ", "unicode path and key", written_at=at(2)), actor=OTHER)
    detail = {"query": "q", "ranks": {"semantic": 1, "keyword": 2}}
    await store.record_reads(ACTOR, "retrieve", [TierUpdate("svc/values", "nested", 1, Tier.ARCHIVE, 0.01, detail)], at(3))
    await outcome(store, "INC-1", OutcomeType.FAILURE, 1.1, ACTOR, at(4), [OutcomeTarget("svc/values", "nested", 1)])
    await outcome(store, "INC-2", OutcomeType.SUCCESS, 0.97, OTHER, at(4), [OutcomeTarget("ünï/çødé", "ключ", None)])
    await store.set_meta("outcome_multipliers", {"failure": 1.5, "nested": {"b": [1, 2], "a": None}})
    await store.set_meta("ünï", "value")
    snapshot = await store.export_snapshot()
    assert [(e.entity_path, e.key, e.version) for e in snapshot.entries] == sorted(
        (e.entity_path, e.key, e.version) for e in snapshot.entries
    )
    assert len(snapshot.entries) == len(EXACT_VALUES) + 2 and len(snapshot.outcomes) == 2
    assert len(snapshot.traces) == len(EXACT_VALUES) + 3 and list(snapshot.meta) == ["outcome_multipliers", "ünï"]

    await store.clear()
    await store.import_snapshot(snapshot)
    restored = await store.export_snapshot()
    assert restored == snapshot
    [nested] = [e for e in restored.entries if (e.key, e.version) == ("nested", 2)]
    assert nested.passage_embeddings == [as_float32(direction(95)), as_float32(direction(105))]
    for name, value in EXACT_VALUES.items():
        [first] = [e for e in restored.entries if (e.key, e.version) == (name, 1)]
        assert json.dumps(first.value) == json.dumps(value), name
    assert list(restored.meta["outcome_multipliers"]["nested"]) == ["b", "a"]
    # The imported store behaves like the original: current versions searchable, versions continue.
    assert (await current(store, "svc/values", "nested", at(5))).version == 2
    assert "ключ" in keys(await store.keyword_candidates(["unicode"], EntryFilter(), at(5), 5))
    assert keys(await store.semantic_candidates(direction(0), EntryFilter(), at(5), 1)) == ["unicode"]
    [next_version] = await write(store, draft("svc/values", "nested", written_at=at(6)))
    assert next_version.version == 3
    assert [r.outcome_ref for r in await store.outcome_records()] == ["INC-1", "INC-2"]


async def test_import_refuses_a_snapshot_whose_key_exists_and_writes_nothing(store: MemoryStore) -> None:
    await write(store, draft("svc", "existing"))
    before = await store.export_snapshot()
    clashing = StoreSnapshot(
        entries=[_entry("svc", "new"), _entry("svc", "existing", version=7)],
        traces=[TraceEvent("s", "a", "read", "svc", "new", 1, NOW)],
        meta={"m": 1},
    )
    with pytest.raises(ValidationError, match="svc/existing"):
        await store.import_snapshot(clashing)
    assert await store.export_snapshot() == before


async def test_import_refuses_an_outcome_ref_already_committed_and_writes_nothing(store: MemoryStore) -> None:
    await write(store, draft("svc", "existing"))
    committed = await outcome(store, "INC-1", OutcomeType.FAILURE, 1.1, ACTOR, NOW, [OutcomeTarget("svc", "existing", None)])
    before = await store.export_snapshot()
    with pytest.raises(ValidationError, match="INC-1"):
        await store.import_snapshot(StoreSnapshot(entries=[_entry("svc", "new")], outcomes=[committed], meta={"m": 1}))
    assert await store.export_snapshot() == before


async def test_import_names_the_first_clashing_key_in_key_order_on_every_store(store: MemoryStore) -> None:
    await write(store, draft("svc", "b"), draft("svc", "a"))
    with pytest.raises(ValidationError, match="'svc/a'"):
        await store.import_snapshot(StoreSnapshot(entries=[_entry("svc", "b"), _entry("svc", "a"), _entry("svc", "c")]))


async def test_import_refuses_an_outcome_ref_the_snapshot_repeats_and_writes_nothing(store: MemoryStore) -> None:
    await write(store, draft("svc", "existing"))
    committed = await outcome(store, "INC-1", OutcomeType.FAILURE, 1.1, ACTOR, NOW, [OutcomeTarget("svc", "existing", None)])
    snapshot = await store.export_snapshot()
    await store.clear()
    repeated = StoreSnapshot(entries=snapshot.entries, outcomes=[committed, committed], traces=snapshot.traces)
    with pytest.raises(ValidationError, match="INC-1"):
        await store.import_snapshot(repeated)
    assert await store.export_snapshot() == StoreSnapshot()


async def test_a_replacing_import_is_all_or_nothing_and_refuses_a_store_that_changed(store: MemoryStore) -> None:
    """What `reembed` relies on: the store is checked, emptied and refilled in one transaction, so a failure or a
    crash midway leaves the old store, and a write another process made after the snapshot is never lost."""
    await write(store, draft("svc", "a", embedding=direction(1)), draft("svc", "b", embedding=direction(2)))
    committed = await outcome(store, "INC-1", OutcomeType.FAILURE, 1.1, ACTOR, NOW, [OutcomeTarget("svc", "a", None)])
    await store.set_meta("m", 1)
    before = await store.export_snapshot()
    failing = replace(before, outcomes=[committed, committed])  # refused only after the delete ran
    with pytest.raises(ValidationError, match="INC-1"):
        await store.import_snapshot(failing, replacing=before)
    assert await store.export_snapshot() == before
    assert keys(await store.semantic_candidates(direction(2), EntryFilter(), NOW, 1)) == ["b"]
    renamed = replace(before, entries=[e.with_changes(value={"new": e.key}) for e in before.entries], meta={"m": 2})
    await write(store, draft("svc", "c", written_at=at(5)))  # another process writes after the snapshot
    changed = await store.export_snapshot()
    with pytest.raises(ConflictError):
        await store.import_snapshot(renamed, replacing=before)
    assert await store.export_snapshot() == changed
    await store.import_snapshot(renamed, replacing=changed)  # the same keys and refs: no clash with what it replaces
    after = await store.export_snapshot()
    assert [e.value for e in after.entries] == [{"new": "a"}, {"new": "b"}] and after.meta == {"m": 2}
    assert after.outcomes == before.outcomes
    assert keys(await store.semantic_candidates(direction(2), EntryFilter(), NOW, 1)) == ["b"]


WIDE = 768  # chat-mpnet's width (the default embedder since 0.7.0); the [postgres] fixture's column is DIM wide


async def test_an_empty_store_opened_without_an_embedder_takes_the_width_of_the_vectors_it_imports(
    store: MemoryStore, make_store: Callable[..., Any],
) -> None:
    """`memory import` opens the store without an embedder: a 768-wide export (moved from SQLite to PostgreSQL, or a
    backup restored) goes into a new store whatever width that store was made with; writes and searches follow."""
    wide = [as_float32(direction(degrees, WIDE)) for degrees in (0, 30, 20, 40, 90)]
    snapshot = StoreSnapshot(
        entries=[_entry("svc", "a", embedding=wide[0]),
                 _entry("svc", "a", version=2, embedding=wide[1], passage_embeddings=[wide[2], wide[3]]),
                 _entry("svc", "b", embedding=wide[4]), _entry("svc", "no-vector")],
        traces=[TraceEvent("s", "a", "read", "svc", "a", 2, NOW)], meta={"embedder": "model-wide"},
    )
    importing = make_store(None)
    await importing.open()
    try:
        await importing.import_snapshot(snapshot)
        assert await importing.export_snapshot() == snapshot  # every version as it was, vectors and passages too
        assert keys(await importing.semantic_candidates(direction(85, WIDE), EntryFilter(), NOW, 1)) == ["b"]
        assert keys(await importing.semantic_candidates(direction(35, WIDE), EntryFilter(), NOW, 1)) == ["a"]
        await write(importing, draft("svc", "c", embedding=direction(60, WIDE)))
        assert keys(await importing.semantic_candidates(direction(60, WIDE), EntryFilter(), NOW, 1)) == ["c"]
    finally:
        await importing.close()


async def test_an_import_whose_vectors_mix_widths_is_refused_and_writes_nothing(
    store: MemoryStore, make_store: Callable[..., Any],
) -> None:
    mixed = StoreSnapshot(entries=[_entry("svc", "a", embedding=direction(0)), _entry("svc", "b"),
                                   _entry("svc", "c", embedding=direction(0, WIDE))], meta={"m": 1})
    importing = make_store(None)
    await importing.open()
    try:
        for target in (store, importing):  # with an embedder's width, and without one
            with pytest.raises(ValidationError, match=r"\[384, 768\] dimensions.*one width; nothing was imported"):
                await target.import_snapshot(mixed)
    finally:
        await importing.close()
    assert await store.export_snapshot() == StoreSnapshot()
    await write(store, draft("svc", "a", embedding=direction(10)))  # the store's own width, as before
    assert keys(await store.semantic_candidates(direction(10), EntryFilter(), NOW, 1)) == ["a"]


async def test_export_orders_paths_and_keys_by_their_bytes(store: MemoryStore) -> None:
    names = ["b", "B", "_x", "a-b", "a.b", "a", "Z", "é", "a b", "~", "0"]
    await write(store, *[draft("svc/order", name) for name in names], *[draft(name, "k") for name in names])
    snapshot = await store.export_snapshot()
    pairs = [(e.entity_path, e.key) for e in snapshot.entries]
    assert pairs == sorted(pairs, key=lambda pair: (pair[0].encode(), pair[1].encode()))
    assert [key for path, key in pairs if path == "svc/order"] == sorted(names)


async def test_meta_updates_from_two_handles_at_once_lose_nothing_and_land_together(store, make_store) -> None:
    """Two processes saving a model each read the models record, added theirs and wrote it back: one model was
    lost, and a kill between the model and its version mark left the other processes on the old one."""
    other = make_store()
    await other.open()
    try:
        def append(item: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
            def change(held: dict[str, Any]) -> dict[str, Any]:
                return {"models": [*(held["models"] or []), item], "version": (held["version"] or 0) + 1}
            return change

        await asyncio.gather(*[handle.update_meta(["models", "version"], append(f"{name}-{n}"))
                               for n in range(10) for name, handle in (("a", store), ("b", other))])
        models = await store.get_meta("models")
        assert sorted(models) == sorted(f"{name}-{n}" for n in range(10) for name in "ab")
        assert await other.get_meta("version") == 20
        await store.update_meta(["models", "absent"], lambda held: {"models": None, "absent": held["absent"]})
        assert await other.get_meta("models") is None and await other.get_meta("absent") is None
    finally:
        await other.close()


async def test_meta_stores_json_values_until_set_to_none(store: MemoryStore) -> None:
    assert await store.get_meta("absent") is None
    for value in ({"failure": 1.5, "a": [1, None]}, [1, "two"], 3, 0.25, "text ünï", True, 12345678901234567890):
        await store.set_meta("name", value)
        assert await store.get_meta("name") == value
    await store.set_meta("other", {"z": 1, "a": 2})
    assert list(await store.get_meta("other")) == ["z", "a"]
    await store.set_meta("name", None)
    assert await store.get_meta("name") is None
    await store.set_meta("never-set", None)  # deleting an absent name is fine
    assert (await store.export_snapshot()).meta == {"other": {"z": 1, "a": 2}}


async def test_latest_at_is_the_newest_current_live_entries_at_exactly_that_path(store: MemoryStore) -> None:
    await write(store, draft("chat", "t1", written_at=at(1)), draft("chat/sub", "t9", written_at=at(9)))
    await write(store, draft("chat", "t2", written_at=at(2)), draft("chat", "temp", written_at=at(3), ttl_at=at(10)))
    await write(store, draft("chat", "t1", written_at=at(4)))  # a new version: t1 is the newest write now
    assert [(e.key, e.version) for e in await store.latest_at("chat", at(5), 10)] == [("t1", 2), ("temp", 1), ("t2", 1)]
    assert keys(await store.latest_at("chat", at(11), 2)) == ["t1", "t2"]  # expired left out; the sub-path never in
    assert await store.latest_at("nowhere", at(5), 5) == [] and await store.latest_at("chat", at(5), 0) == []


OWN_PASSAGES = [direction(0), direction(20)]


def turns_lent_by_t1() -> list[NewEntry]:
    """chat/t2 (two passages of its own, then t1's context passage) and chat/t3 (one of its own, then t1's)."""
    return [draft("chat", "t2", embedding=direction(10), passage_embeddings=[*OWN_PASSAGES, direction(60)],
                  context_key="t1", written_at=at(1)),
            draft("chat", "t3", embedding=direction(30), passage_embeddings=[direction(30), direction(50)],
                  context_key="t1", written_at=at(1))]


async def test_forgetting_a_key_strips_the_context_passages_made_with_its_text(store: MemoryStore) -> None:
    own = OWN_PASSAGES
    await write(store, draft("chat", "t1", embedding=direction(60)), draft("other", "t1", embedding=direction(60)))
    await write(store, *turns_lent_by_t1(),
                draft("other", "t2", embedding=direction(5), passage_embeddings=[direction(5), direction(60)],
                      context_key="t1", written_at=at(1)))
    assert (await store.get_current("chat", "t2", at(2))).context_key == "t1"

    await store.forget("chat", "t1")
    t2, t3 = await store.get_current("chat", "t2", at(2)), await store.get_current("chat", "t3", at(2))
    assert t2.passage_embeddings == [as_float32(row) for row in own] and t2.context_key is None  # its own rows stay
    assert t3.passage_embeddings is None and t3.context_key is None  # one own row left: none, as for one passage
    other = await store.get_current("other", "t2", at(2))
    assert other.context_key == "t1" and len(other.passage_embeddings) == 2  # another path's t1: untouched


async def test_a_write_whose_context_lender_was_erased_meanwhile_stores_no_passage_from_it(store: MemoryStore) -> None:
    # The service makes a turn's context passage from the turn before it, then writes: a forget of that turn in
    # between (another call or process) finds nothing to strip, so the write itself must drop the passage.
    own = OWN_PASSAGES
    await write(store, draft("chat", "t1", embedding=direction(60)), draft("chat", "t4", embedding=direction(70)))
    await store.forget("chat", "t1")
    t2, t3, t5 = await write(
        store, *turns_lent_by_t1(),
        draft("chat", "t5", embedding=direction(40), passage_embeddings=[direction(40), direction(70)],
              context_key="t4", written_at=at(1)))
    assert t2.passage_embeddings == [as_float32(row) for row in own] and t2.context_key is None  # its own rows stay
    assert t3.passage_embeddings is None and t3.context_key is None  # one own row left: none, as for one passage
    assert t5.context_key == "t4" and len(t5.passage_embeddings) == 2  # a lender still there keeps its passage
    stored = await store.get_current("chat", "t2", at(2))
    assert stored.context_key is None and len(stored.passage_embeddings) == 2
    snapshot = await store.export_snapshot()
    assert all(entry.context_key != "t1" for entry in snapshot.entries)
    # Forgotten and written anew before the write landed: the key is back, but with another text, written after
    # this write began (a passage is made from a version written before its write).
    await store.forget("chat", "t4")
    await write(store, draft("chat", "t4", embedding=direction(80), written_at=at(3)))
    (t6,) = await write(store, draft("chat", "t6", embedding=direction(50), passage_embeddings=[direction(50), direction(70)],
                                     context_key="t4", written_at=at(2)))
    assert t6.context_key is None and t6.passage_embeddings is None
