"""Event time: when the remembered event happened (`event_at`), validated, stored, returned, filtered and ranked."""

from __future__ import annotations

from datetime import date, datetime, timezone

import pytest

from amfs_server.core.embedding import embedding_text
from amfs_server.core.errors import ValidationError
from amfs_server.core.models import Actor
from amfs_server.core.service import MemoryService, ServiceConfig, WriteRequest
from amfs_server.core.validation import validate_event_time
from amfs_server.server.export_format import dump_export, parse_export

UTC = timezone.utc
NO_RELEVANCE = {"semantic": 0.0, "keyword": 0.0, "temporal": 1.0, "confidence": 0.0}


# -- validation ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("2023-05-08", datetime(2023, 5, 8, tzinfo=UTC)),
        ("2023-05-08T14:30:00", datetime(2023, 5, 8, 14, 30, tzinfo=UTC)),
        ("2023-05-08T14:30:00Z", datetime(2023, 5, 8, 14, 30, tzinfo=UTC)),
        ("2023-05-08T14:30:00+02:00", datetime(2023, 5, 8, 12, 30, tzinfo=UTC)),
        (" 1850-01-01 ", datetime(1850, 1, 1, tzinfo=UTC)),
        (date(2024, 2, 29), datetime(2024, 2, 29, tzinfo=UTC)),
        (datetime(2024, 2, 29, 9, tzinfo=UTC), datetime(2024, 2, 29, 9, tzinfo=UTC)),
    ],
)
def test_a_date_means_that_day_at_midnight_utc_and_a_datetime_is_kept_in_utc(given: object, expected: datetime) -> None:
    result = validate_event_time(given)
    assert result == expected and result.tzinfo == UTC


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("yesterday", "ISO 8601 date or datetime"),
        ("08/05/2023", "ISO 8601 date or datetime"),
        ("2023-13-01", "ISO 8601 date or datetime"),
        ("", "ISO 8601 date or datetime"),
        (1683504000, "ISO 8601 date or datetime string"),
        ("1700-01-01", "outside the supported years 1800..2200"),
        ("2201-01-01", "outside the supported years 1800..2200"),
        ("9999-12-31T23:00:00-05:00", "outside the supported years"),
        ("0001-01-01T00:00:00+05:00", "outside the supported years"),
    ],
)
async def test_bad_event_times_are_refused_with_an_example_and_nothing_is_written(
    service: MemoryService, actor: Actor, given: object, message: str
) -> None:
    with pytest.raises(ValidationError, match=message) as raised:
        await service.write(actor, WriteRequest("trip", "flight", "Flew to Lisbon", event_at=given))  # type: ignore[arg-type]
    assert "2023-05-08" in str(raised.value)  # every message shows a valid example
    assert await service.list() == []


async def test_an_inverted_event_range_is_refused(service: MemoryService, actor: Actor) -> None:
    with pytest.raises(ValidationError, match="later than event_before"):
        await service.search(event_after="2024-01-02", event_before="2024-01-01")


# -- storage round trip (both stores) ------------------------------------------------------------------------


async def test_event_at_is_stored_per_version_and_returned_by_read_search_history_and_export(
    service: MemoryService, store, actor: Actor, tmp_path
) -> None:
    first = await service.write(actor, WriteRequest("trip", "flight", "Booked the flight", event_at="2023-05-08"))
    second = await service.write(actor, WriteRequest("trip", "flight", "Flew to Lisbon"))
    assert first.event_at == datetime(2023, 5, 8, tzinfo=UTC)
    assert second.event_at is None  # a new version says nothing about the event unless the writer does
    third = await service.write(actor, WriteRequest("trip", "flight", "Landed", event_at="2023-05-09T18:45:00+01:00"))
    assert third.event_at == datetime(2023, 5, 9, 17, 45, tzinfo=UTC)

    assert (await service.read(actor, "trip", "flight")).event_at == third.event_at
    assert (await service.read(actor, "trip", "flight", version=1)).event_at == first.event_at
    assert [e.event_at for e in await service.history("trip", "flight")] == [first.event_at, None, third.event_at]
    assert [e.event_at for e in await service.search(entity_path="trip")] == [third.event_at]

    exported = dump_export(await service.export_snapshot())
    snapshot = parse_export(exported)
    assert [e.event_at for e in snapshot.entries] == [first.event_at, None, third.event_at]
    await service.clear()
    await service.import_snapshot(snapshot)
    assert [e.event_at for e in await service.history("trip", "flight")] == [first.event_at, None, third.event_at]
    # An export written before event times existed has no event_at field: it still imports, as None.
    old = exported.replace(',\n   "event_at": null', "").replace('"event_at"', '"ignored_field"')
    assert "event_at" not in old
    assert [e.event_at for e in parse_export(old).entries] == [None, None, None]


async def test_event_filters_use_the_event_time_else_the_write_time(service: MemoryService, actor: Actor) -> None:
    await service.write_many(actor, [
        WriteRequest("diary", "april", "Planted tomatoes", event_at="2023-04-20"),
        WriteRequest("diary", "may-8", "Ran the half marathon", event_at="2023-05-08"),
        WriteRequest("diary", "may-31", "Picked the first strawberries", event_at="2023-05-31T23:00:00Z"),
        WriteRequest("diary", "today", "Wrote up the season"),  # no event time: its write time (now) counts
    ])
    in_may = await service.search(entity_path="diary", event_after="2023-05-01", event_before="2023-05-31T23:59:59")
    assert {e.key for e in in_may} == {"may-8", "may-31"}
    ends_included = await service.search(event_after="2023-05-08", event_before="2023-05-08")
    assert [e.key for e in ends_included] == ["may-8"]
    assert {e.key for e in await service.search(event_after="2024-01-01")} == {"today"}
    assert {e.key for e in await service.search(event_before="2023-05-01")} == {"april"}
    # A date alone as event_before includes that whole day: May 31 at 23:00 was left out of "2023-05-31".
    assert {e.key for e in await service.search(event_after="2023-05-31", event_before="2023-05-31")} == {"may-31"}
    assert {e.key for e in await service.search(entity_path="diary", event_after="2023-05-01",
                                                event_before="2023-05-31")} == {"may-8", "may-31"}
    assert {e.key for e in await service.search(event_before="2023-05-31T00:00:00Z")} == {"april", "may-8"}


# -- retrieval (real embedder, both stores) -------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedder():
    from amfs_server.adapters.embedders import load_embedder

    # chat-MiniLM-L6 (384 dimensions, the [postgres] fixture's width): these test the strategies, not the model
    return load_embedder("chat-minilm")


@pytest.fixture
async def rsvc(store, embedder) -> MemoryService:
    svc = MemoryService(store, ServiceConfig(), embedder=embedder)
    await svc.open()
    return svc


async def test_retrieve_filters_by_event_time_in_every_strategy(rsvc: MemoryService, actor: Actor) -> None:
    await rsvc.write_many(actor, [
        WriteRequest("runs", "march", "Ran a 10k race in the rain", event_at="2023-03-12"),
        WriteRequest("runs", "may", "Ran the half marathon race in Lisbon", event_at="2023-05-08"),
        WriteRequest("runs", "june", "Ran a trail race in the hills", event_at="2023-06-18"),
    ])
    unfiltered = await rsvc.retrieve(actor, "race", entity_path="runs")
    assert {r.entry.key for r in unfiltered} == {"march", "may", "june"}
    spring = await rsvc.retrieve(actor, "race", entity_path="runs", event_after="2023-03-01", event_before="2023-05-31")
    assert {r.entry.key for r in spring} == {"march", "may"}
    assert all(r.entry.event_at is not None for r in spring)
    with pytest.raises(ValidationError, match="event_before"):
        await rsvc.retrieve(actor, "race", event_before="last week")


async def test_temporal_strategy_ranks_by_event_time_when_an_entry_has_one(rsvc: MemoryService, actor: Actor) -> None:
    # Written in this order (so by write time "first-written" would be oldest), but the events happened the other
    # way round; an entry without an event time counts from its write time (now), so it is the most recent event.
    await rsvc.write(actor, WriteRequest("moves", "first-written", "Moved to Porto", event_at="2024-03-01"))
    await rsvc.write(actor, WriteRequest("moves", "second-written", "Moved to Lisbon", event_at="2019-09-01"))
    await rsvc.write(actor, WriteRequest("moves", "undated", "Moved to Braga"))
    results = await rsvc.retrieve(actor, "moved", entity_path="moves", weights=NO_RELEVANCE, explain=True)
    assert [r.entry.key for r in results] == ["undated", "first-written", "second-written"]
    assert [r.strategies["temporal"].rank for r in results] == [1, 2, 3]


async def test_a_question_naming_the_month_finds_the_entry_dated_in_it(rsvc: MemoryService, actor: Actor) -> None:
    await rsvc.write_many(actor, [
        WriteRequest("log", "a", "Went to a concert with Sam", event_at="2023-05-08"),
        WriteRequest("log", "b", "Went to a concert with Alex", event_at="2023-09-14"),
    ])
    only_keyword = {"semantic": 0.0, "keyword": 1.0, "temporal": 0.0, "confidence": 0.0}
    results = await rsvc.retrieve(actor, "Which concert did I go to in September?", entity_path="log", weights=only_keyword)
    assert results[0].entry.key == "b"


def test_embedded_text_names_the_event_date_in_words_and_is_unchanged_without_one() -> None:
    assert embedding_text("conv-01", "s01-t02", "Jonah: hi") == "conv 01 s01 t02: Jonah: hi"
    dated = embedding_text("conv-01", "s01-t02", "Jonah: hi", datetime(2023, 5, 8, 23, 30, tzinfo=UTC))
    assert dated == "conv 01 s01 t02, 8 May 2023: Jonah: hi"
    # The date stays ahead of the value, so the length cap never cuts it off.
    assert "8 May 2023" in embedding_text("p", "k", "x" * 10_000, datetime(2023, 5, 8, tzinfo=UTC))


def test_the_sdk_writes_event_times_singly_and_in_bulk_and_filters_on_them(tmp_path) -> None:
    from amfs_server import AgentMemory

    with AgentMemory(agent_id="my-agent", data_dir=tmp_path, embedder="none") as mem:
        single = mem.write("diary", "race", "Ran the half marathon", event_at="2023-05-08")
        bulk = mem.write_many([
            WriteRequest("diary", "trip", "Flew to Lisbon", event_at=datetime(2023, 9, 1, 8, tzinfo=UTC)),
            WriteRequest("diary", "note", "Wrote this down"),
        ])
        assert single.event_at == datetime(2023, 5, 8, tzinfo=UTC)
        assert [e.event_at for e in bulk] == [datetime(2023, 9, 1, 8, tzinfo=UTC), None]
        in_2023 = mem.search("diary", event_after="2023-01-01", event_before="2023-12-31")
        assert {e.key for e in in_2023} == {"race", "trip"}
        hits = mem.retrieve("half marathon Lisbon", event_before="2023-06-01")
        assert [hit.entry.key for hit in hits] == ["race"]
