"""The `LearningStore` contract (core/ports.py), proven at the store level on every adapter ([sqlite], [postgres]).

Every test runs on both stores through the `learning_store` fixture and expects the same answer from each.
Times are fixed (`T0` plus seconds), passed explicitly. The rules that make preferences and patterns (the
confidence curve, detection, redaction) are tested through `LearningService` in test_learning_service.py.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from amfs_server.core.errors import ValidationError
from amfs_server.core.learning_records import Interaction, LearningSnapshot, Pattern, Preference, PreferenceChange
from amfs_server.core.ports import LearningStore

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
async def store(learning_store: Any) -> LearningStore:
    await learning_store.open()
    return learning_store


def interaction(
    interaction_id: str, user_id: str = "alice", seconds: float = 0, tool_name: str = "fetch_users", **changes: Any
) -> Interaction:
    made = Interaction(
        interaction_id=interaction_id, user_id=user_id, session_id="session-1", tool_name=tool_name, source="mcp",
        parameters={"limit": 100}, outcome=None, result={"size_bytes": 10, "is_error": False, "fields": ["users"]},
        execution_ms=12.5, at=at(seconds),
    )
    return replace(made, **changes) if changes else made


def preference(user_id: str, category: str, key: str, value: Any = "black", seconds: float = 0, **changes: Any) -> Preference:
    made = Preference(user_id, category, key, value, 0.4, 1, 1, "observed", at(seconds))
    return replace(made, **changes) if changes else made


def pattern(pattern_id: str, user_id: str = "alice", seconds: float = 0, **changes: Any) -> Pattern:
    made = Pattern(
        pattern_id=pattern_id, user_id=user_id, pattern_type="workflow", tool_name="open_issue",
        data={"tools": ["open_issue", "label_issue"], "occurrences": 3, "anchor_uses": 4}, occurrences=3,
        frequency=0.75, confidence=0.5, discovered_at=at(seconds), updated_at=at(seconds + 60),
    )
    return replace(made, **changes) if changes else made


def setting(pref: Preference) -> PreferenceChange:
    """A change that makes the preference `pref`, whatever was there."""
    return PreferenceChange(pref.user_id, pref.category, pref.key, lambda previous: pref)


def counting(user_id: str, category: str, key: str, seconds: float, seen: list[Preference | None]) -> PreferenceChange:
    """A read-modify-write: one more sample on what is stored (the shape of `core.learning.observed`)."""

    def apply(previous: Preference | None) -> Preference:
        seen.append(previous)
        if previous is None:
            return preference(user_id, category, key, seconds=seconds)
        return replace(previous, sample_size=previous.sample_size + 1, support=previous.support + 1, updated_at=at(seconds))

    return PreferenceChange(user_id, category, key, apply)


def test_both_adapters_satisfy_the_protocol(store: LearningStore) -> None:
    assert isinstance(store, LearningStore)


# -- record, interactions, preferences -------------------------------------------------------------


async def test_record_stores_the_interaction_and_applies_each_change_to_what_is_stored(store: LearningStore) -> None:
    seen: list[Preference | None] = []
    first = await store.record(interaction("i1"), [counting("alice", "fmt", "style", 0, seen)])
    assert [p.sample_size for p in first] == [1]
    # Two changes to one preference in one call: the second sees the first's result.
    second = await store.record(
        interaction("i2", seconds=1),
        [counting("alice", "fmt", "style", 1, seen), counting("alice", "fmt", "style", 2, seen), counting("bob", "fmt", "style", 2, seen)],
    )
    assert [(p.user_id, p.sample_size, p.updated_at) for p in second] == [("alice", 2, at(1)), ("alice", 3, at(2)), ("bob", 1, at(2))]
    assert [None if p is None else p.sample_size for p in seen] == [None, 1, 2, None]
    assert seen[1] == replace(first[0], action="none")  # the stored preference comes back exactly
    assert await store.preferences() == [second[1], second[2]]
    assert [i.interaction_id for i in await store.interactions()] == ["i1", "i2"]
    assert await store.record(None, []) == []
    assert len(await store.interactions()) == 2


async def test_record_without_an_interaction_changes_only_preferences(store: LearningStore) -> None:
    [stored] = await store.record(None, [setting(preference("alice", "fmt", "style", "ruff", source="corrected"))])
    assert stored.source == "corrected"
    assert await store.interactions() == []
    assert await store.preferences("alice") == [stored]


async def test_a_record_that_fails_part_way_writes_nothing(store: LearningStore) -> None:
    await store.record(interaction("i1"), [setting(preference("alice", "fmt", "style", "black"))])

    def explode(previous: Preference | None) -> Preference:
        raise RuntimeError("the change failed")

    with pytest.raises(RuntimeError, match="the change failed"):
        await store.record(
            interaction("i2", seconds=1),
            [setting(preference("alice", "fmt", "style", "ruff")), PreferenceChange("alice", "fmt", "width", explode)],
        )
    assert [i.interaction_id for i in await store.interactions()] == ["i1"]
    assert [(p.key, p.value) for p in await store.preferences()] == [("style", "black")]
    with pytest.raises(Exception):  # a duplicate interaction id is refused, with nothing written
        await store.record(interaction("i1", seconds=2), [setting(preference("alice", "fmt", "style", "ruff"))])
    assert [(p.key, p.value) for p in await store.preferences()] == [("style", "black")]
    assert len(await store.interactions()) == 1


async def test_interactions_come_oldest_first_and_a_limit_keeps_the_newest(store: LearningStore) -> None:
    for interaction_id, user_id, seconds in [("a", "alice", 5), ("b", "bob", 1), ("c", "alice", 3), ("d", "alice", 3), ("e", "alice", 9)]:
        await store.record(interaction(interaction_id, user_id, seconds), [])
    ids = lambda rows: [i.interaction_id for i in rows]  # noqa: E731
    assert ids(await store.interactions()) == ["b", "c", "d", "a", "e"]  # a tie on `at` keeps insertion order
    assert ids(await store.interactions("alice")) == ["c", "d", "a", "e"]
    assert ids(await store.interactions("alice", limit=3)) == ["d", "a", "e"]
    assert ids(await store.interactions(limit=1)) == ["e"]
    assert await store.interactions(limit=0) == []
    assert await store.interactions(limit=-1) == []
    assert await store.interactions("nobody") == []


async def test_interaction_stats_count_a_users_interactions_and_the_newest_time(store: LearningStore) -> None:
    for interaction_id, user_id, seconds in [("a", "alice", 5), ("b", "bob", 1), ("c", "alice", 3.000001)]:
        await store.record(interaction(interaction_id, user_id, seconds), [])
    assert await store.interaction_stats("alice") == (2, at(5))
    assert await store.interaction_stats("bob") == (1, at(1))
    assert await store.interaction_stats("nobody") == (0, None)


async def test_users_are_those_with_interactions_or_patterns_in_byte_order(store: LearningStore) -> None:
    for interaction_id, user_id in [("1", "bob"), ("2", "alice"), ("3", "bob"), ("4", "Zed"), ("5", "éva")]:
        await store.record(interaction(interaction_id, user_id), [])
    await store.replace_patterns("carol", [pattern("p1", "carol")])
    await store.record(None, [setting(preference("dave", "fmt", "style"))])  # preferences alone do not make a user
    assert await store.users() == ["Zed", "alice", "bob", "carol", "éva"]


async def test_purge_interactions_deletes_those_before_the_cutoff(store: LearningStore) -> None:
    for interaction_id, seconds in [("a", 0), ("b", 10), ("c", 10.000001), ("d", 20)]:
        await store.record(interaction(interaction_id, seconds=seconds), [])
    await store.record(None, [setting(preference("alice", "fmt", "style"))])
    assert await store.purge_interactions(at(10)) == 1  # strictly before
    assert await store.purge_interactions(at(10.000001)) == 1
    assert await store.purge_interactions(at(10.000001)) == 0
    assert [i.interaction_id for i in await store.interactions()] == ["c", "d"]
    assert len(await store.preferences()) == 1  # preferences are not interactions


async def test_preferences_sort_by_user_category_and_key_and_filter(store: LearningStore) -> None:
    prefs = [preference(u, c, k) for u, c, k in [("bob", "b", "x"), ("alice", "b", "a"), ("alice", "a", "z"),
                                                 ("alice", "B", "k"), ("bob", "a", "y"), ("alice", "a", "_")]]
    await store.record(None, [setting(p) for p in prefs])
    order = sorted(prefs, key=lambda p: (p.user_id.encode(), p.category.encode(), p.key.encode()))
    assert await store.preferences() == order
    assert await store.preferences("alice") == [p for p in order if p.user_id == "alice"]
    assert await store.preferences(category="a") == [p for p in order if p.category == "a"]
    assert await store.preferences("bob", "a") == [preference("bob", "a", "y")]
    assert await store.preferences("nobody") == []


async def test_delete_preference_removes_one_users_key_or_every_users(store: LearningStore) -> None:
    await store.record(None, [setting(preference(u, "fmt", k)) for u in ("alice", "bob", "carol") for k in ("style", "width")])
    assert await store.delete_preference("alice", "fmt", "style") == 1
    assert await store.delete_preference("alice", "fmt", "style") == 0
    assert await store.delete_preference(None, "fmt", "width") == 3
    assert await store.delete_preference(None, "fmt", "missing") == 0
    assert [(p.user_id, p.key) for p in await store.preferences()] == [("bob", "style"), ("carol", "style")]


# -- patterns ---------------------------------------------------------------------------------------


async def test_replace_patterns_makes_the_list_a_users_only_patterns(store: LearningStore) -> None:
    await store.replace_patterns("alice", [pattern("p2"), pattern("p1")])
    await store.replace_patterns("bob", [pattern("p3", "bob")])
    assert [(p.user_id, p.pattern_id) for p in await store.patterns()] == [("alice", "p1"), ("alice", "p2"), ("bob", "p3")]
    updated = pattern("p2", confidence=0.9, occurrences=7, data={"tools": ["b", "a"], "nested": {"z": 1, "a": [1.5]}})
    await store.replace_patterns("alice", [updated, pattern("p4")])
    assert await store.patterns("alice") == [updated, pattern("p4")]
    assert list((await store.patterns("alice"))[0].data["nested"]) == ["z", "a"]
    assert await store.patterns("bob") == [pattern("p3", "bob")]  # another user's patterns stay
    await store.replace_patterns("alice", [])
    assert await store.patterns("alice") == [] and len(await store.patterns()) == 1


async def test_replace_patterns_with_an_id_held_by_another_user_moves_it(store: LearningStore) -> None:
    """Detected ids include the user, so this only happens with imported ids; both stores then do the same."""
    await store.replace_patterns("bob", [pattern("shared", "bob")])
    await store.replace_patterns("alice", [pattern("shared", "alice"), pattern("dup", "alice", occurrences=1),
                                           pattern("dup", "alice", occurrences=2)])
    assert [(p.user_id, p.pattern_id, p.occurrences) for p in await store.patterns()] == [
        ("alice", "dup", 2), ("alice", "shared", 3)  # a repeated id: the last one wins
    ]


# -- clear, export, import ------------------------------------------------------------------------

EXACT: dict[str, Any] = {
    "unicode": "ünïcødé — 中文 — עברית — 🧪👩‍💻 e\u0301",
    "nested": {"z": 1, "a": [1.5, None, True, False, "", {"y": [], "b": {}}]},
    "ints": [12345678901234567890, -(2**63), 10**30],
    "floats": [0.1, 1e300, 5e-324, -2.5e-10],
    "empty": "",
    "binaryish": ["\x00nul", "\x01\x1f\x7f", "\\x00\\xff", "AAEC/w==", "\u2028"],
}


async def _fill(store: LearningStore) -> None:
    await store.record(
        interaction("i1", seconds=0.000001, parameters=dict(EXACT), outcome={"ok": True, "detail": EXACT["nested"]},
                    result={"size_bytes": 0, "is_error": True, "fields": [], "error_type": "Timeout"}, execution_ms=None),
        [setting(preference("alice", "fmt", "style", EXACT["nested"], seconds=1.5))],
    )
    await store.record(interaction("i0", "bob", seconds=0, source="reported", outcome="ünï", execution_ms=0.0), [])
    await store.record(interaction("i2", "ünï", seconds=0.000001, parameters={}, outcome=12345678901234567890), [])
    await store.record(None, [setting(preference("bob", "editor", "tabs", 4, confidence=0.85, sample_size=9, support=5,
                                                 source="corrected"))])
    await store.replace_patterns("alice", [pattern("p1", data={"value": EXACT["unicode"], "big": 2**70}), pattern("p0")])


async def test_export_then_import_restores_everything_exactly(store: LearningStore) -> None:
    await _fill(store)
    snapshot = await store.export_snapshot()
    assert [i.interaction_id for i in snapshot.interactions] == ["i0", "i1", "i2"]  # by time, then insertion
    assert [(p.user_id, p.key) for p in snapshot.preferences] == [("alice", "style"), ("bob", "tabs")]
    assert [p.pattern_id for p in snapshot.patterns] == ["p0", "p1"]
    assert snapshot.interactions[1].parameters == EXACT and list(snapshot.interactions[1].parameters) == list(EXACT)

    await store.clear()
    assert await store.export_snapshot() == LearningSnapshot()
    assert await store.users() == []
    await store.import_snapshot(snapshot)
    restored = await store.export_snapshot()
    assert restored == snapshot
    assert list(restored.interactions[1].outcome["detail"]) == ["z", "a"]
    assert restored.interactions[1].execution_ms is None and restored.interactions[0].execution_ms == 0.0
    # The restored store carries on: stats, users and read-modify-writes see the imported rows.
    assert await store.interaction_stats("alice") == (1, at(0.000001))
    seen: list[Preference | None] = []
    await store.record(None, [counting("bob", "editor", "tabs", 5, seen)])
    assert seen == [snapshot.preferences[1]]


async def test_check_only_import_runs_the_refusal_checks_and_writes_nothing(store: LearningStore) -> None:
    await _fill(store)
    snapshot = await store.export_snapshot()
    await store.clear()
    await store.import_snapshot(snapshot, check_only=True)
    assert await store.export_snapshot() == LearningSnapshot()
    await store.import_snapshot(snapshot)
    with pytest.raises(ValidationError, match="refuses to overwrite"):
        await store.import_snapshot(snapshot, check_only=True)


@pytest.mark.parametrize("clash", ["interaction", "preference"])
async def test_import_refuses_an_existing_interaction_or_preference_and_writes_nothing(store: LearningStore, clash: str) -> None:
    await store.record(interaction("i1"), [setting(preference("alice", "fmt", "style"))])
    before = await store.export_snapshot()
    incoming = LearningSnapshot(
        interactions=[interaction("new", seconds=5)] + ([interaction("i1", seconds=6)] if clash == "interaction" else []),
        preferences=[preference("bob", "fmt", "style")] + ([preference("alice", "fmt", "style", "ruff")] if clash == "preference" else []),
        patterns=[pattern("p9")],
    )
    with pytest.raises(ValidationError, match="i1" if clash == "interaction" else "fmt.style"):
        await store.import_snapshot(incoming)
    assert await store.export_snapshot() == before


@pytest.mark.parametrize("repeated", ["interaction", "preference"])
async def test_import_refuses_a_snapshot_that_repeats_an_interaction_or_preference(store: LearningStore, repeated: str) -> None:
    incoming = LearningSnapshot(
        interactions=[interaction("i1"), interaction("i2", seconds=1)]
        + ([interaction("i1", seconds=2)] if repeated == "interaction" else []),
        preferences=[preference("alice", "fmt", "style")]
        + ([preference("alice", "fmt", "style", "ruff")] if repeated == "preference" else []),
    )
    with pytest.raises(ValidationError, match="twice"):
        await store.import_snapshot(incoming)
    assert await store.export_snapshot() == LearningSnapshot()


async def test_import_replaces_patterns_that_share_an_id(store: LearningStore) -> None:
    await store.replace_patterns("alice", [pattern("p1"), pattern("p2")])
    incoming = pattern("p1", "bob", confidence=0.95)
    await store.import_snapshot(LearningSnapshot(patterns=[incoming]))
    assert [(p.user_id, p.pattern_id, p.confidence) for p in await store.patterns()] == [
        ("alice", "p2", 0.5), ("bob", "p1", 0.95)
    ]


async def test_reopening_the_store_keeps_its_data(store: LearningStore) -> None:
    await store.open()  # open is idempotent
    await store.record(interaction("i1"), [setting(preference("alice", "fmt", "style"))])
    await store.close()
    await store.open()
    assert [i.interaction_id for i in await store.interactions()] == ["i1"]
    assert len(await store.preferences()) == 1
