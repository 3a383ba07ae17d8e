"""End to end with the official MCP SDK (mcp 2.3.0): stdio, SSE and streamable HTTP against a real
`amfs-server` subprocess (HTTP ones on a free loopback port), including auth refusals and scopes."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import Implementation

from amfs_server.server.auth import ApiKey

ADMIN = "admin-key-0000000000000001"
READER = "reader-key-000000000000002"
TEAM_A = "team-a-key-000000000000003"
KEYS = f"{ADMIN},{READER}:ro,{TEAM_A}:rw@team-a"
CLIENT = Implementation(name="e2e-client", version="1.0")


@asynccontextmanager
async def http_session(url: str, token: str | None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write, client_info=CLIENT) as session:
                await session.initialize()
                yield session


@asynccontextmanager
async def sse_session(url: str, token: str | None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with sse_client(url, headers=headers, timeout=30) as (read, write):
        async with ClientSession(read, write, client_info=CLIENT) as session:
            await session.initialize()
            yield session


async def exercise(session: ClientSession, agent_id: str = "e2e-client") -> None:
    """The write -> read -> commit_outcome round trip every transport must carry; with an API key the
    agent is the key's identity, not the client's name."""
    names = {tool.name for tool in (await session.list_tools()).tools}
    assert {"amfs_write", "amfs_read", "amfs_commit_outcome"} <= names
    written = await session.call_tool("amfs_write", {"entity_path": "svc", "key": "k", "value": {"n": 1}})
    assert not written.is_error and written.structured_content["version"] >= 1
    read = await session.call_tool("amfs_read", {"entity_path": "svc", "key": "k"})
    assert read.structured_content["value"] == {"n": 1} and read.structured_content["agent_id"] == agent_id
    missing = await session.call_tool("amfs_read", {"entity_path": "svc", "key": "missing"})
    assert missing.is_error and "amfs_retrieve" in missing.content[0].text
    outcome = await session.call_tool(
        "amfs_commit_outcome", {"outcome_ref": f"ref-{id(session)}", "outcome_type": "failure"}
    )
    assert not outcome.is_error, outcome.content
    assert [u["entry_key"] for u in outcome.structured_content["updated"]] == ["svc/k"]


async def test_stdio_round_trip_with_the_official_sdk(stdio_command: Any) -> None:
    params = StdioServerParameters(command=stdio_command.command, args=stdio_command.args, env=stdio_command.env)
    async with stdio_client(params) as (read, write), ClientSession(read, write, client_info=CLIENT) as session:
        result = await session.initialize()
        assert result.server_info.name == "amfs"
        await exercise(session)


def test_stdio_stdout_carries_nothing_but_protocol(stdio_command: Any) -> None:
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "amfs_read", "arguments": {"entity_path": "svc", "key": "missing"}}},
    ]
    process = subprocess.Popen(
        [stdio_command.command, *stdio_command.args], env=stdio_command.env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    stdout = process.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
    process.stdin.write("".join(json.dumps(m) + "\n" for m in messages))
    process.stdin.flush()
    replies: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + 60
    try:
        while 3 not in replies:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            reply = json.loads(line)  # every stdout line is JSON-RPC, nothing else
            assert reply["jsonrpc"] == "2.0"
            replies[reply["id"]] = reply
    finally:
        process.stdin.close()  # EOF: the server shuts down
        returncode = process.wait(timeout=30)
    while not lines.empty():
        assert json.loads(lines.get())["jsonrpc"] == "2.0"
    assert set(replies) == {1, 2, 3}
    assert replies[3]["result"]["isError"] is True
    assert returncode == 0, process.stderr.read() if process.stderr else ""


@pytest.fixture(scope="module")
def keyed_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, launch_server: Any
) -> Iterator[Any]:
    """One real `amfs-server serve` per transport (param), with API keys, shared by this module's tests."""
    server = launch_server(request.param, tmp_path_factory.mktemp(f"server-{request.param}"), AMFS_API_KEYS=KEYS)
    yield server
    server.stop()


@pytest.mark.parametrize("keyed_server", ["http"], indirect=True)
async def test_streamable_http_round_trip(keyed_server: Any) -> None:
    async with http_session(f"{keyed_server.base_url}/mcp", ADMIN) as session:
        await exercise(session, ApiKey(ADMIN).agent_id)


@pytest.mark.parametrize("keyed_server", ["http"], indirect=True)
async def test_streamable_http_refuses_missing_keys_foreign_origins_and_out_of_scope_calls(keyed_server: Any) -> None:
    url = f"{keyed_server.base_url}/mcp"
    async with httpx2.AsyncClient(timeout=10) as http:
        anonymous = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                                    headers={"Accept": "application/json, text/event-stream"})
        forged = await http.post(
            url, json={}, headers={"Origin": "http://evil.example", "Authorization": f"Bearer {ADMIN}"}
        )
    assert anonymous.status_code == 401
    assert forged.status_code == 403
    async with http_session(url, ADMIN) as admin:
        await admin.call_tool("amfs_write", {"entity_path": "scoped", "key": "k", "value": 1})
    async with http_session(url, READER) as reader:
        refused = await reader.call_tool("amfs_write", {"entity_path": "scoped", "key": "new", "value": 1})
        assert refused.is_error and "read-only" in refused.content[0].text
        listing = await reader.call_tool("amfs_list", {"entity_path": "scoped"})
        assert [e["entry_key"] for e in listing.structured_content["entries"]] == ["scoped/k"]
    async with http_session(url, TEAM_A) as team:
        refused = await team.call_tool("amfs_read", {"entity_path": "scoped", "key": "k"})
        assert refused.is_error and "limited to entity_path 'team-a'" in refused.content[0].text
        assert (await team.call_tool("amfs_list", {})).structured_content["count"] == 0


@pytest.mark.parametrize("keyed_server", ["http"], indirect=True)
async def test_each_http_session_keeps_its_own_read_tracker(keyed_server: Any) -> None:
    url = f"{keyed_server.base_url}/mcp"
    async with http_session(url, ADMIN) as first, http_session(url, ADMIN) as second:
        await first.call_tool("amfs_write", {"entity_path": "tracked", "key": "a", "value": 1})
        await first.call_tool("amfs_read", {"entity_path": "tracked", "key": "a"})
        other = await second.call_tool("amfs_commit_outcome", {"outcome_ref": "tracked-o", "outcome_type": "success"})
        assert other.is_error and "has read nothing" in other.content[0].text
        mine = await first.call_tool("amfs_commit_outcome", {"outcome_ref": "tracked-o", "outcome_type": "success"})
        assert [u["entry_key"] for u in mine.structured_content["updated"]] == ["tracked/a"]


@pytest.mark.parametrize("keyed_server", ["sse"], indirect=True)
async def test_sse_round_trip_and_auth(keyed_server: Any) -> None:
    async with sse_session(f"{keyed_server.base_url}/sse", ADMIN) as session:
        await exercise(session, ApiKey(ADMIN).agent_id)
    async with httpx2.AsyncClient(timeout=10) as http:
        anonymous = await http.get(f"{keyed_server.base_url}/sse")
        wrong = await http.post(f"{keyed_server.base_url}/messages/?session_id=x", json={},
                                headers={"Authorization": "Bearer not-a-key-00000000000000"})
    assert anonymous.status_code == 401
    assert wrong.status_code == 401
    async with sse_session(f"{keyed_server.base_url}/sse", READER) as reader:
        refused = await reader.call_tool("amfs_forget", {"entity_path": "svc", "key": "k"})
        assert refused.is_error and "read-only" in refused.content[0].text


def test_cli_refuses_a_non_loopback_bind_without_keys(stdio_command: Any) -> None:
    completed = subprocess.run(
        [stdio_command.command, *stdio_command.args,
         "serve", "--transport", "http", "--host", "0.0.0.0", "--port", "0"],
        env=stdio_command.env, capture_output=True, text=True, timeout=60,
    )
    assert completed.returncode == 1
    assert "refusing to serve http on 0.0.0.0" in completed.stderr and "AMFS_API_KEYS" in completed.stderr
    assert completed.stdout == ""
