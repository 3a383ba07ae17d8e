"""API keys (format, 401, read-only and entity-prefix scopes), the Origin/Host guard, and the refusal to
bind beyond loopback without keys. HTTP is driven in-process through the real ASGI app."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.utilities.asgi_transport import StreamingASGITransport

from amfs_server.core.errors import ValidationError
from amfs_server.server.app import create_app, http_options, run_server
from amfs_server.server.auth import ApiKey, parse_allowed_origins, parse_api_keys
from amfs_server.server.composition import build_service
from amfs_server.server.settings import Settings, load_settings

ADMIN = "admin-key-0000000000000001"
READER = "reader-key-000000000000002"
TEAM_A = "team-a-key-000000000000003"
TEAM_A_READER = "team-a-ro-key-0000000000004"
KEYS = f"{ADMIN},{READER}:ro,{TEAM_A}:rw@team-a,{TEAM_A_READER}:ro@team-a"
BASE = "http://127.0.0.1"
INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


# -- the key format -----------------------------------------------------------------------------


def test_api_keys_parse_plain_read_only_and_prefix_scoped_entries() -> None:
    keys = parse_api_keys(f" {ADMIN} , {READER}:ro,{TEAM_A}:rw@team-a/payments ")
    assert keys == [
        ApiKey(ADMIN, "rw", None), ApiKey(READER, "ro", None), ApiKey(TEAM_A, "rw", "team-a/payments"),
    ]
    assert parse_api_keys(None) == [] and parse_api_keys("  ") == []


def test_api_keys_can_come_from_a_json_file(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps([{"key": ADMIN}, {"key": READER, "scope": "ro@svc"}]))
    assert parse_api_keys(f"@{path}") == [ApiKey(ADMIN, "rw", None), ApiKey(READER, "ro", "svc")]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("short", "at least 16 characters"),
        (f"{ADMIN}:admin", "must be rw, ro"),
        (f"{ADMIN}:ro@a//b", "empty segment"),
        (f"{ADMIN},{ADMIN}:ro", "same key twice"),
        ("@/nonexistent/keys.json", "cannot read it as JSON"),
    ],
)
def test_malformed_api_keys_are_refused_with_the_reason_and_without_echoing_the_key(text: str, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason) as error:
        parse_api_keys(text)
    assert ADMIN not in str(error.value)


def test_allowed_origins_are_normalized_and_checked() -> None:
    assert parse_allowed_origins("https://App.Example.com, http://tools.local:8080") == [
        "https://app.example.com", "http://tools.local:8080",
    ]
    with pytest.raises(ValidationError, match="not an origin"):
        parse_allowed_origins("app.example.com")


# -- binding ------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["http", "sse"])
def test_serving_beyond_loopback_without_api_keys_refuses_to_start_with_the_reason(
    tmp_path: Path, transport: str
) -> None:
    settings = load_settings({}, data_dir=tmp_path, embedder="none")
    with pytest.raises(SystemExit) as refused:
        run_server(settings, transport=transport, host="0.0.0.0", port=1)
    assert "refusing to serve" in str(refused.value.code) and "AMFS_API_KEYS" in str(refused.value.code)
    assert not (tmp_path / "amfs.db").exists()


def test_malformed_api_keys_stop_the_server_before_it_binds(tmp_path: Path) -> None:
    settings = load_settings({}, data_dir=tmp_path, embedder="none", api_keys="tooshort")
    with pytest.raises(SystemExit) as refused:
        run_server(settings, transport="http", host="127.0.0.1", port=1)
    assert "at least 16 characters" in str(refused.value.code)


# -- HTTP, in process ---------------------------------------------------------------------------


@asynccontextmanager
async def http_app(settings: Settings, keys: str | None = KEYS, origins: tuple[str, ...] = ()) -> AsyncIterator[Any]:
    app = create_app(build_service(settings), settings, api_keys=parse_api_keys(keys))
    asgi = app.http_app(transport="http", **http_options("127.0.0.1", origins))
    async with asgi.router.lifespan_context(asgi):
        yield asgi


def raw_client(asgi: Any) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=StreamingASGITransport(asgi), base_url=BASE)


def mcp_client(asgi: Any, token: str | None) -> Client:
    def factory(headers: Any = None, timeout: Any = None, auth: Any = None, **_: Any) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(
            transport=StreamingASGITransport(asgi), base_url=BASE, headers=headers, timeout=timeout, auth=auth
        )

    return Client(StreamableHttpTransport(f"{BASE}/mcp", auth=token, httpx_client_factory=factory))


async def call(asgi: Any, token: str, tool: str, arguments: dict[str, Any]) -> Any:
    async with mcp_client(asgi, token) as client:
        return await client.call_tool(tool, arguments, raise_on_error=False)


async def entry_keys(asgi: Any) -> list[str]:
    listing = await call(asgi, ADMIN, "amfs_list", {})
    return [entry["entry_key"] for entry in listing.structured_content["entries"]]


@pytest.mark.parametrize("token", [None, "wrong-key-00000000000000000"])
async def test_http_without_a_valid_bearer_token_gets_401(settings: Settings, token: str | None) -> None:
    async with http_app(settings) as asgi, raw_client(asgi) as http:
        headers = MCP_HEADERS | ({"Authorization": f"Bearer {token}"} if token else {})
        response = await http.post("/mcp", json=INITIALIZE, headers=headers)
    assert response.status_code == 401
    assert "Bearer" in response.headers.get("www-authenticate", "")


async def test_http_with_a_valid_key_serves_the_tools(settings: Settings) -> None:
    async with http_app(settings) as asgi:
        async with mcp_client(asgi, ADMIN) as client:
            await client.call_tool("amfs_write", {"entity_path": "svc", "key": "k", "value": "v"})
            read = await client.call_tool("amfs_read", {"entity_path": "svc", "key": "k"})
    assert read.structured_content["value"] == "v"


async def test_a_read_only_key_can_read_but_every_write_tool_is_refused_and_nothing_is_written(
    settings: Settings,
) -> None:
    async with http_app(settings) as asgi:
        await call(asgi, ADMIN, "amfs_write", {"entity_path": "svc", "key": "k", "value": "v"})
        read = await call(asgi, READER, "amfs_read", {"entity_path": "svc", "key": "k"})
        assert read.structured_content["value"] == "v"
        assert (await call(asgi, READER, "amfs_search", {})).structured_content["count"] == 1
        for tool, arguments in [
            ("amfs_write", {"entity_path": "svc", "key": "new", "value": 1}),
            ("amfs_forget", {"entity_path": "svc", "key": "k"}),
            ("amfs_commit_outcome", {"outcome_ref": "r", "outcome_type": "failure", "causal_entry_keys": ["svc/k"]}),
        ]:
            refused = await call(asgi, READER, tool, arguments)
            assert refused.is_error and "read-only" in refused.content[0].text, tool
        assert await entry_keys(asgi) == ["svc/k"]
        history = await call(asgi, ADMIN, "amfs_history", {"entity_path": "svc", "key": "k"})
        assert history.structured_content["versions"][0]["confidence"] == 1.0  # no outcome was applied
        await call(asgi, READER, "amfs_retrieve", {"query": "v"})
        # the reader's read and retrieve left no trace: no recall count (tiers follow it), nothing to charge
        assert history.structured_content["versions"][0]["recall_count"] == 0


async def test_a_prefix_scoped_key_reads_and_writes_only_under_its_prefix(settings: Settings) -> None:
    async with http_app(settings) as asgi:
        await call(asgi, ADMIN, "amfs_write", {"entity_path": "team-b", "key": "secret", "value": "b"})
        inside = await call(asgi, TEAM_A, "amfs_write", {"entity_path": "team-a/api", "key": "k", "value": "a"})
        assert not inside.is_error
        for tool, arguments in [
            ("amfs_write", {"entity_path": "team-b", "key": "x", "value": 1}),
            ("amfs_write", {"entity_path": "team-ab", "key": "x", "value": 1}),  # a prefix is a path, not a string
            ("amfs_read", {"entity_path": "team-b", "key": "secret"}),
            ("amfs_search", {"entity_path": "team-b"}),
            ("amfs_history", {"entity_path": "team-b", "key": "secret"}),
            ("amfs_forget", {"entity_path": "team-b", "key": "secret"}),
            ("amfs_commit_outcome", {"outcome_ref": "r", "outcome_type": "failure"}),
            ("amfs_commit_outcome",
             {"outcome_ref": "r", "outcome_type": "failure", "causal_entry_keys": ["team-b/secret"]}),
            # the text forms the tool accepts are scoped like the list they stand for
            ("amfs_commit_outcome", {"outcome_ref": "r", "outcome_type": "failure", "causal_entry_keys": "team-b/secret"}),
            ("amfs_commit_outcome",
             {"outcome_ref": "r", "outcome_type": "failure", "causal_entry_keys": '["team-a/api/k", "team-b/secret"]'}),
        ]:
            refused = await call(asgi, TEAM_A, tool, arguments)
            assert refused.is_error and "limited to entity_path 'team-a'" in refused.content[0].text, (tool, arguments)
            said = "nothing was read" if tool in {"amfs_read", "amfs_search", "amfs_history"} else "nothing was written"
            assert said in refused.content[0].text, (tool, refused.content[0].text)
        # filters left out are narrowed to the prefix
        listing = await call(asgi, TEAM_A, "amfs_list", {})
        assert [e["entry_key"] for e in listing.structured_content["entries"]] == ["team-a/api/k"]
        searched = await call(asgi, TEAM_A, "amfs_search", {})
        assert [e["entry_key"] for e in searched.structured_content["entries"]] == ["team-a/api/k"]
        outcome = await call(
            asgi, TEAM_A, "amfs_commit_outcome",
            {"outcome_ref": "r", "outcome_type": "failure", "causal_entry_keys": ["team-a/api/k"]},
        )
        assert not outcome.is_error
        for text_form in ("team-a/api/k", '["team-a/api/k"]'):
            outcome = await call(
                asgi, TEAM_A, "amfs_commit_outcome",
                {"outcome_ref": f"r-{text_form}", "outcome_type": "success", "causal_entry_keys": text_form},
            )
            assert not outcome.is_error, outcome.content[0].text
        assert sorted(await entry_keys(asgi)) == ["team-a/api/k", "team-b/secret"]


async def test_a_scoped_keys_odd_arguments_get_the_tools_own_refusal_and_a_short_quote(settings: Settings) -> None:
    """A path of the wrong type was called "out of scope" (sending the client after the wrong fix), a 200,000-character
    one was echoed whole, and causal_entry_keys nested 5,000 deep was an internal error (red-team repros)."""
    async with http_app(settings) as asgi:
        for tool, arguments, said in [
            ("amfs_list", {"entity_path": 5}, "valid string"),
            ("amfs_retrieve", {"query": "q", "entity_path": ["team-a"]}, "valid string"),
            ("amfs_commit_outcome", {"outcome_ref": "r", "outcome_type": "failure", "causal_entry_keys": [5]},
             "valid string"),
            ("amfs_commit_outcome",
             {"outcome_ref": "r", "outcome_type": "failure", "causal_entry_keys": "[" * 5000 + "]" * 5000},
             "valid array"),
        ]:
            refused = await call(asgi, TEAM_A, tool, arguments)
            text = refused.content[0].text
            assert refused.is_error and said in text and "out of scope" not in text, (tool, text)
            assert "Internal error" not in text
        long = await call(asgi, TEAM_A, "amfs_list", {"entity_path": "x" * 200_000})
        text = long.content[0].text
        assert "out of scope" in text and "(200,000 characters)" in text and len(text) < 400
        assert await entry_keys(asgi) == []


async def test_a_read_only_prefix_key_combines_both_limits(settings: Settings) -> None:
    async with http_app(settings) as asgi:
        await call(asgi, ADMIN, "amfs_write", {"entity_path": "team-a", "key": "k", "value": 1})
        assert not (await call(asgi, TEAM_A_READER, "amfs_read", {"entity_path": "team-a", "key": "k"})).is_error
        refused = await call(asgi, TEAM_A_READER, "amfs_write", {"entity_path": "team-a", "key": "k2", "value": 1})
        assert refused.is_error and "read-only" in refused.content[0].text


async def test_a_prefix_scoped_key_retrieves_only_under_its_prefix(settings: Settings) -> None:
    async with http_app(settings) as asgi:
        async with mcp_client(asgi, ADMIN) as admin:
            if "amfs_retrieve" not in {tool.name for tool in await admin.list_tools()}:
                pytest.skip("MemoryService.retrieve is not there yet")
            await admin.call_tool("amfs_write", {"entity_path": "team-a", "key": "retry", "value": "retry payments"})
            await admin.call_tool("amfs_write", {"entity_path": "team-b", "key": "retry", "value": "retry payments"})
        found = await call(asgi, TEAM_A, "amfs_retrieve", {"query": "retry payments"})
        assert [r["entry_key"] for r in found.structured_content["results"]] == ["team-a/retry"]
        refused = await call(asgi, TEAM_A, "amfs_retrieve", {"query": "retry", "entity_path": "team-b"})
        assert refused.is_error


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        ("http://evil.example", 403),
        ("null", 403),
        ("http://localhost:6274", 401),  # allowed through to auth (the Inspector's own origin)
        ("http://127.0.0.1:3000", 401),
        ("https://app.example.com", 401),  # listed in AMFS_ALLOWED_ORIGINS
    ],
)
async def test_origin_header_is_validated_before_anything_else(settings: Settings, origin: str, status: int) -> None:
    async with http_app(settings, origins=("https://app.example.com",)) as asgi, raw_client(asgi) as http:
        response = await http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS | {"Origin": origin})
    assert response.status_code == status
    if status == 403:
        assert "AMFS_ALLOWED_ORIGINS" in response.text


async def test_a_loopback_server_refuses_a_rebound_host_header(settings: Settings) -> None:
    async with http_app(settings, keys=None) as asgi, raw_client(asgi) as http:
        rebound = await http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS | {"Host": "attacker.example:8000"})
        local = await http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS | {"Host": "localhost:8000"})
    assert rebound.status_code == 421
    assert local.status_code == 200


async def test_sessionless_http_clients_must_name_causal_entry_keys(settings: Settings) -> None:
    async with http_app(settings) as asgi, mcp_client(asgi, ADMIN) as client:  # fastmcp negotiates 2026-07-28
        assert client.initialize_result is None  # no handshake: no MCP session to track reads in
        await client.call_tool("amfs_write", {"entity_path": "svc", "key": "k", "value": 1})
        await client.call_tool("amfs_read", {"entity_path": "svc", "key": "k"})
        unlinked = await client.call_tool(
            "amfs_commit_outcome", {"outcome_ref": "o", "outcome_type": "failure"}, raise_on_error=False
        )
        assert unlinked.is_error and "causal_entry_keys" in unlinked.content[0].text
        linked = await client.call_tool(
            "amfs_commit_outcome", {"outcome_ref": "o", "outcome_type": "failure", "causal_entry_keys": ["svc/k"]}
        )
        assert linked.structured_content["updated"][0]["entry_key"] == "svc/k"
