"""event_at through the MCP tools: amfs_write takes it, the entry views return it, retrieve/search filter on it."""

from __future__ import annotations

from fastmcp import Client


async def test_write_takes_event_at_and_read_history_and_search_return_it(client: Client) -> None:
    written = await client.call_tool(
        "amfs_write", {"entity_path": "trip", "key": "flight", "value": "Flew to Lisbon", "event_at": "2023-05-08"}
    )
    assert written.structured_content["event_at"] == "2023-05-08T00:00:00Z"
    read = (await client.call_tool("amfs_read", {"entity_path": "trip", "key": "flight"})).structured_content
    assert read["event_at"] == "2023-05-08T00:00:00Z"
    history = (await client.call_tool("amfs_history", {"entity_path": "trip", "key": "flight"})).structured_content
    assert [v["event_at"] for v in history["versions"]] == ["2023-05-08T00:00:00Z"]
    await client.call_tool("amfs_write", {"entity_path": "trip", "key": "hotel", "value": "Booked the hotel"})
    found = await client.call_tool("amfs_search", {"entity_path": "trip", "event_before": "2023-12-31"})
    assert [e["entry_key"] for e in found.structured_content["entries"]] == ["trip/flight"]
    retrieved = await client.call_tool(
        "amfs_retrieve", {"query": "Lisbon flight hotel", "event_after": "2024-01-01"}
    )
    assert [r["entry_key"] for r in retrieved.structured_content["results"]] == ["trip/hotel"]


async def test_a_bad_event_at_is_a_tool_error_that_shows_the_format_and_writes_nothing(client: Client) -> None:
    result = await client.call_tool(
        "amfs_write", {"entity_path": "trip", "key": "flight", "value": "x", "event_at": "last Tuesday"},
        raise_on_error=False,
    )
    assert result.is_error
    assert "ISO 8601" in result.content[0].text and "2023-05-08" in result.content[0].text
    far = await client.call_tool(
        "amfs_write", {"entity_path": "trip", "key": "flight", "value": "x", "event_at": "3023-05-08"},
        raise_on_error=False,
    )
    assert far.is_error and "1800..2200" in far.content[0].text
    assert (await client.call_tool("amfs_list", {})).structured_content["count"] == 0
