"""Every amfs_* tool and its errors, through FastMCP's in-memory Client."""

from __future__ import annotations

import asyncio
import json
import logging

import mcp_types
import pytest
from fastmcp import Client, Context, FastMCP

from amfs_server.core.service import MemoryService
from amfs_server.server.app import create_app
from amfs_server.server.composition import build_service
from amfs_server.server.settings import Settings, load_settings
from amfs_server.tools import ActorResolver
from amfs_server.tools.ml_tools import ML_TOOLS
from amfs_server.tools._progress import ThreadProgress
from amfs_server.tools._registry import ToolRegistry, read_only
from amfs_server.tools._views import LIST_VALUE_CHARS, LISTING_VALUE_CHARS

CORE_TOOLS = {
    "amfs_write", "amfs_read", "amfs_search", "amfs_list", "amfs_history", "amfs_commit_outcome", "amfs_forget",
}
LEARNING_TOOLS = {"amfs_record_interaction", "amfs_get_preferences", "amfs_set_preference", "amfs_patterns",
                  "amfs_suggest_next"}
READ_ONLY_TOOLS = {"amfs_read", "amfs_retrieve", "amfs_search", "amfs_list", "amfs_history", "amfs_get_preferences",
                   "amfs_patterns", "amfs_suggest_next"}


async def write(client: Client, entity_path: str, key: str, value: object, **extra: object) -> dict:
    result = await client.call_tool("amfs_write", {"entity_path": entity_path, "key": key, "value": value, **extra})
    return result.structured_content


async def error_text(client: Client, tool: str, arguments: dict) -> str:
    result = await client.call_tool(tool, arguments, raise_on_error=False)
    assert result.is_error, result
    return result.content[0].text


# -- registration -------------------------------------------------------------------------------


async def test_server_registers_the_amfs_tools_with_mcp_annotations(client: Client) -> None:
    tools = {tool.name: tool for tool in await client.list_tools()}
    everything = CORE_TOOLS | LEARNING_TOOLS | ML_TOOLS
    assert everything <= set(tools) <= everything | {"amfs_retrieve"}
    for name, tool in tools.items():
        assert tool.annotations.read_only_hint is (name in READ_ONLY_TOOLS), name
        assert tool.annotations.open_world_hint is False
        assert tool.annotations.title
    assert tools["amfs_forget"].annotations.destructive_hint is True
    assert tools["amfs_write"].annotations.destructive_hint is False
    assert tools["amfs_commit_outcome"].annotations.idempotent_hint is True


async def test_every_tool_has_a_tight_description_and_structured_output(client: Client) -> None:
    for tool in await client.list_tools():
        assert tool.description and len(tool.description) < 400, tool.name
        assert tool.output_schema and tool.output_schema["type"] == "object", tool.name
        assert tool.input_schema.get("additionalProperties") is False, tool.name


async def test_parameters_carry_constraints_in_the_schema(client: Client) -> None:
    tools = {tool.name: tool for tool in await client.list_tools()}
    write_schema = tools["amfs_write"].input_schema["properties"]
    assert write_schema["confidence"]["minimum"] == 0
    assert set(write_schema["memory_type"]["enum"]) == {"fact", "belief", "experience"}
    assert write_schema["entity_path"]["minLength"] == 1
    assert tools["amfs_write"].input_schema["required"] == ["entity_path", "key", "value"]
    outcome_type = tools["amfs_commit_outcome"].input_schema["properties"]["outcome_type"]
    assert set(outcome_type["enum"]) == {"critical_failure", "failure", "minor_failure", "success"}


async def test_retrieve_is_registered_only_when_the_service_offers_it(settings: Settings) -> None:
    class WithoutRetrieve(MemoryService):
        retrieve = None

    built = build_service(settings)
    async with Client(create_app(WithoutRetrieve(built.store, built.config), settings)) as client:
        names = {tool.name for tool in await client.list_tools()}
    assert "amfs_retrieve" not in names and CORE_TOOLS <= names


# -- write / read -------------------------------------------------------------------------------


async def test_write_returns_the_stored_entrys_key_version_and_confidence(client: Client) -> None:
    first = await write(client, "checkout-service", "retry-pattern", "exponential backoff", confidence=0.8)
    second = await write(client, "checkout-service", "retry-pattern", "jittered backoff", memory_type="belief")
    assert first == {
        "entry_key": "checkout-service/retry-pattern", "entity_path": "checkout-service", "key": "retry-pattern",
        "version": 1, "confidence": 0.8, "memory_type": "fact", "event_at": None,
    }
    assert second["version"] == 2 and second["memory_type"] == "belief"


async def test_read_returns_the_whole_value_even_when_listings_truncate_it(client: Client) -> None:
    big = {"notes": "x" * (LISTING_VALUE_CHARS * 3)}
    await write(client, "svc", "big", big)
    read = (await client.call_tool("amfs_read", {"entity_path": "svc", "key": "big"})).structured_content
    assert read["value"] == big and read["truncated"] is False
    assert read["recall_count"] == 1 and read["tier"] in {"hot", "warm", "archive"}


async def test_read_of_a_missing_memory_is_a_tool_error_that_suggests_amfs_retrieve(client: Client) -> None:
    message = await error_text(client, "amfs_read", {"entity_path": "svc", "key": "nothing-here"})
    assert "No memory at 'svc/nothing-here'" in message and "amfs_retrieve" in message


async def test_read_of_a_past_version_and_of_a_missing_version(client: Client) -> None:
    await write(client, "svc", "k", "one")
    await write(client, "svc", "k", "two")
    old = await client.call_tool("amfs_read", {"entity_path": "svc", "key": "k", "version": 1})
    assert old.structured_content["value"] == "one"
    message = await error_text(client, "amfs_read", {"entity_path": "svc", "key": "k", "version": 7})
    assert "no version 7" in message and "amfs_history" in message


async def test_read_below_min_confidence_says_how_to_see_it(client: Client) -> None:
    await write(client, "svc", "shaky", "maybe", confidence=0.3)
    message = await error_text(client, "amfs_read", {"entity_path": "svc", "key": "shaky", "min_confidence": 0.5})
    assert "below min_confidence" in message


async def test_arguments_outside_the_schema_are_refused_and_nothing_is_written(client: Client) -> None:
    assert "confidence" in await error_text(
        client, "amfs_write", {"entity_path": "svc", "key": "k", "value": 1, "confidence": -1}
    )
    assert "memory_type" in await error_text(
        client, "amfs_write", {"entity_path": "svc", "key": "k", "value": 1, "memory_type": "rumour"}
    )
    assert "key" in await error_text(client, "amfs_write", {"entity_path": "svc", "value": 1})
    listing = await client.call_tool("amfs_list", {})
    assert listing.structured_content["count"] == 0


async def test_domain_validation_errors_reach_the_client_with_their_message(client: Client) -> None:
    message = await error_text(client, "amfs_write", {"entity_path": "a//b", "key": "k", "value": 1})
    assert "empty segment" in message
    message = await error_text(client, "amfs_write", {"entity_path": "svc", "key": "a/b", "value": 1})
    assert "contains '/'" in message
    assert (await client.call_tool("amfs_list", {})).structured_content["count"] == 0


async def test_unexpected_errors_are_logged_with_traceback_and_reported_without_internals(
    app: FastMCP, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Client(app) as client:

        async def explode(*args: object, **kwargs: object) -> None:
            raise RuntimeError("db password is hunter2")

        monkeypatch.setattr("amfs_server.core.service.MemoryService.search", explode)
        with caplog.at_level(logging.ERROR, logger="amfs_server.tools"):
            message = await error_text(client, "amfs_search", {})
    assert message == "Internal error in amfs_search; see the server log."
    record = next(r for r in caplog.records if r.name == "amfs_server.tools")
    assert record.exc_info and "hunter2" in str(record.exc_info[1])


# -- search / list / history --------------------------------------------------------------------


async def test_search_filters_sorts_and_truncates_large_values_with_a_read_hint(client: Client) -> None:
    await write(client, "svc/a", "small", "tiny", confidence=0.5)
    await write(client, "svc/b", "large", "y" * (LISTING_VALUE_CHARS + 500), confidence=0.9)
    await write(client, "other", "x", "elsewhere", memory_type="belief")
    found = (await client.call_tool("amfs_search", {"entity_path": "svc"})).structured_content
    assert [e["entry_key"] for e in found["entries"]] == ["svc/b/large", "svc/a/small"]
    large = found["entries"][0]
    assert large["truncated"] is True
    assert large["value"].startswith("y" * LISTING_VALUE_CHARS)
    marker = f"[truncated: {LISTING_VALUE_CHARS + 502} chars of JSON; call amfs_read(entity_path='svc/b', key='large')"
    assert marker in large["value"]
    beliefs = (await client.call_tool("amfs_search", {"memory_type": "belief"})).structured_content
    assert [e["entry_key"] for e in beliefs["entries"]] == ["other/x"]
    confident = await client.call_tool("amfs_search", {"min_confidence": 0.8, "entity_path": "svc"})
    assert confident.structured_content["count"] == 1


async def test_search_by_agent_and_since(client: Client) -> None:
    await write(client, "svc", "k", 1)
    mine = (await client.call_tool("amfs_search", {"agent_id": "mcp"})).structured_content
    assert mine["count"] == 1
    future = (await client.call_tool("amfs_search", {"since": "2999-01-01T00:00:00"})).structured_content
    assert future["count"] == 0
    assert (await client.call_tool("amfs_search", {"since": "2000-01-01"})).structured_content["count"] == 1
    assert (await client.call_tool("amfs_search", {"since": "2999-01-01"})).structured_content["count"] == 0
    refused = await client.call_tool("amfs_search", {"since": "yesterday"}, raise_on_error=False)
    assert refused.is_error and "since" in refused.content[0].text and "2023-05-08" in refused.content[0].text


async def test_list_shows_previews_and_says_when_the_limit_cut_it(client: Client) -> None:
    for n in range(3):
        await write(client, "svc", f"k{n}", "z" * (LIST_VALUE_CHARS * 2))
    listing = (await client.call_tool("amfs_list", {"entity_path": "svc", "limit": 2})).structured_content
    assert listing["count"] == 2 and listing["more"] is True
    assert [e["entry_key"] for e in listing["entries"]] == ["svc/k0", "svc/k1"]
    assert listing["entries"][0]["truncated"] is True
    assert listing["entries"][0]["value"].startswith("z" * LIST_VALUE_CHARS + "…[truncated: 402 chars of JSON;")
    everything = (await client.call_tool("amfs_list", {})).structured_content
    assert everything["count"] == 3 and everything["more"] is False


async def test_listings_preview_a_long_value_from_its_head_as_its_own_text(client: Client) -> None:
    """Listings read a long value's first characters only (not 1 MiB parsed to show 200): the preview is still
    the string's own text, escapes decoded, and a structured value's JSON."""
    lines = "line one\n\"two\"\t" * 20_000  # 300,000 characters, 380,002 of JSON (escapes)
    json_chars = len(json.dumps(lines))
    await write(client, "svc", "text", lines)
    await write(client, "svc", "rows", [{"n": n} for n in range(20_000)])
    listed = {e["entry_key"]: e["value"] for e in
              (await client.call_tool("amfs_list", {"entity_path": "svc"})).structured_content["entries"]}
    assert listed["svc/text"] == lines[:LIST_VALUE_CHARS] + (
        f"…[truncated: {json_chars} chars of JSON; call amfs_read(entity_path='svc', key='text') for the whole value]")
    rows_json = json.dumps([{"n": n} for n in range(20_000)], separators=(",", ":"))
    assert listed["svc/rows"].startswith(rows_json[:LIST_VALUE_CHARS] + f"…[truncated: {len(rows_json)} chars of JSON;")
    for sort_by in ("confidence", "priority"):  # the second ranks every match first, then reads the kept ones' heads
        found = (await client.call_tool("amfs_search", {"entity_path": "svc", "sort_by": sort_by})).structured_content
        previews = {e["entry_key"]: e["value"] for e in found["entries"]}
        assert previews["svc/text"].startswith(lines[:LISTING_VALUE_CHARS] + f"…[truncated: {json_chars} chars of JSON;")
    assert (await client.call_tool("amfs_read", {"entity_path": "svc", "key": "text"})).structured_content["value"] == lines


async def test_history_lists_every_version_oldest_first(client: Client) -> None:
    await write(client, "svc", "k", "v1", confidence=0.4)
    await write(client, "svc", "k", "v2", confidence=0.9)
    history = (await client.call_tool("amfs_history", {"entity_path": "svc", "key": "k"})).structured_content
    versions = [(v["version"], v["value"], v["confidence"]) for v in history["versions"]]
    assert versions == [(1, "v1", 0.4), (2, "v2", 0.9)]
    assert "amfs_list" in await error_text(client, "amfs_history", {"entity_path": "svc", "key": "none"})


async def test_a_long_history_comes_in_pages_newest_first_each_oldest_first(client: Client) -> None:
    for n in range(1, 6):
        await write(client, "svc", "k", f"v{n}")

    async def page(**arguments: object) -> tuple[list[int], int]:
        history = (await client.call_tool("amfs_history", {"entity_path": "svc", "key": "k", **arguments})).structured_content
        return [v["version"] for v in history["versions"]], history["older_versions"]

    assert await page() == ([1, 2, 3, 4, 5], 0)
    assert await page(limit=2) == ([4, 5], 3)
    assert await page(limit=2, before_version=4) == ([2, 3], 1)
    assert await page(limit=2, before_version=2) == ([1], 0)
    for refused in ({"limit": 0}, {"limit": 1001}, {"before_version": 0}):
        text = await error_text(client, "amfs_history", {"entity_path": "svc", "key": "k", **refused})
        assert "Internal error" not in text


# -- forget -------------------------------------------------------------------------------------


async def test_forget_removes_every_version(client: Client) -> None:
    await write(client, "svc", "secret", "v1")
    await write(client, "svc", "secret", "v2")
    result = await client.call_tool("amfs_forget", {"entity_path": "svc", "key": "secret"})
    assert result.structured_content == {"entry_key": "svc/secret", "versions_removed": 2}
    assert "No memory" in await error_text(client, "amfs_read", {"entity_path": "svc", "key": "secret"})
    assert "nothing was forgotten" in await error_text(client, "amfs_forget", {"entity_path": "svc", "key": "secret"})


# -- outcomes and sessions ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_commit_outcome_without_keys_charges_every_entry_read_in_the_session(app: FastMCP, mode: str) -> None:
    async with Client(app, mode=mode) as client:
        await write(client, "svc", "read-me", "a", confidence=0.5)
        await write(client, "svc", "not-read", "b", confidence=0.5)
        await client.call_tool("amfs_read", {"entity_path": "svc", "key": "read-me"})
        result = await client.call_tool("amfs_commit_outcome", {"outcome_ref": "INC-1", "outcome_type": "failure"})
    outcome = result.structured_content
    assert outcome["already_applied"] is False and outcome["outcome_type"] == "failure"
    assert [(u["entry_key"], u["version_read"]) for u in outcome["updated"]] == [("svc/read-me", 1)]
    effect = outcome["updated"][0]
    assert effect["confidence_before"] == 0.5
    assert effect["confidence_after"] == pytest.approx(0.5 * outcome["multiplier"])


async def test_commit_outcome_with_explicit_keys_and_once_per_outcome_ref(client: Client) -> None:
    await write(client, "svc", "a", 1, confidence=0.5)
    args = {"outcome_ref": "deploy-7", "outcome_type": "success", "causal_entry_keys": ["svc/a"]}
    first = (await client.call_tool("amfs_commit_outcome", args)).structured_content
    again = (await client.call_tool("amfs_commit_outcome", args)).structured_content
    assert first["already_applied"] is False and first["updated"][0]["entry_key"] == "svc/a"
    assert again["already_applied"] is True
    read = (await client.call_tool("amfs_read", {"entity_path": "svc", "key": "a"})).structured_content
    assert read["confidence"] == pytest.approx(first["updated"][0]["confidence_after"])


async def test_commit_outcome_errors_name_the_next_step(client: Client) -> None:
    message = await error_text(client, "amfs_commit_outcome", {"outcome_ref": "r1", "outcome_type": "failure"})
    assert "has read nothing" in message and "causal_entry_keys" in message
    message = await error_text(
        client, "amfs_commit_outcome",
        {"outcome_ref": "r2", "outcome_type": "failure", "causal_entry_keys": ["svc/none"]},
    )
    assert "No memory at 'svc/none'" in message and "no outcome was recorded" in message
    # A list as text nested past the parser's recursion limit was an internal error (red-team repro).
    message = await error_text(client, "amfs_commit_outcome", {"outcome_ref": "r3", "outcome_type": "failure",
                                                               "causal_entry_keys": "[" * 5000 + "]" * 5000})
    assert "valid array" in message and "Internal error" not in message


async def test_each_mcp_session_has_its_own_read_tracker(app: FastMCP) -> None:
    async with Client(app, mode="legacy") as reader, Client(app, mode="legacy") as other:
        await write(reader, "svc", "k", "v")
        await reader.call_tool("amfs_read", {"entity_path": "svc", "key": "k"})
        message = await error_text(other, "amfs_commit_outcome", {"outcome_ref": "x", "outcome_type": "success"})
        assert "has read nothing" in message
        result = await reader.call_tool("amfs_commit_outcome", {"outcome_ref": "x", "outcome_type": "success"})
        assert result.structured_content["updated"][0]["entry_key"] == "svc/k"


async def test_agent_id_comes_from_the_client_name_unless_amfs_agent_id_is_set(tmp_path) -> None:
    for agent_setting, expected in [(None, "cursor"), ("agent/ci-bot", "agent/ci-bot")]:
        settings = load_settings({}, data_dir=tmp_path / str(agent_setting).replace("/", "_"), embedder="none",
                                 agent_id=agent_setting)
        app = create_app(build_service(settings), settings)
        info = mcp_types.Implementation(name="cursor", version="1.0")
        async with Client(app, client_info=info) as client:
            await write(client, "svc", "k", "v")
            entry = (await client.call_tool("amfs_read", {"entity_path": "svc", "key": "k"})).structured_content
        assert entry["agent_id"] == expected


# -- retrieval ----------------------------------------------------------------------------------


async def test_retrieve_ranks_matching_memories_and_explains_when_asked(client: Client) -> None:
    if "amfs_retrieve" not in {tool.name for tool in await client.list_tools()}:
        pytest.skip("MemoryService.retrieve is not there yet")
    await write(client, "checkout-service", "retry-pattern", "retry payments with exponential backoff")
    await write(client, "search-service", "index", "rebuild the index nightly")
    await write(client, "billing-service", "huge", "we retry payments nightly " + "p" * (LISTING_VALUE_CHARS * 2))
    result = await client.call_tool("amfs_retrieve", {"query": "how do we retry payments?", "explain": True})
    found = result.structured_content
    keys = [r["entry_key"] for r in found["results"]]
    assert "checkout-service/retry-pattern" in keys and "search-service/index" not in keys
    assert found["count"] == len(keys) and [r["rank"] for r in found["results"]] == list(range(1, len(keys) + 1))
    assert "keyword" in found["results"][0]["explain"]
    huge = next(r for r in found["results"] if r["entry_key"] == "billing-service/huge")
    assert huge["truncated"] is True and "amfs_read(" in huge["value"]
    scoped = await client.call_tool("amfs_retrieve", {"query": "retry payments", "entity_path": "billing-service"})
    assert [r["entry_key"] for r in scoped.structured_content["results"]] == ["billing-service/huge"]
    # retrieved entries count as reads of this session
    outcome = await client.call_tool("amfs_commit_outcome", {"outcome_ref": "r", "outcome_type": "failure"})
    assert "checkout-service/retry-pattern" in {u["entry_key"] for u in outcome.structured_content["updated"]}


async def test_retrieve_marks_results_that_nearly_repeat_each_other(client: Client) -> None:
    """A poisoned copy of a memory with one fact changed ranked above the real one and nothing told them apart
    (red-team finding, 0.7.11): each now names the other under near_copies, in compact and verbose results."""
    if "amfs_retrieve" not in {tool.name for tool in await client.list_tools()}:
        pytest.skip("MemoryService.retrieve is not there yet")
    await write(client, "chat", "t1", "Caroline: I went to the LGBTQ support group on Friday and it was so powerful.")
    await write(client, "chat", "t9", "Caroline: I went to the LGBTQ support group on Monday and it was so powerful.")
    await write(client, "chat", "t4", "Melanie: The support group sounds great, I am proud of you for going.")
    for verbose in (False, True):
        found = (await client.call_tool("amfs_retrieve", {"query": "When did Caroline go to the support group?",
                                                          "verbose": verbose})).structured_content["results"]
        marked = {(r["entry"]["entry_key"] if verbose else r["entry_key"]): r.get("near_copies") for r in found}
        assert marked["chat/t1"] == ["chat/t9"] and marked["chat/t9"] == ["chat/t1"]
        assert marked["chat/t4"] is None  # a reply about the same thing is not a copy


async def test_retrieve_validates_its_arguments(client: Client) -> None:
    if "amfs_retrieve" not in {tool.name for tool in await client.list_tools()}:
        pytest.skip("MemoryService.retrieve is not there yet")
    assert "depth" in await error_text(client, "amfs_retrieve", {"query": "x", "depth": 4})
    assert "query" in await error_text(client, "amfs_retrieve", {"query": ""})


# -- progress -----------------------------------------------------------------------------------


async def test_long_operations_can_send_progress_notifications_from_a_worker_thread(settings: Settings) -> None:
    service = build_service(settings)
    app = FastMCP("progress-test")
    registry = ToolRegistry(app, service, ActorResolver(None))

    @registry.tool(read_only("Slow"))
    async def amfs_slow(ctx: Context) -> dict:
        """Test tool."""
        report = ThreadProgress(ctx)

        def work() -> None:
            for step in range(1, 4):
                report(step, 3, f"step {step}")

        await asyncio.to_thread(work)
        await report.drain()  # every notification is sent before the result
        return {"done": True}

    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with Client(app, progress_handler=on_progress) as client:
        await client.call_tool("amfs_slow", {})
    assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


async def test_an_unknown_tool_is_a_clear_refusal_that_logs_nothing(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    name = "amfs_nope\n2026-01-01 00:00:00,000 CRITICAL amfs_server.auth: FORGED" + "x" * 3000
    with caplog.at_level(logging.DEBUG):
        result = await client.call_tool(name, {}, raise_on_error=False)
    assert result.is_error
    text = result.content[0].text
    assert text.startswith("Unknown tool 'amfs_nope\\n2026") and "call tools/list" in text and len(text) < 200
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r for r in caplog.records if "FORGED" in r.getMessage()]


async def test_commit_outcomes_schema_advertises_the_text_forms_it_accepts_and_the_item_limit(client: Client) -> None:
    """The schema said array-or-null, with string keywords beside the array and no item limit: a client validating
    against it refused the documented "svc/k" form and never learned of the 1,000-key limit (red-team repro)."""
    tools = {tool.name: tool for tool in await client.list_tools()}
    schema = tools["amfs_commit_outcome"].input_schema["properties"]["causal_entry_keys"]
    assert schema["anyOf"] == [{"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1000},
                               {"type": "string"}, {"type": "null"}]
    assert "minLength" not in schema and "maxLength" not in schema
