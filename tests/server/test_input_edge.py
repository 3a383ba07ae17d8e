"""The MCP edge: strict numbers and booleans, lenient lists, bounded confidence, one error path."""

from __future__ import annotations

import logging
import math
import sqlite3

import pytest
from fastmcp import Client, FastMCP

from amfs_server.core.validation import MAX_CONFIDENCE, MAX_VERSION
from amfs_server.server.settings import Settings


async def error_text(client: Client, tool: str, arguments: dict) -> str:
    result = await client.call_tool(tool, arguments, raise_on_error=False)
    assert result.is_error, result
    return result.content[0].text


async def write(client: Client, **arguments: object) -> dict:
    return (await client.call_tool("amfs_write", {"entity_path": "svc", "key": "k", "value": 1, **arguments})).structured_content


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"confidence": 1.7e308}, "less than or equal to 100"),
        ({"confidence": "0.5"}, "valid number"),
        ({"confidence": True}, "valid number"),
        ({"ttl_seconds": 1e12}, "less than or equal to"),
        ({"ttl_seconds": "60"}, "valid number"),
        ({"importance_score": "0.5"}, "valid number"),
        ({"memory_type": 1}, "fact"),
    ],
)
async def test_write_refuses_numbers_of_the_wrong_type_or_out_of_range_as_a_validation_error(
    client: Client, arguments: dict, message: str
) -> None:
    text = await error_text(client, "amfs_write", {"entity_path": "svc", "key": "k", "value": 1, **arguments})
    assert message in text and "Internal error" not in text
    assert (await client.call_tool("amfs_list", {})).structured_content["count"] == 0


async def test_a_schema_refusal_reads_as_one_line_naming_each_argument_and_what_was_given(client: Client) -> None:
    """It was pydantic's multi-line text: "1 validation error for call[amfs_retrieve]", internal type codes and a
    link to pydantic's documentation (red-team repro)."""
    text = await error_text(client, "amfs_retrieve", {"query": "q", "limit": 0, "explain": "yes", "extra": 1})
    assert text.startswith("amfs_retrieve refused its arguments, nothing was done: ") and "\n" not in text
    assert "limit: Input should be greater than or equal to 1 (got 0)" in text
    assert "explain: Input should be a valid boolean (got 'yes')" in text and "extra: " in text
    assert "errors.pydantic.dev" not in text and "type=" not in text
    text = await error_text(client, "amfs_write", {"entity_path": "svc", "key": "k", "value": "v" , "confidence": "x" * 500})
    assert len(text) < 300 and "..." in text  # a long input is quoted cut short
    missing = await error_text(client, "amfs_read", {"key": "k"})
    assert "entity_path: Missing required argument" in missing and "(got" not in missing


@pytest.mark.parametrize(("tool", "arguments", "where"), [
    ("amfs_retrieve", {"query": "retry \ud800"}, "arguments.query"),
    ("amfs_write", {"entity_path": "svc", "key": "k", "value": {"note": ["ok", "x\udc00"]}}, "arguments.value.note[1]"),
])
async def test_a_lone_surrogate_in_any_argument_is_refused_in_one_line_naming_it(
    client: Client, tool: str, arguments: dict, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`amfs_answer(query="\\ud800")` was "Internal error" with a serializer traceback in the log (red-team finding,
    0.7.15): such text is refused before any tool runs, naming where it is."""
    with caplog.at_level(logging.WARNING):
        text = await error_text(client, tool, arguments)
    assert text == (f"{tool} refused its arguments: {where} holds a lone surrogate (\\ud800-\\udfff), which is not "
                    "Unicode text; nothing was done.")
    assert not [r for r in caplog.records if r.exc_info]
    assert (await client.call_tool("amfs_list", {})).structured_content["count"] == 0


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("amfs_read", {"entity_path": "svc", "key": "k", "version": MAX_VERSION + 1}, "less than or equal to"),
        ("amfs_read", {"entity_path": "svc", "key": "k", "version": 1.0}, "valid integer"),
        ("amfs_read", {"entity_path": "svc", "key": "k", "version": "1"}, "valid integer"),
        ("amfs_list", {"limit": "5"}, "valid integer"),
        ("amfs_calibrate", {"apply": 1}, "valid boolean"),
        ("amfs_calibrate", {"revert": "true"}, "valid boolean"),
        ("amfs_search", {"limit": True}, "valid integer"),
        ("amfs_search", {"min_confidence": "0.1"}, "valid number"),
        ("amfs_search", {"min_confidence": 101}, "min_confidence must be between 0 and 100"),
        ("amfs_read", {"entity_path": "svc", "key": "k", "min_confidence": 101}, "min_confidence must be between"),
    ],
)
async def test_reads_refuse_strings_and_floats_where_integers_and_booleans_are_declared(
    client: Client, tool: str, arguments: dict, message: str
) -> None:
    await write(client)
    text = await error_text(client, tool, arguments)
    assert message in text and "Internal error" not in text


async def test_the_largest_allowed_version_is_a_clear_not_found(client: Client) -> None:
    await write(client)
    text = await error_text(client, "amfs_read", {"entity_path": "svc", "key": "k", "version": MAX_VERSION})
    assert "has no version" in text


async def test_confidence_up_to_the_maximum_is_accepted(client: Client) -> None:
    assert (await write(client, confidence=MAX_CONFIDENCE))["confidence"] == MAX_CONFIDENCE
    assert (await write(client, key="k2", confidence=0))["confidence"] == 0


@pytest.mark.parametrize(
    "causal_entry_keys", [["svc/k"], '["svc/k"]', " [\"svc/k\"] ", "svc/k"], ids=["list", "json", "json-spaced", "one"]
)
async def test_commit_outcome_takes_a_list_a_json_encoded_list_or_one_key(client: Client, causal_entry_keys) -> None:
    await write(client)
    result = await client.call_tool(
        "amfs_commit_outcome",
        {"outcome_ref": "INC-1", "outcome_type": "failure", "causal_entry_keys": causal_entry_keys},
    )
    assert [e["entry_key"] for e in result.structured_content["updated"]] == ["svc/k"]


@pytest.mark.parametrize(
    ("causal_entry_keys", "message"),
    [
        ('["svc/k"', "valid array"),
        ("[1]", "valid string"),
        ("[]", "at least 1"),
        ('{"svc/k": 1}', "invalid segment"),  # one key, refused by the key rules
        (7, "valid array"),
        ("svc/missing", "No memory at 'svc/missing'"),
    ],
)
async def test_lenient_lists_are_validated_the_same_way_after_decoding(
    client: Client, causal_entry_keys: object, message: str
) -> None:
    await write(client)
    text = await error_text(
        client, "amfs_commit_outcome",
        {"outcome_ref": "INC-1", "outcome_type": "failure", "causal_entry_keys": causal_entry_keys},
    )
    assert message in text
    assert (await client.call_tool("amfs_read", {"entity_path": "svc", "key": "k"})).structured_content[
        "outcome_count"
    ] == 0


async def test_forty_critical_failures_leave_every_listing_readable(client: Client) -> None:
    await write(client, confidence=50.0)
    for n in range(40):
        await client.call_tool(
            "amfs_commit_outcome", {"outcome_ref": f"INC-{n}", "outcome_type": "critical_failure", "causal_entry_keys": ["svc/k"]}
        )
    listed = (await client.call_tool("amfs_list", {})).structured_content["entries"]
    searched = (await client.call_tool("amfs_search", {})).structured_content["entries"]
    assert listed[0]["confidence"] == searched[0]["confidence"] == MAX_CONFIDENCE


async def test_an_infinite_confidence_in_an_old_store_is_served_as_a_number(settings: Settings, app: FastMCP) -> None:
    async with Client(app) as client:
        await write(client)
    with sqlite3.connect(settings.data_dir / "amfs.db") as conn:
        conn.execute("UPDATE entries SET confidence = 9e999")
    async with Client(app) as client:
        for tool in ("amfs_list", "amfs_search"):
            result = await client.call_tool(tool, {})
            assert result.structured_content["entries"][0]["confidence"] == MAX_CONFIDENCE, tool
        read = await client.call_tool("amfs_read", {"entity_path": "svc", "key": "k"})
        assert math.isfinite(read.structured_content["confidence"])


async def test_a_refused_input_is_not_logged_as_a_crash(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        text = await error_text(client, "amfs_read", {"entity_path": "svc", "key": "missing"})
    assert "No memory" in text or "not found" in text.lower()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_http_refuses_a_body_with_a_duplicate_key_a_batch_or_an_id_of_another_type(tmp_path, launch_server) -> None:
    import httpx2

    server = launch_server("http", tmp_path / "http-data")
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    try:
        body = '{"jsonrpc":"2.0","id":5,"method":"ping","method":"tools/list"}'
        async with httpx2.AsyncClient(timeout=10) as http:
            refused = await http.post(f"{server.base_url}/mcp", content=body, headers=headers)
            shapes = [
                await http.post(f"{server.base_url}/mcp", content=shape, headers=headers)
                for shape in ('[{"jsonrpc":"2.0","id":1,"method":"ping"}]', '{"jsonrpc":"2.0","id":true,"method":"ping"}',
                              '{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}')
            ]
            accepted = await http.post(
                f"{server.base_url}/mcp", content='{"jsonrpc":"2.0","id":6,"method":"ping"}',
                headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
            )
    finally:
        server.stop()
    assert refused.status_code == 400
    assert refused.json() == {
        "jsonrpc": "2.0", "id": 5, "error": {"code": -32600, "message": "Invalid request: duplicate key 'method' in one object"}
    }
    assert "duplicate key" not in accepted.text  # the transport answers it (here: no session yet)
    assert [(r.status_code, r.json()["id"], r.json()["error"]["code"]) for r in shapes] == [(400, None, -32600)] * 3
    assert "batches are not supported" in shapes[0].text and "string or an integer" in shapes[1].text
