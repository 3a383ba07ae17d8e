"""The learning tools and the InteractionRecorder middleware, through FastMCP's in-memory Client, on an
app assembled the way server/app.py wires it (memory tools + learning tools, one ActorResolver)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client, FastMCP
from fastmcp.exceptions import ToolError

from amfs_server.adapters.sqlite_learning import SQLiteLearningStore
from amfs_server.core.learning import LearningConfig, LearningService
from amfs_server.server.composition import build_service
from amfs_server.server.auth import parse_api_keys
from amfs_server.server.settings import load_settings
from amfs_server.tools import ActorResolver, register_tools
from amfs_server.tools.learning_tools import LEARNING_TOOLS, register_learning_tools

BODY_MARKER = "THE-RESULT-BODY-IS-NEVER-STORED"
GITHUB = ["github_create_issue", "github_add_labels", "github_assign"]


def build_app(tmp_path: Path, credential: Callable[[], Any] = lambda: None, **config: Any) -> tuple[FastMCP, LearningService]:
    settings = load_settings({}, data_dir=tmp_path, embedder="none")
    learning = LearningService(SQLiteLearningStore(tmp_path / "learning.db"), LearningConfig(**config))
    service = build_service(settings)

    @asynccontextmanager
    async def lifespan(_: FastMCP) -> AsyncIterator[dict[str, Any]]:
        await service.open()
        try:
            yield {}
        finally:
            await service.close()

    mcp = FastMCP("amfs-test", lifespan=lifespan)

    @mcp.tool
    def fetch_users(limit: int = 10, api_key: str | None = None) -> dict:
        return {"users": [BODY_MARKER] * limit, "count": limit}

    @mcp.tool
    def flaky(reason: str) -> str:
        raise ToolError(f"failed: {reason}")

    actors = ActorResolver("agent/test", credential)
    register_tools(mcp, service, actors)
    register_learning_tools(mcp, learning, actors)
    return mcp, learning


@pytest.fixture
def make_client(tmp_path: Path) -> Callable[..., Any]:
    opened: list[LearningService] = []

    def make(**config: Any) -> tuple[Client, LearningService]:
        app, learning = build_app(tmp_path, **config)
        opened.append(learning)
        return Client(app), learning

    yield make


@pytest.fixture
async def connected(make_client) -> AsyncIterator[tuple[Client, LearningService]]:
    client, learning = make_client()
    async with client:
        yield client, learning
    await learning.close()


async def test_every_tool_call_is_recorded_with_result_metadata_but_never_the_body(connected) -> None:
    client, learning = connected
    await client.call_tool("fetch_users", {"limit": 3, "api_key": "sk-proj-Abc123def456GHI789jkl012MNO345"})
    await client.call_tool("amfs_write", {"entity_path": "svc", "key": "k", "value": "v"})
    failed = await client.call_tool("flaky", {"reason": "timeout"}, raise_on_error=False)
    assert failed.is_error
    fetch, write, flaky = await learning.interactions()
    assert (fetch.tool_name, fetch.source, fetch.user_id) == ("fetch_users", "mcp", "agent/test")
    assert fetch.parameters == {"limit": 3, "api_key": "[REDACTED]"}
    assert fetch.result["fields"] == ["users", "count"] and fetch.result["size_bytes"] > 3 * len(BODY_MARKER)
    assert fetch.result["is_error"] is False and fetch.execution_ms is not None and fetch.execution_ms >= 0
    assert write.tool_name == "amfs_write" and write.session_id == fetch.session_id
    # the server's own tools keep the shape of their arguments, never a memory's path, key or value
    assert write.parameters == {"[shapes]": {"entity_path": {"type": "string", "chars": 3},
                                             "key": {"type": "string", "chars": 1},
                                             "value": {"type": "string", "chars": 1}}}
    # a failed call keeps its error type and none of its arguments
    assert flaky.result["is_error"] is True and flaky.result["error_type"] == "ToolError" and flaky.parameters == {}
    exported = json.dumps(await learning.export())
    assert BODY_MARKER not in exported and "sk-proj" not in exported


async def test_reported_interactions_are_redacted_and_the_learning_tools_are_not_recorded(connected) -> None:
    client, learning = connected
    reported = (await client.call_tool("amfs_record_interaction", {
        "tool_name": "github_create_issue",
        "parameters": {"title": "Fix bug", "auth": {"token": "x"}, "body": "see ghp_1A2b3C4d5E6f7G8h9I0jK1lM2nO3pQ4rS5tU"},
        "outcome": "success", "execution_ms": 120.5,
    })).structured_content
    assert reported["recorded"] is True and reported["redacted"] == ["auth", "body"]
    await client.call_tool("amfs_get_preferences", {})
    await client.call_tool("amfs_patterns", {})
    (interaction,) = await learning.interactions()
    assert (interaction.tool_name, interaction.source, interaction.outcome, interaction.execution_ms) == (
        "github_create_issue", "reported", "success", 120.5
    )
    bad = await client.call_tool("amfs_record_interaction", {"tool_name": "no spaces"}, raise_on_error=False)
    assert bad.is_error


async def test_preferences_and_workflow_suggestions_over_mcp(connected) -> None:
    client, _ = connected
    for day in range(3):
        for tool, params in zip(GITHUB, [{"title": f"bug {day}"}, {"labels": ["bug"]}, {"assignee": "ada"}]):
            await client.call_tool("amfs_record_interaction", {"tool_name": tool, "parameters": params})
    patterns = (await client.call_tool("amfs_patterns", {"tool_name": "github_create_issue"})).structured_content
    assert any(p["data"].get("tools") == GITHUB for p in patterns["patterns"])
    suggested = (await client.call_tool("amfs_suggest_next", {"tool_name": "github_create_issue"})).structured_content
    (suggestion,) = suggested["suggestions"]
    assert [s["tool_name"] for s in suggestion["next_steps"]] == GITHUB[1:]
    assert suggestion["next_steps"][0]["usual_parameters"] == {"labels": ["bug"]}

    for _ in range(2):
        await client.call_tool("fetch_users", {"limit": 100})
    listed = (await client.call_tool("amfs_get_preferences", {"category": "fetch_users"})).structured_content
    assert [(p["key"], p["value"], p["action"]) for p in listed["preferences"]] == [("limit", 100, "suggest")]
    assert listed["thresholds"] == {"suggest": 0.3, "confirm": 0.6, "auto_apply": 0.8}
    corrected = (await client.call_tool("amfs_set_preference", {"category": "fetch_users", "key": "limit", "value": 25})).structured_content
    assert (corrected["value"], corrected["confidence"], corrected["action"]) == (25, 0.4, "suggest")
    refused = await client.call_tool(
        "amfs_set_preference", {"category": "github", "key": "token", "value": "ghp_1A2b3C4d5E6f7G8h9I0jK1lM2nO3pQ4rS5tU"},
        raise_on_error=False,
    )
    assert refused.is_error and "credential" in refused.content[0].text


async def test_learning_tools_are_documented_annotated_and_structured(connected) -> None:
    client, _ = connected
    tools = {t.name: t for t in await client.list_tools() if t.name in LEARNING_TOOLS}
    assert set(tools) == LEARNING_TOOLS
    for name, tool in tools.items():
        assert tool.description and len(tool.description) < 400, name
        assert tool.output_schema and tool.output_schema["type"] == "object", name
        assert tool.input_schema.get("additionalProperties") is False, name
        assert tool.annotations.open_world_hint is False and tool.annotations.title
    read_only = {n for n, t in tools.items() if t.annotations.read_only_hint}
    assert read_only == {"amfs_get_preferences", "amfs_patterns", "amfs_suggest_next"}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"enabled": False}, set()),
        ({"preference_learning": False}, {"amfs_record_interaction", "amfs_patterns", "amfs_suggest_next"}),
        ({"pattern_detection": False}, {"amfs_record_interaction", "amfs_get_preferences", "amfs_set_preference"}),
    ],
)
async def test_off_switches_remove_their_tools_and_learning_off_records_nothing(make_client, config, expected) -> None:
    client, learning = make_client(**config)
    async with client:
        names = {t.name for t in await client.list_tools()}
        assert names & LEARNING_TOOLS == expected
        for _ in range(3):
            await client.call_tool("fetch_users", {"limit": 100})
    recorded = await learning.interactions()
    assert len(recorded) == (0 if config == {"enabled": False} else 3)
    if config.get("enabled") is False:
        assert await learning.get_preferences(None) == [] and await learning.patterns() == []
    await learning.close()


async def test_a_read_only_keys_calls_are_not_recorded(tmp_path: Path) -> None:
    """Red-team repro: a `:ro` key's reads and refused writes were stored as interactions, and preferences were
    learned from them; the README says a read-only key changes nothing."""
    writer_app, learning = build_app(tmp_path)
    async with Client(writer_app) as writer:
        await writer.call_tool("amfs_write", {"entity_path": "svc", "key": "k", "value": "v"})
    await learning.close()
    reader_key = parse_api_keys("reader-key-000000000000002:ro")[0]
    app, learning = build_app(tmp_path, credential=lambda: reader_key)
    try:
        async with Client(app) as reader:
            for _ in range(6):
                await reader.call_tool("amfs_read", {"entity_path": "svc", "key": "k"})
                await reader.call_tool("fetch_users", {"limit": 2})
                await reader.call_tool("amfs_write", {"entity_path": "svc", "key": "k2", "value": "v"},
                                       raise_on_error=False)
            assert (await reader.call_tool("amfs_read", {"entity_path": "svc", "key": "k"})).data is not None
        assert [i.tool_name for i in await learning.interactions()] == ["amfs_write"]  # the writer's call only
        assert await learning.get_preferences(reader_key.agent_id) == []
    finally:
        await learning.close()
