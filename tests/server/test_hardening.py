"""What the red team's findings now get: outcome refs scoped per key prefix, identity from the key, exports
confined to a scoped key's prefix and folder, per-key session and call limits, slow connections cut off,
logs that do not flood, and a graceful SIGTERM. HTTP is driven in process through the real ASGI app, except
where a real server process is the point (slow sockets, signals); those are loopback only and bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError
from mcp_types import Implementation

from amfs_server.core.models import Actor
from amfs_server.core.service import MemoryService, WriteRequest
from amfs_server.server.app import create_app, http_options
from amfs_server.server.auth import parse_api_keys
from amfs_server.server.composition import build_service
from amfs_server.server.limits import CallLimiter, RepeatFilter, ServerLimits
from amfs_server.server.settings import Settings, load_settings

from .test_auth import (
    ADMIN, INITIALIZE, KEYS, MCP_HEADERS, TEAM_A, TEAM_A_READER, call, http_app, mcp_client, raw_client,
)

TEAM_B = "team-b-key-000000000000005"
OTHER = "other-user-key-00000000006"
ALL_KEYS = f"{KEYS},{TEAM_B}:rw@team-b,{OTHER}"


# -- outcome refs (finding 4) -------------------------------------------------------------------


async def test_outcome_refs_of_two_scopes_never_meet_and_unscoped_refs_stay_global(service: MemoryService) -> None:
    seed = Actor("seed", "seed")
    await service.write_many(seed, [WriteRequest("team-a", "x", 1), WriteRequest("team-b", "y", 2)])
    team_a, team_b = Actor("a", "sa", scope="team-a"), Actor("b", "sb", scope="team-b")

    first = await service.commit_outcome(team_a, "INC-1", "failure", ["team-a/x"])
    assert first.outcome_ref == "INC-1" and not first.already_applied
    # team-b's outcome with the same ref applies to its own entry and learns nothing about team-a's
    second = await service.commit_outcome(team_b, "INC-1", "failure", ["team-b/y"])
    assert not second.already_applied and [e.entry_key for e in second.effects] == ["team-b/y"]
    again = await service.commit_outcome(team_b, "INC-1", "failure", ["team-b/y"])
    assert again.already_applied and [e.entry_key for e in again.effects] == ["team-b/y"]

    # unscoped callers keep one global namespace, and can name a scope's ref in full
    admin = Actor("admin", "s0")
    assert not (await service.commit_outcome(admin, "INC-1", "success", ["team-a/x"])).already_applied
    assert (await service.commit_outcome(admin, "@team-a#INC-1", "failure", ["team-a/x"])).already_applied
    refs = sorted(r.outcome_ref for r in await service.outcome_records())
    assert refs == ["@team-a#INC-1", "@team-b#INC-1", "INC-1"]


async def test_a_ref_an_unscoped_key_filed_in_a_scope_does_not_reveal_entries_outside_it(
    service: MemoryService,
) -> None:
    seed = Actor("seed", "seed")
    await service.write_many(seed, [WriteRequest("team-a", "x", 1), WriteRequest("team-b", "y", 2)])
    await service.commit_outcome(Actor("admin", "s0"), "@team-a#INC-2", "failure", ["team-a/x", "team-b/y"])
    seen = await service.commit_outcome(Actor("a", "sa", scope="team-a"), "INC-2", "failure", ["team-a/x"])
    assert seen.already_applied and [e.entry_key for e in seen.effects] == ["team-a/x"]


async def test_prefix_keys_reusing_another_teams_outcome_ref_over_http_apply_their_own(settings: Settings) -> None:
    async with http_app(settings, ALL_KEYS) as asgi:
        await call(asgi, ADMIN, "amfs_write", {"entity_path": "team-a", "key": "x", "value": 1})
        await call(asgi, ADMIN, "amfs_write", {"entity_path": "team-b", "key": "y", "value": 2})
        outcome = {"outcome_ref": "deploy-7", "outcome_type": "failure"}
        a = await call(asgi, TEAM_A, "amfs_commit_outcome", outcome | {"causal_entry_keys": ["team-a/x"]})
        b = await call(asgi, TEAM_B, "amfs_commit_outcome", outcome | {"causal_entry_keys": ["team-b/y"]})
        assert a.structured_content["outcome_ref"] == b.structured_content["outcome_ref"] == "deploy-7"
        assert b.structured_content["already_applied"] is False
        assert [e["entry_key"] for e in b.structured_content["updated"]] == ["team-b/y"]
        history = await call(asgi, ADMIN, "amfs_history", {"entity_path": "team-b", "key": "y"})
        assert history.structured_content["versions"][0]["confidence"] > 0.5  # the failure raised it


# -- identity (finding 5) -----------------------------------------------------------------------


def named_client(asgi: object, token: str, name: str) -> Client:
    client = mcp_client(asgi, token)
    client._client_info = Implementation(name=name, version="1")  # what a hostile client would claim
    return client


async def test_with_api_keys_the_user_is_the_key_not_the_name_the_client_claims(settings: Settings) -> None:
    async with http_app(settings, ALL_KEYS) as asgi:
        async with named_client(asgi, ADMIN, "alice") as alice:
            await alice.call_tool("amfs_set_preference", {"category": "style", "key": "tabs", "value": "spaces"})
            own = await alice.call_tool("amfs_get_preferences", {"min_confidence": 0})
            assert [p["key"] for p in own.structured_content["preferences"]] == ["tabs"]
        async with named_client(asgi, OTHER, "alice") as impostor:
            stolen = await impostor.call_tool("amfs_get_preferences", {"min_confidence": 0})
            assert stolen.structured_content["preferences"] == []
            await impostor.call_tool("amfs_set_preference", {"category": "style", "key": "tabs", "value": "tabs"})
        async with named_client(asgi, ADMIN, "bob") as admin_again:  # a new name does not change who the key is
            prefs = (await admin_again.call_tool("amfs_get_preferences", {"min_confidence": 0})).structured_content
            assert [p["value"] for p in prefs["preferences"]] == ["spaces"]


async def test_a_key_file_can_name_the_identity_a_key_acts_as(settings: Settings, tmp_path: Path) -> None:
    from amfs_server.server.auth import parse_api_keys

    path = tmp_path / "keys.json"
    path.write_text(json.dumps([{"key": ADMIN, "agent": "ci-bot"}, {"key": OTHER}]))
    keys = parse_api_keys(f"@{path}")
    assert [k.agent_id for k in keys] == ["ci-bot", keys[1].key_id]
    assert keys[1].key_id.startswith("key-") and OTHER not in keys[1].key_id


# -- training export under a prefix key (findings 1 and 6) ----------------------------------------


async def test_a_prefix_key_exports_only_its_own_teams_data_into_its_own_folder(settings: Settings) -> None:
    from amfs_server.server.composition import build_service

    seeding = build_service(settings)  # one session that read both teams' entries, on the store the server opens
    await seeding.open()
    seed, session = Actor("seed", "seed"), Actor("agent", "mixed")
    await seeding.write_many(seed, [
        WriteRequest("team-a", "x", "a-x"), WriteRequest("team-a", "y", "a-y"), WriteRequest("team-b", "s", "b-secret"),
    ])
    for path, key in [("team-a", "x"), ("team-a", "y"), ("team-b", "s")]:
        await seeding.read(session, path, key)
    await seeding.write(session, WriteRequest("team-a", "decision", "use x"))
    await seeding.commit_outcome(session, "OK-1", "success", ["team-a/x", "team-a/y", "team-b/s"])
    await seeding.close()

    async with http_app(settings, ALL_KEYS) as asgi:
        admin = await call(asgi, ADMIN, "amfs_export_training_data", {"format": "sft", "entity_path": "team-a"})
        scoped = await call(asgi, TEAM_A, "amfs_export_training_data", {"format": "sft"})
        assert "a-x" in json.dumps(scoped.structured_content) and "b-secret" not in json.dumps(scoped.structured_content)
        assert "b-secret" not in json.dumps(admin.structured_content)  # the filter is the boundary for everyone
        written = [
            (await call(asgi, token, "amfs_export_training_data", {"format": "sft", "output_path": "t.jsonl"}))
            .structured_content["output_path"]
            for token in (TEAM_A, ADMIN)
        ]
    assert len(set(written)) == 2 and all(Path(p).name == "t.jsonl" for p in written)
    assert "b-secret" not in Path(written[0]).read_text()


# -- sessions (finding 3) -----------------------------------------------------------------------


@asynccontextmanager
async def limited_app(settings: Settings, limits: ServerLimits) -> AsyncIterator[Any]:
    app = create_app(build_service(settings), settings, api_keys=parse_api_keys(ALL_KEYS))
    asgi = app.http_app(transport="http", **http_options("127.0.0.1", (), limits))
    async with asgi.router.lifespan_context(asgi):
        yield asgi


async def open_session(http: httpx2.AsyncClient, token: str) -> httpx2.Response:
    return await http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS | {"Authorization": f"Bearer {token}"})


async def post(http: httpx2.AsyncClient, token: str, session_id: str, message: dict[str, Any]) -> httpx2.Response:
    headers = MCP_HEADERS | {
        "Authorization": f"Bearer {token}", "Mcp-Session-Id": session_id, "Mcp-Protocol-Version": "2025-11-25",
    }
    return await http.post("/mcp", json=message, headers=headers)


async def test_a_key_at_its_session_limit_is_refused_while_other_keys_still_connect(settings: Settings) -> None:
    limits = ServerLimits(sessions_per_key=3, unused_session_expiry_s=60)
    async with limited_app(settings, limits) as asgi, raw_client(asgi) as http:
        opened = [await open_session(http, TEAM_A_READER) for _ in range(3)]
        assert [r.status_code for r in opened] == [200, 200, 200]
        refused = await open_session(http, TEAM_A_READER)
        assert refused.status_code == 429 and "Too many open sessions for this API key" in refused.text
        assert (await open_session(http, ADMIN)).status_code == 200
        # closing one makes room again
        closing = opened[0].headers["mcp-session-id"]
        headers = {"Authorization": f"Bearer {TEAM_A_READER}", "Mcp-Session-Id": closing,
                   "Mcp-Protocol-Version": "2025-11-25"}
        assert (await http.delete("/mcp", headers=headers)).status_code == 200
        assert (await open_session(http, TEAM_A_READER)).status_code == 200


async def test_sessions_that_never_did_anything_expire_quickly_and_used_ones_stay(settings: Settings) -> None:
    # 2 s, not less: opening the four sessions must finish before the first expires, also on a loaded CI machine
    # (at 0.5 s one run here saw a session expire before the fifth was refused).
    limits = ServerLimits(sessions_per_key=4, unused_session_expiry_s=2.0)
    async with limited_app(settings, limits) as asgi, raw_client(asgi) as http:
        ids = [(await open_session(http, TEAM_A_READER)).headers["mcp-session-id"] for _ in range(4)]
        used = ids[0]
        await post(http, TEAM_A_READER, used, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        listed = await post(http, TEAM_A_READER, used, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert listed.status_code == 200
        assert (await open_session(http, TEAM_A_READER)).status_code == 429
        await asyncio.sleep(3.0)
        for unused in ids[1:]:
            gone = await post(http, TEAM_A_READER, unused, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
            assert gone.status_code == 404  # expired and discarded by the SDK
        again = await post(http, TEAM_A_READER, used, {"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
        assert again.status_code == 200 and "amfs_read" in again.text
        assert (await open_session(http, TEAM_A_READER)).status_code == 200


async def test_a_key_at_its_sse_stream_limit_is_refused_while_other_keys_still_connect(settings: Settings) -> None:
    app = create_app(build_service(settings), settings, api_keys=parse_api_keys(ALL_KEYS))
    asgi = app.http_app(transport="sse", **http_options("127.0.0.1", (), ServerLimits(sessions_per_key=1)))

    def bearer(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}

    async with asyncio.timeout(30), asgi.router.lifespan_context(asgi), raw_client(asgi) as http:
        async with http.stream("GET", "/sse", headers=bearer(TEAM_A_READER)) as first:
            assert first.status_code == 200
            second = await http.get("/sse", headers=bearer(TEAM_A_READER))
            assert second.status_code == 429 and "Too many open SSE streams" in second.text
            async with http.stream("GET", "/sse", headers=bearer(ADMIN)) as other:
                assert other.status_code == 200


# -- calls and responses (finding 8) --------------------------------------------------------------


async def test_a_key_gets_a_bounded_number_of_calls_in_progress_and_other_keys_are_not_held_up() -> None:
    limiter = CallLimiter(ServerLimits(calls_per_key=2, call_queue_wait_s=0.2))
    async with limiter.slot("key-a"), limiter.slot("key-a"):
        with pytest.raises(ToolError, match="already has 2 calls in progress"):
            async with limiter.slot("key-a"):
                pass
        async with limiter.slot("key-b"):
            pass
    async with limiter.slot("key-a"):  # released again
        pass


async def test_a_tool_result_over_the_response_limit_is_refused_with_how_to_ask_for_less(tmp_path: Path) -> None:
    settings = load_settings({}, data_dir=tmp_path, embedder="none", max_response_bytes=4096)
    async with http_app(settings, ALL_KEYS) as asgi:
        await call(asgi, ADMIN, "amfs_write", {"entity_path": "svc", "key": "big", "value": "x" * 5000})
        await call(asgi, ADMIN, "amfs_write", {"entity_path": "svc", "key": "small", "value": "x"})
        big = await call(asgi, ADMIN, "amfs_read", {"entity_path": "svc", "key": "big"})
        assert big.is_error and "response limit" in big.content[0].text and "smaller limit" in big.content[0].text
        small = await call(asgi, ADMIN, "amfs_read", {"entity_path": "svc", "key": "small"})
        assert not small.is_error


def test_repeated_log_messages_are_collapsed_into_a_count() -> None:
    now = [0.0]
    repeats = RepeatFilter(clock=lambda: now[0])

    def record(message: str) -> logging.LogRecord:
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, message, None, sys.exc_info())

    passed = sum(repeats.filter(record("socket.accept() out of system resource")) for _ in range(10_000))
    assert passed == 5
    assert repeats.filter(record("another message"))  # a different message has its own budget
    now[0] += 61
    summary = record("socket.accept() out of system resource")
    assert repeats.filter(summary) and "9995 more like this" in summary.getMessage()


# -- real servers: slow connections and shutdown (findings 8 and 13) ------------------------------


def test_connections_that_never_finish_their_headers_are_closed_and_others_are_served(
    launch_server: Any, tmp_path: Path
) -> None:
    server = launch_server("http", tmp_path / "data", AMFS_HEADER_TIMEOUT_S="1")
    sockets = []
    try:
        for _ in range(50):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # and then nothing
            sockets.append(sock)
        time.sleep(2.5)
        closed = 0
        for sock in sockets:
            sock.settimeout(2)
            with contextlib.suppress(OSError):
                closed += sock.recv(1024) == b""
        assert closed == len(sockets)
        response = httpx2.post(f"{server.base_url}/mcp", json=INITIALIZE, headers=MCP_HEADERS, timeout=10)
        assert response.status_code == 200
    finally:
        for sock in sockets:
            sock.close()
        server.stop()
    assert sum(len(line) for line in server.log) < 50_000  # no traceback per connection


def test_sigterm_closes_the_store_cleanly(launch_server: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = launch_server("http", data)
    try:
        initialized = httpx2.post(f"{server.base_url}/mcp", json=INITIALIZE, headers=MCP_HEADERS, timeout=10)
        session = {"Mcp-Session-Id": initialized.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-11-25"}
        write = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                 "params": {"name": "amfs_write", "arguments": {"entity_path": "svc", "key": "k", "value": 1}}}
        written = httpx2.post(f"{server.base_url}/mcp", json=write, headers=MCP_HEADERS | session, timeout=10)
        assert written.status_code == 200 and '"version":1' in written.text.replace(" ", "")
        assert (data / "amfs.db-wal").exists()  # the write sits in the WAL until the store is closed
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=30)
    finally:
        server.stop()
    time.sleep(0.5)  # the log pump thread drains the last lines
    assert any("Stopped: the store is closed" in line for line in server.log), "".join(server.log[-20:])
    assert not (data / "amfs.db-wal").exists()  # checkpointed and removed by the last close
    with sqlite3.connect(data / "amfs.db") as db:
        assert db.execute("SELECT count(*) FROM entries").fetchone()[0] == 1
