"""The memory engine's behaviour through MemoryService, on every store ([sqlite] and [postgres])."""

from __future__ import annotations

import asyncio
import json
import inspect
from datetime import datetime, timedelta, timezone

import pytest

from amfs_server.core.errors import NotFoundError, ValidationError
from amfs_server.core.models import AMFS_VERSION, Actor, MemoryType, OutcomeType, ProvenanceTier, Tier
from amfs_server.core.service import MemoryService, ServiceConfig, WriteRequest


async def test_every_write_creates_the_next_version_and_keeps_the_old_ones(service: MemoryService, actor: Actor) -> None:
    for number in range(1, 4):
        entry = await service.write(actor, WriteRequest("svc", "pattern", {"n": number}))
        assert entry.version == number
    history = await service.history("svc", "pattern")
    assert [(e.version, e.value) for e in history] == [(1, {"n": 1}), (2, {"n": 2}), (3, {"n": 3})]
    assert (await service.read(actor, "svc", "pattern")).value == {"n": 3}
    assert (await service.read(actor, "svc", "pattern", version=1)).value == {"n": 1}


async def test_entry_carries_every_memory_entry_field(service: MemoryService, actor: Actor) -> None:
    entry = await service.write(
        actor,
        WriteRequest("myapp/auth", "decision-auth-jwt", {"summary": "use JWT"}, confidence=0.9,
                     memory_type="belief", ttl_seconds=3600, importance_score=0.7,
                     importance_dimensions={"behavioral_alignment": 0.8}),
    )
    data = entry.to_dict()
    for name in ("entity_path", "key", "value", "version", "confidence", "provenance", "outcome_count", "recall_count",
                 "ttl_at", "memory_type", "tier", "priority_score", "importance_score", "importance_dimensions",
                 "embedding", "amfs_version"):
        assert name in data
    assert entry.entry_key == "myapp/auth/decision-auth-jwt"
    assert entry.amfs_version == AMFS_VERSION
    assert entry.provenance.agent_id == actor.agent_id and entry.provenance.session_id == actor.session_id
    assert entry.memory_type is MemoryType.BELIEF
    assert entry.importance_dimensions == {"behavioral_alignment": 0.8}
    assert entry.ttl_at is not None and entry.ttl_at > datetime.now(timezone.utc)


async def test_read_bumps_recall_count_without_creating_a_version(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "k", "v"))
    for expected in (1, 2, 3):
        assert (await service.read(actor, "svc", "k")).recall_count == expected
    assert len(await service.history("svc", "k")) == 1


async def test_read_of_a_missing_key_says_how_to_search(service: MemoryService, actor: Actor) -> None:
    with pytest.raises(NotFoundError, match=r"No memory at 'svc/nothing'.*amfs_retrieve"):
        await service.read(actor, "svc", "nothing")


async def test_read_of_a_missing_version_names_the_range(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "k", "v"))
    with pytest.raises(NotFoundError, match=r"no version 5 \(versions are numbered up to 1"):
        await service.read(actor, "svc", "k", version=5)


async def test_expired_entries_are_invisible_and_can_be_purged(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "temp", "v", ttl_seconds=0.05))
    await service.write(actor, WriteRequest("svc", "keep", "v"))
    later = datetime.now(timezone.utc) + timedelta(seconds=1)
    assert await service.store.get_current("svc", "temp", later) is None
    assert [e.key for e in await service.store.find_current(
        __import__("amfs_server.core.models", fromlist=["EntryFilter"]).EntryFilter(), later, "recency", None)] == ["keep"]
    assert await service.store.purge_expired(later) == 1
    assert [e.key for e in await service.list()] == ["keep"]


async def clocked_service(store) -> tuple[MemoryService, list[datetime]]:
    """An opened service whose clock is `now[0]` (move it to let TTLs pass)."""
    now = [datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)]
    service = MemoryService(store, ServiceConfig(), clock=lambda: now[0])
    await service.open()
    return service, now


async def test_what_follows_an_erase_hears_of_every_forget_expiry_and_clear_that_erased_something(
    store, actor: Actor
) -> None:
    """The ML layer's export files follow the store through `after_erase` (see tests/ml/test_export_scrub.py)."""
    service, now = await clocked_service(store)
    heard: list[int] = []

    async def listener() -> None:
        heard.append(len(await service.list()))

    service.after_erase(listener)
    await service.write(actor, WriteRequest("svc", "a", "v"))
    await service.write(actor, WriteRequest("svc", "temp", "v", ttl_seconds=60))
    await service.write(actor, WriteRequest("svc", "b", "v"))
    await service.forget("svc", "a")
    assert heard == [2]  # after the forget: what is left
    assert await service.purge_expired() == 0 and heard == [2]  # nothing erased, nothing heard
    now[0] += timedelta(seconds=61)
    assert await service.purge_expired() == 1 and heard == [2, 1]
    await service.clear()
    assert heard == [2, 1, 0]
    with pytest.raises(NotFoundError):
        await service.forget("svc", "a")
    assert heard == [2, 1, 0, 0]  # a forget that finds nothing still lets copies catch up (a retry after a lost reply)
    await service.close()
    await service.open()
    assert heard == [2, 1, 0, 0, 0]  # and an open: what others erased, or a process stopped before following
    service.start_expiry_sweeps(interval_s=0.01)  # and each sweep, also one that erased nothing
    for _ in range(500):
        if len(heard) > 5:
            break
        await asyncio.sleep(0.01)
    assert len(heard) > 5
    await service.close()


async def test_an_expired_memory_is_gone_from_history_and_export_and_then_from_the_store(store, actor: Actor) -> None:
    service, now = await clocked_service(store)
    await service.write(actor, WriteRequest("svc", "temp", "SECRET v1", ttl_seconds=60))
    await service.write(actor, WriteRequest("svc", "temp", "SECRET v2", ttl_seconds=60))
    await service.write(actor, WriteRequest("svc", "keep", "v"))
    assert [e.version for e in await service.history("svc", "temp")] == [1, 2]
    now[0] += timedelta(seconds=61)
    # Before any sweep: history and every version read say it is gone.
    with pytest.raises(NotFoundError):
        await service.history("svc", "temp")
    assert await service.entry_versions("svc", "temp") == []
    assert len(await store.history("svc", "temp")) == 2  # still on disk: nothing has erased it yet
    # An export erases it first, so the file never carries it.
    snapshot = await service.export_snapshot()
    assert [e.key for e in snapshot.entries] == ["keep"]
    assert await store.history("svc", "temp") == []


async def test_a_superseded_version_whose_ttl_passed_is_hidden_and_then_erased(store, actor: Actor) -> None:
    service, now = await clocked_service(store)
    # A: a TTL'd version overwritten by a lasting one. B: an expired key (over an untimed version) written again.
    await service.write(actor, WriteRequest("svc", "a", "SECRET-A v1", ttl_seconds=60))
    await service.write(actor, WriteRequest("svc", "a", "lasting v2"))
    await service.write(actor, WriteRequest("svc", "b", "SECRET-B untimed v1"))
    await service.write(actor, WriteRequest("svc", "b", "SECRET-B v2", ttl_seconds=30))
    now[0] += timedelta(seconds=31)
    with pytest.raises(NotFoundError):
        await service.read(actor, "svc", "b")
    await service.write(actor, WriteRequest("svc", "b", "new"))  # the expired key starts anew: no version comes back
    assert [(e.version, e.value) for e in await store.history("svc", "b")] == [(1, "new")]
    now[0] += timedelta(seconds=30)
    assert [e.version for e in await service.history("svc", "a")] == [2]
    for method in (service.read, service.peek_version):
        with pytest.raises(NotFoundError, match="no version 1"):
            await (method(actor, "svc", "a", version=1) if method == service.read else method("svc", "a", 1))
    assert [e.version async for e in service.history_one_by_one("svc", "a")] == [2]
    assert len(await store.history("svc", "a")) == 2  # hidden, not yet erased
    assert await store.purge_expired(now[0]) == 1
    assert [(e.version, e.value) for e in await store.history("svc", "a")] == [(2, "lasting v2")]
    snapshot = await service.export_snapshot()
    assert "SECRET" not in json.dumps([e.value for e in snapshot.entries])


async def test_expiry_sweeps_and_opening_a_store_erase_expired_memories(store, actor: Actor) -> None:
    service, now = await clocked_service(store)
    await service.write(actor, WriteRequest("svc", "a", "v", ttl_seconds=60))
    await service.write(actor, WriteRequest("svc", "b", "v", ttl_seconds=600))
    service.start_expiry_sweeps(interval_s=0.02)
    now[0] += timedelta(seconds=61)
    for _ in range(200):  # the sweep runs in the background
        if not await store.history("svc", "a"):
            break
        await asyncio.sleep(0.01)
    assert await store.history("svc", "a") == [] and len(await store.history("svc", "b")) == 1
    # A service opened after the TTL passed (a server that was stopped meanwhile) erases it before anything reads.
    now[0] += timedelta(seconds=600)
    reopened = MemoryService(store, ServiceConfig(), clock=lambda: now[0])
    await reopened.open()
    assert await store.history("svc", "b") == []
    await service.close()  # stops the sweeps (and closes the store the fixture would close)


async def test_ttl_in_the_past_is_refused(service: MemoryService, actor: Actor) -> None:
    with pytest.raises(ValidationError, match="not in the future"):
        await service.write(actor, WriteRequest("svc", "k", "v", ttl_at=datetime.now(timezone.utc) - timedelta(seconds=1)))


async def test_a_ttl_that_is_no_time_at_all_or_past_a_century_or_not_a_date_is_refused_and_the_key_kept(
    service: MemoryService, actor: Actor
) -> None:
    """ttl_seconds=1e-7 rounded to the write's own instant: the write answered version 2 and the whole key was gone;
    ttl_at in year 9999 passed where ttl_seconds stops at 100 years; a text ttl_at was an AttributeError (red-team)."""
    await service.write(actor, WriteRequest("svc", "k", "kept"))
    for request, said in [
        (WriteRequest("svc", "k", "v", ttl_seconds=1e-7), "below the clock's resolution"),
        (WriteRequest("svc", "k", "v", ttl_at=datetime(9999, 1, 1, tzinfo=timezone.utc)), "more than 100 years"),
        (WriteRequest("svc", "k", "v", ttl_at="2100-01-01T00:00:00Z"), "ttl_at must be a datetime"),  # type: ignore[arg-type]
    ]:
        with pytest.raises(ValidationError, match=said):
            await service.write(actor, request)
    assert [e.value for e in await service.history("svc", "k")] == ["kept"]


async def test_commit_outcome_without_keys_charges_every_entry_read_in_the_session(
    service: MemoryService, actor: Actor
) -> None:
    for key in ("retry-pattern", "timeout-config", "pool-settings", "unread"):
        await service.write(actor, WriteRequest("svc", key, "v", confidence=0.85))
    for key in ("retry-pattern", "timeout-config", "pool-settings"):
        await service.read(actor, "svc", key)
    record = await service.commit_outcome(actor, "DEP-300", OutcomeType.SUCCESS)
    assert sorted(e.key for e in record.effects) == ["pool-settings", "retry-pattern", "timeout-config"]
    for effect in record.effects:
        assert effect.confidence_before == pytest.approx(0.85)
        assert effect.confidence_after == pytest.approx(0.85 * 0.97)
        assert effect.version_read == 1
    assert (await service.store.get_current("svc", "unread", datetime.now(timezone.utc))).confidence == 0.85


async def test_another_sessions_reads_are_not_charged(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "a", "v"))
    other = Actor("agent/other", "other-session")
    await service.read(other, "svc", "a")
    with pytest.raises(ValidationError, match="has read nothing"):
        await service.commit_outcome(actor, "INC-1", "failure")


async def test_outcome_changes_confidence_not_value_and_bumps_outcome_count(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "k", "the value", confidence=0.85))
    record = await service.commit_outcome(actor, "INC-1042", OutcomeType.CRITICAL_FAILURE, ["svc/k"])
    assert record.effects[0].confidence_after == pytest.approx(0.9775)
    entry = await service.store.get_current("svc", "k", datetime.now(timezone.utc))
    assert entry.value == "the value" and entry.version == 1 and entry.outcome_count == 1
    assert entry.confidence == pytest.approx(0.9775)


async def test_the_same_outcome_ref_is_applied_once(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "k", "v", confidence=0.5))
    first = await service.commit_outcome(actor, "INC-7", "failure", ["svc/k"])
    second = await service.commit_outcome(actor, "INC-7", "failure", ["svc/k"])
    assert not first.already_applied and second.already_applied
    assert second.effects == first.effects
    entry = await service.store.get_current("svc", "k", datetime.now(timezone.utc))
    assert entry.confidence == pytest.approx(0.55) and entry.outcome_count == 1


async def test_outcome_records_keep_ref_type_time_actor_and_each_effect(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "a", "v", confidence=1.0))
    await service.write(actor, WriteRequest("svc", "a", "v2", confidence=0.8))
    await service.read(actor, "svc", "a", version=1)
    await service.commit_outcome(actor, "DEP-1", "minor_failure")
    (record,) = await service.outcome_records()
    assert record.outcome_ref == "DEP-1" and record.outcome_type is OutcomeType.MINOR_FAILURE
    assert record.agent_id == actor.agent_id and record.session_id == actor.session_id
    assert record.multiplier == 1.08
    (effect,) = record.effects
    assert (effect.version_read, effect.version_updated) == (1, 2)
    assert (effect.confidence_before, effect.confidence_after) == (pytest.approx(0.8), pytest.approx(0.864))


async def test_outcome_naming_a_missing_entry_changes_nothing(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "a", "v", confidence=0.5))
    with pytest.raises(NotFoundError, match="svc/ghost"):
        await service.commit_outcome(actor, "INC-9", "failure", ["svc/a", "svc/ghost"])
    assert await service.outcome_records() == []
    assert (await service.store.get_current("svc", "a", datetime.now(timezone.utc))).confidence == 0.5


async def test_bad_outcome_input_is_refused(service: MemoryService, actor: Actor) -> None:
    with pytest.raises(ValidationError, match="outcome_type"):
        await service.commit_outcome(actor, "INC-1", "disaster", ["svc/a"])
    with pytest.raises(ValidationError, match="outcome_ref"):
        await service.commit_outcome(actor, "  ", "failure", ["svc/a"])
    for ref in ("\x00", "INC-1\n2026-01-01 forged log line", "INC\x1b[2J", "INC-1042\u200b", "\u200b",
                "\u202dINC-1042", "INC-1042\u2060", "INC-10\u00ad42", "\ufeffINC-1042"):
        with pytest.raises(ValidationError, match="control or invisible formatting character"):
            await service.commit_outcome(actor, ref, "failure", ["svc/a"])
    with pytest.raises(ValidationError, match="entity_path/key"):
        await service.commit_outcome(actor, "INC-1", "failure", ["no-slash"])
    with pytest.raises(ValidationError, match=r"causal_entry_keys item 'svc//e': .*empty segment"):
        await service.commit_outcome(actor, "INC-1", "failure", ["svc//e"])
    with pytest.raises(ValidationError, match=r"item 'svc/d,svc/e' \(several entries are several list items"):
        await service.commit_outcome(actor, "INC-1", "failure", ["svc/d,svc/e"])
    with pytest.raises(ValidationError, match="is empty"):
        await service.commit_outcome(actor, "INC-1", "failure", [])


async def test_an_outcome_ref_typed_with_composed_or_decomposed_accents_is_one_incident(
    service: MemoryService, actor: Actor
) -> None:
    await service.write(actor, WriteRequest("svc", "a", "v", confidence=0.5))
    await service.read(actor, "svc", "a")
    first = await service.commit_outcome(actor, "Caf\u00e9-1", "failure", ["svc/a"])
    again = await service.commit_outcome(actor, "Cafe\u0301-1", "failure", ["svc/a"])
    assert first.outcome_ref == again.outcome_ref == "Caf\u00e9-1"
    assert [r.outcome_ref for r in await service.outcome_records()] == ["Caf\u00e9-1"]
    assert (await service.peek("svc", "a")).confidence == pytest.approx(0.55)


async def test_calibrated_multipliers_are_used_persisted_and_reversible(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "a", "v", confidence=1.0))
    await service.set_calibrated_multipliers({"failure": 1.5})
    record = await service.commit_outcome(actor, "INC-1", "failure", ["svc/a"])
    assert record.effects[0].confidence_after == pytest.approx(1.5)
    reopened = MemoryService(service.store, ServiceConfig())
    await reopened.open()
    assert reopened.multipliers[OutcomeType.FAILURE] == 1.5
    await reopened.set_calibrated_multipliers(None)
    assert reopened.multipliers[OutcomeType.FAILURE] == 1.10


async def test_min_confidence_filters_on_decayed_confidence(store, actor: Actor) -> None:
    decaying = MemoryService(store, ServiceConfig(decay_half_life_days=30.0))
    await decaying.open()
    await decaying.write(actor, WriteRequest("svc", "k", "v", confidence=0.6))
    entry = await decaying.read(actor, "svc", "k", min_confidence=0.5)
    assert entry.value == "v"
    aged = entry.with_changes(provenance=entry.provenance.__class__(
        entry.provenance.agent_id, entry.provenance.session_id, entry.provenance.written_at - timedelta(days=60)))
    assert decaying.effective_confidence(aged, datetime.now(timezone.utc)) < 0.5
    with pytest.raises(NotFoundError, match="below min_confidence"):
        await decaying.read(actor, "svc", "k", min_confidence=0.7)
    assert [e.key for e in await decaying.search(min_confidence=0.5)] == ["k"]
    assert await decaying.search(min_confidence=0.61) == []


async def test_search_filters_and_sorts(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("checkout", "a", "v", confidence=0.3, memory_type="belief"))
    await service.write(actor, WriteRequest("checkout/api", "b", "v", confidence=0.9))
    await service.write(actor, WriteRequest("checkout-service", "c", "v", confidence=0.5))
    await service.write(Actor("agent/other", "s2"), WriteRequest("payments", "d", "v", confidence=0.7))
    assert [e.key for e in await service.search(entity_path="checkout")] == ["b", "a"]
    assert [e.key for e in await service.search(memory_type="belief")] == ["a"]
    assert [e.key for e in await service.search(agent_id="agent/other")] == ["d"]
    assert [e.key for e in await service.search(min_confidence=0.6)] == ["b", "d"]
    assert [e.key for e in await service.search(sort_by="recency", limit=2)] == ["d", "c"]
    with pytest.raises(ValidationError, match="sort_by"):
        await service.search(sort_by="alphabetical")  # type: ignore[arg-type]


async def test_search_and_list_hold_only_the_values_they_return(store, actor: Actor) -> None:
    """Ranking every match (priority, decayed confidence) reads them without values; only the kept ones come
    back whole; a listing reads at most its limit. A small request must not cost memory in proportion to the
    store (a red-team finding: amfs_list(limit=1) read every value)."""
    service = MemoryService(store, ServiceConfig(decay_half_life_days=30))
    await service.open()
    for n in range(12):
        await service.write(actor, WriteRequest(f"svc/{n % 3}", f"k{n:02d}", "x" * 1000 + str(n), confidence=n / 12))
    loaded: list[int] = []
    find_current, entry_values = store.find_current, store.entry_values

    async def counting_find(*args, **kwargs):
        found = await find_current(*args, **kwargs)
        loaded.append(sum(e.value is not None for e in found))
        return found

    async def counting_values(*args, **kwargs):
        values = await entry_values(*args, **kwargs)
        loaded.append(len(values))
        return values

    store.find_current, store.entry_values = counting_find, counting_values
    try:
        for sort_by in ("priority", "confidence"):
            loaded.clear()
            found = await service.search(sort_by=sort_by, limit=2, min_confidence=0.1)
            assert len(found) == 2 and all(e.value.startswith("x" * 1000) for e in found)
            assert sum(loaded) == 2, (sort_by, loaded)
        assert [e.key for e in await service.search(sort_by="confidence", limit=2)] == ["k11", "k10"]
        loaded.clear()
        listed = await service.list(limit=3)
        assert [(e.entity_path, e.key) for e in listed] == [("svc/0", "k00"), ("svc/0", "k03"), ("svc/0", "k06")]
        assert sum(loaded) == 3
    finally:
        del store.find_current, store.entry_values


async def test_history_one_by_one_yields_what_history_returns(service: MemoryService, actor: Actor) -> None:
    for n in range(3):
        await service.write(actor, WriteRequest("svc", "k", {"n": n}))
    assert [e async for e in service.history_one_by_one("svc", "k")] == await service.history("svc", "k")
    with pytest.raises(NotFoundError):
        [e async for e in service.history_one_by_one("svc", "missing")]


async def test_an_import_never_mixes_vectors_of_two_embedders(store, actor: Actor) -> None:
    from amfs_server.core.models import MemoryEntry, Provenance
    from amfs_server.core.ports import StoreSnapshot

    service = MemoryService(store, ServiceConfig())
    await service.open()
    await store.set_meta("embedder", "model-a")
    vector = [1.0] + [0.0] * 383
    entry = MemoryEntry(entity_path="svc", key="imported", value="v", version=1, confidence=1.0,
                        provenance=Provenance("a", "s", datetime(2026, 1, 1, tzinfo=timezone.utc)),
                        embedding=vector, amfs_version=AMFS_VERSION)
    snapshot = StoreSnapshot(entries=[entry], meta={"embedder": "model-b"})
    # An empty store takes the file's record with its vectors ...
    await service.import_snapshot(snapshot)
    assert await store.get_meta("embedder") == "model-b"
    # ... a store that holds entries keeps its own, and refuses vectors made by another.
    await service.write(actor, WriteRequest("svc", "mine", "v"))
    await store.set_meta("embedder", "model-a")
    other = StoreSnapshot(entries=[entry.with_changes(key="second")], meta={"embedder": "model-b"})
    with pytest.raises(ValidationError, match="do not mix"):
        await service.import_snapshot(other)
    assert await store.get_current("svc", "second", datetime.now(timezone.utc)) is None
    assert await store.get_meta("embedder") == "model-a"


async def test_an_import_with_more_to_follow_marks_the_store_until_finished_and_never_exports_the_mark(store) -> None:
    """`memory import` writes the learned records to another database after the memories: the mark, set in the
    memories' transaction, tells a rerun after a kill in between that they are in."""
    from amfs_server.core.models import MemoryEntry, Provenance
    from amfs_server.core.ports import StoreSnapshot

    service = MemoryService(store, ServiceConfig())
    await service.open()
    entry = MemoryEntry(entity_path="svc", key="imported", value="v", version=1, confidence=1.0,
                        provenance=Provenance("a", "s", datetime(2026, 1, 1, tzinfo=timezone.utc)),
                        amfs_version=AMFS_VERSION)
    assert await service.import_pending() is None
    await service.import_snapshot(StoreSnapshot(entries=[entry], meta={"import_pending": "from-the-file"}), pending="t1")
    assert await service.import_pending() == "t1"  # the file's own mark is never taken
    assert "import_pending" not in (await service.export_snapshot()).meta
    await service.import_finished("another import's")
    assert await service.import_pending() == "t1"
    await service.import_finished("t1")
    assert await service.import_pending() is None
    await service.import_snapshot(StoreSnapshot(entries=[entry.with_changes(key="second")]))
    assert await service.import_pending() is None  # nothing to follow: no mark


async def test_invalid_stored_multipliers_do_not_lock_the_store(store) -> None:
    await store.set_meta("outcome_multipliers", {"success": -5})  # written by an older release's import
    service = MemoryService(store, ServiceConfig())
    await service.open()  # opens, serving the default multipliers
    assert service.multipliers == MemoryService(store, ServiceConfig()).multipliers


async def test_reembed_refuses_to_replace_a_store_another_process_wrote_to_meanwhile(store, actor: Actor) -> None:
    """reembed exports, embeds for a while, then replaces the store: a write made in between (a running server)
    was silently undone (a red-team finding); now the replacement is refused and nothing is lost."""
    from amfs_server.core.errors import ConflictError
    from amfs_server.session_bench.erase_bench import HashEmbedder

    service = MemoryService(store, ServiceConfig(), embedder=HashEmbedder())
    await service.open()
    await service.write(actor, WriteRequest("svc", "a", "before the reembed"))
    other = MemoryService(store, ServiceConfig(), embedder=HashEmbedder())  # another server on the same store
    embed = service._entry_vectors

    async def embed_while_another_writes(*args, **kwargs):
        await other.write(Actor("agent/other", "s2"), WriteRequest("svc", "b", "written during the reembed"))
        return await embed(*args, **kwargs)

    service._entry_vectors = embed_while_another_writes  # type: ignore[method-assign]
    with pytest.raises(ConflictError, match="nothing was replaced"):
        await service.reembed()
    now = datetime.now(timezone.utc)
    assert (await store.get_current("svc", "b", now)).value == "written during the reembed"
    assert (await store.get_current("svc", "a", now)).value == "before the reembed"
    service._entry_vectors = embed  # type: ignore[method-assign]
    assert await service.reembed() == 2  # nothing wrote meanwhile this time


async def test_search_does_not_count_as_reading(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "k", "v"))
    await service.search()
    with pytest.raises(ValidationError, match="has read nothing"):
        await service.commit_outcome(actor, "INC-1", "failure")


async def test_a_forget_whose_caller_is_cancelled_still_runs_what_follows_the_erase_and_close_waits_for_it(
    store, actor: Actor
) -> None:
    """A cancelled forget (an SDK call under `asyncio.wait_for`) stopped the export scrub after its delete had
    committed: the forgotten value stayed in the training-data exports (red-team finding, 0.7.15, 6 of 6)."""
    import asyncio

    service, _ = await clocked_service(store)
    await service.write(actor, WriteRequest("svc", "a", "v"))
    following, release, heard = asyncio.Event(), asyncio.Event(), []

    async def slow_scrub() -> None:
        following.set()
        await release.wait()
        heard.append(len(await service.list()))

    service.after_erase(slow_scrub)
    caller = asyncio.ensure_future(service.forget("svc", "a"))
    await following.wait()  # the delete has committed; the scrub is running
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    release.set()
    await service.close()  # waits for it
    assert heard == [0]
    await service.open()
    assert await service.list() == []


async def test_forget_deletes_every_version(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "k", 1))
    await service.write(actor, WriteRequest("svc", "k", 2))
    assert await service.forget("svc", "k") == 2
    with pytest.raises(NotFoundError):
        await service.history("svc", "k")
    with pytest.raises(NotFoundError, match="nothing was forgotten"):
        await service.forget("svc", "k")


async def test_new_entries_are_hot_and_tiers_follow_priority(service: MemoryService, actor: Actor) -> None:
    entry = await service.write(actor, WriteRequest("svc", "k", "v"))
    assert entry.tier is Tier.HOT and entry.priority_score is not None
    old = entry.with_changes(provenance=entry.provenance.__class__("a", "s", entry.provenance.written_at - timedelta(days=90)),
                             confidence=0.1, importance_score=0.0)
    assert service.with_current_tier(old, datetime.now(timezone.utc)).tier is Tier.ARCHIVE


async def test_provenance_tier_is_computed_from_agent_and_outcomes(service: MemoryService) -> None:
    prod = Actor("prod-deployer", "s1")
    entry = await service.write(prod, WriteRequest("svc", "k", "v"))
    assert entry.provenance_tier is ProvenanceTier.PRODUCTION_OBSERVED
    await service.commit_outcome(prod, "DEP-1", "success", ["svc/k"])
    validated = await service.read(prod, "svc", "k")
    assert validated.provenance_tier is ProvenanceTier.PRODUCTION_VALIDATED
    dev = await service.write(Actor("claude-code", "s2"), WriteRequest("svc", "d", "v"))
    assert dev.provenance_tier is ProvenanceTier.DEVELOPMENT
    manual = await service.write(Actor("manual", "s3"), WriteRequest("svc", "m", "v"))
    assert manual.provenance_tier is ProvenanceTier.MANUAL


async def test_reads_and_writes_are_traced_for_the_ml_layer(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "k", "v"))
    await service.read(actor, "svc", "k")
    events = await service.store.trace_events(actor.session_id)
    assert [(e.kind, e.key, e.version) for e in events] == [("write", "k", 1), ("read", "k", 1)]


async def test_auto_linked_outcome_skips_entries_forgotten_since_they_were_read(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "kept", "v"))
    await service.write(actor, WriteRequest("svc", "gone", "v"))
    await service.read(actor, "svc", "kept")
    await service.read(actor, "svc", "gone")
    await service.forget("svc", "gone")
    record = await service.commit_outcome(actor, "DEP-9", "success")
    assert [effect.key for effect in record.effects] == ["kept"]


async def test_a_read_only_actor_reads_and_retrieves_without_leaving_a_trace(service: MemoryService) -> None:
    writer = Actor("agent/writer", "s-write")
    await service.write(writer, WriteRequest("svc", "retry", "retry card charges with exponential backoff"))
    viewer = Actor("agent/dashboard", "s-ro", read_only=True)
    await service.read(viewer, "svc", "retry")
    await service.retrieve(viewer, "how do we retry card charges?", limit=3)
    assert (await service.read(Actor("agent/check", "s-check", read_only=True), "svc", "retry")).recall_count == 0
    assert await service.store.session_reads("s-ro") == []  # nothing for a later outcome to be charged to
    await service.read(Actor("agent/rw", "s-rw"), "svc", "retry")
    assert [t.key for t in await service.store.session_reads("s-rw")] == ["retry"]


class CountingStore:
    """Forwards to a real store and records the name of each store coroutine called (one call = one round trip)."""

    def __init__(self, inner: object) -> None:
        self.inner, self.calls = inner, []

    def __getattr__(self, name: str) -> object:
        attr = getattr(self.inner, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def counted(*args: object, **kwargs: object) -> object:
            self.calls.append(name)
            return await attr(*args, **kwargs)

        return counted


@pytest.mark.parametrize("named", [True, False], ids=["causal-keys", "session-reads"])
async def test_an_outcome_is_one_store_call_whatever_the_number_of_entries(
    service: MemoryService, actor: Actor, named: bool
) -> None:
    # Before this was one call, an outcome over N entries took 2N+3 (9 for these 3).
    keys = ["svc/a", "svc/b", "svc/c"]
    for key in keys:
        await service.write(actor, WriteRequest("svc", key[-1], "v"))
        await service.read(actor, "svc", key[-1])
    counting = CountingStore(service.store)
    service.store = counting  # type: ignore[assignment]
    record = await service.commit_outcome(actor, "INC-1", "failure", keys if named else None)
    assert sorted(e.key for e in record.effects) == ["a", "b", "c"]
    assert counting.calls == ["apply_outcome"]


async def test_an_outcome_naming_an_expired_entry_is_not_found_and_changes_nothing(
    service: MemoryService, actor: Actor
) -> None:
    await service.write(actor, WriteRequest("svc", "live", "v", confidence=0.5))
    await service.write(actor, WriteRequest("svc", "temp", "v", ttl_seconds=0.05))
    await asyncio.sleep(0.1)
    with pytest.raises(NotFoundError, match=r"No memory at 'svc/temp'; no outcome was recorded"):
        await service.commit_outcome(actor, "INC-1", "failure", ["svc/live", "svc/temp"])
    live = await service.store.get_current("svc", "live", datetime.now(timezone.utc))
    assert (live.confidence, live.outcome_count) == (0.5, 0)
    assert await service.outcome_records() == []


async def test_an_outcome_refreshes_the_tier_of_each_entry_it_changes(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "k", "v", confidence=0.9))
    before = await service.store.get_current("svc", "k", datetime.now(timezone.utc))
    await service.commit_outcome(actor, "INC-1", OutcomeType.CRITICAL_FAILURE, ["svc/k"])
    now = datetime.now(timezone.utc)
    after = await service.store.get_current("svc", "k", now)
    assert after.confidence > before.confidence and after.priority_score != before.priority_score
    expected = service.with_current_tier(after, now)  # the stored score is the one at commit time, a moment ago
    assert after.tier == expected.tier and after.priority_score == pytest.approx(expected.priority_score, abs=1e-3)


def test_a_scoped_outcome_ref_reads_back_as_its_caller_gave_it() -> None:
    from amfs_server.core.service import scoped_outcome_ref, unscoped_outcome_ref

    for ref in ("INC-1", "INC#1", "@not-a-scope"):
        assert unscoped_outcome_ref(scoped_outcome_ref("team-a/svc", ref)) == ref
        assert unscoped_outcome_ref(scoped_outcome_ref(None, ref)) == ref


async def test_a_value_holding_a_lone_surrogate_is_a_validation_error_and_nothing_is_written(
    service: MemoryService, actor: Actor
) -> None:
    """"x\\ud800" (a valid JSON escape) reached the store and failed there with a bare UnicodeEncodeError."""
    with pytest.raises(ValidationError, match="lone surrogate"):
        await service.write(actor, WriteRequest("svc", "k", {"note": "x\ud800"}))
    assert await service.list("svc") == []


async def test_a_retrieve_query_holding_a_lone_surrogate_is_a_validation_error(service: MemoryService, actor: Actor) -> None:
    """It reached the embedder's tokenizer and failed there with a bare ValueError (red-team finding, 0.7.15)."""
    await service.write(actor, WriteRequest("svc", "retry", "retry three times"))
    with pytest.raises(ValidationError, match=r"^query holds a lone surrogate .*nothing was done"):
        await service.retrieve(actor, "retry \ud800")
