"""Tool output a model reads cheaply: rounded numbers, ages instead of timestamps, compact entries unless
`verbose=true`. Driven through FastMCP's Client, whose MCP session validates structured output against
each tool's output schema."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from fastmcp import Client

from amfs_server.tools._views import age, significant, without_noise

COMPACT_ENTRY = {"entry_key", "version", "value", "confidence", "age"}
VERBOSE_ENTRY = {
    "entry_key", "entity_path", "key", "version", "value", "truncated", "confidence", "memory_type", "tier",
    "provenance_tier", "agent_id", "written_at", "outcome_count", "recall_count", "ttl_at", "event_at", "importance_score",
}


def test_scores_keep_four_significant_digits_and_confidences_lose_float_noise() -> None:
    assert significant(0.016393442622950818) == 0.01639
    assert significant(123.456789) == 123.5
    assert without_noise(0.8 * 1.1) == 0.88 and 0.8 * 1.1 != 0.88
    assert without_noise(0.9775) == 0.9775


@pytest.mark.parametrize(
    ("ago", "shown"),
    [(timedelta(seconds=42), "42s"), (timedelta(minutes=17, seconds=5), "17m"), (timedelta(hours=3, minutes=59), "3h"),
     (timedelta(days=12, hours=5), "12d"), (timedelta(seconds=-5), "0s")],
)
def test_age_is_shown_in_its_largest_whole_unit(ago: timedelta, shown: str) -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert age(now - ago, now) == shown


async def seed(client: Client) -> None:
    for key, text in [("retry", "retry payments with exponential backoff"), ("index", "rebuild the index nightly")]:
        await client.call_tool("amfs_write", {"entity_path": "svc", "key": key, "value": text, "confidence": 0.8})


async def test_retrieve_returns_compact_hits_by_default_and_full_entries_when_verbose(client: Client) -> None:
    await seed(client)
    compact = (await client.call_tool("amfs_retrieve", {"query": "retry payments"})).structured_content
    hit = compact["results"][0]
    assert set(hit) == COMPACT_ENTRY | {"rank", "score"}
    assert hit["entry_key"] == "svc/retry" and hit["age"].endswith("s") and hit["confidence"] == 0.8
    assert hit["score"] == significant(hit["score"])
    verbose = (await client.call_tool("amfs_retrieve", {"query": "retry payments", "verbose": True})).structured_content
    assert set(verbose["results"][0]) == {"rank", "score", "entry", "explain"}
    assert set(verbose["results"][0]["entry"]) == VERBOSE_ENTRY


async def test_explain_gives_rounded_scores_and_the_temporal_strategy_as_an_age(client: Client) -> None:
    await seed(client)
    found = await client.call_tool("amfs_retrieve", {"query": "retry payments", "explain": True})
    explain = found.structured_content["results"][0]["explain"]
    assert explain["temporal"]["age"].endswith("s") and "raw_score" not in explain["temporal"]
    # The age of what the temporal strategy ranks: the event time, not the write time (an event of 2023 read "0s").
    await client.call_tool("amfs_write", {"entity_path": "svc", "key": "old", "value": "retry payments went down",
                                          "event_at": "2023-05-01T00:00:00Z"})
    found = await client.call_tool("amfs_retrieve", {"query": "retry payments went down", "explain": True})
    old = next(r for r in found.structured_content["results"] if r["entry_key"] == "svc/old")
    assert old["explain"]["temporal"]["age"].endswith("d") and int(old["explain"]["temporal"]["age"][:-1]) > 500
    for strategy in explain.values():
        assert strategy["contribution"] == significant(strategy["contribution"])
        if "raw_score" in strategy:
            assert strategy["raw_score"] == significant(strategy["raw_score"])
    assert explain["keyword"]["raw_score"] < 1e6  # a score, not an epoch timestamp


async def test_search_and_list_are_compact_by_default_and_verbose_on_request(client: Client) -> None:
    await seed(client)
    for tool in ("amfs_search", "amfs_list"):
        compact = (await client.call_tool(tool, {"entity_path": "svc"})).structured_content
        assert [set(entry) for entry in compact["entries"]] == [COMPACT_ENTRY, COMPACT_ENTRY], tool
        verbose = (await client.call_tool(tool, {"entity_path": "svc", "verbose": True})).structured_content
        assert [set(entry) for entry in verbose["entries"]] == [VERBOSE_ENTRY, VERBOSE_ENTRY], tool


async def test_confidences_after_an_outcome_carry_no_float_noise(client: Client) -> None:
    await seed(client)
    await client.call_tool("amfs_read", {"entity_path": "svc", "key": "retry"})
    outcome = await client.call_tool("amfs_commit_outcome", {"outcome_ref": "INC-1", "outcome_type": "failure"})
    (effect,) = outcome.structured_content["updated"]
    assert effect["confidence_before"] == 0.8 and effect["confidence_after"] == 0.88  # 0.8 * 1.1 = 0.8800000000000001
    read = await client.call_tool("amfs_read", {"entity_path": "svc", "key": "retry"})
    assert read.structured_content["confidence"] == 0.88
    listed = await client.call_tool("amfs_list", {"entity_path": "svc"})
    assert {e["entry_key"]: e["confidence"] for e in listed.structured_content["entries"]}["svc/retry"] == 0.88
