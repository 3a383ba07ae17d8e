"""`GET /health`: 200 without a key, nothing but status and version, and still behind the Host/Origin guard.
In process through the real ASGI apps (streamable HTTP and SSE), and once against a started server."""

from __future__ import annotations

import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp.utilities.asgi_transport import StreamingASGITransport

from amfs_server.core.models import AMFS_VERSION
from amfs_server.server.app import create_app, http_options
from amfs_server.server.auth import parse_api_keys
from amfs_server.server.composition import build_service
from amfs_server.server.settings import Settings

KEY = "health-test-key-0000000001"


@asynccontextmanager
async def served(settings: Settings, transport: str, bind: str = "127.0.0.1") -> AsyncIterator[httpx2.AsyncClient]:
    app = create_app(build_service(settings), settings, api_keys=parse_api_keys(KEY))
    asgi = app.http_app(transport=transport, **http_options(bind))
    async with asgi.router.lifespan_context(asgi):
        async with httpx2.AsyncClient(transport=StreamingASGITransport(asgi), base_url="http://127.0.0.1") as http:
            yield http


@pytest.mark.parametrize("transport", ["http", "sse"])
async def test_health_answers_without_a_key_with_status_and_version_only(settings: Settings, transport: str) -> None:
    async with served(settings, transport) as http:
        health = await http.get("/health")
        protected = await http.get("/sse" if transport == "sse" else "/mcp")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "version": AMFS_VERSION}
    assert protected.status_code == 401  # the key is still required everywhere else


async def test_health_still_obeys_the_host_and_origin_guard(settings: Settings) -> None:
    async with served(settings, "http") as http:
        rebound = await http.get("/health", headers={"Host": "attacker.example:8000"})
        foreign = await http.get("/health", headers={"Origin": "https://evil.example"})
    assert rebound.status_code == 421 and foreign.status_code == 403


async def test_health_takes_only_get(settings: Settings) -> None:
    async with served(settings, "http") as http:
        assert (await http.post("/health")).status_code == 405


def test_a_started_server_answers_health_over_the_network(launch_server: Any, tmp_path: Path) -> None:
    server = launch_server("http", tmp_path / "data", AMFS_API_KEYS=KEY)
    try:
        with urllib.request.urlopen(f"{server.base_url}/health", timeout=10) as response:  # as the HEALTHCHECK does
            assert response.status == 200
            assert response.read() == b'{"status":"ok","version":"' + AMFS_VERSION.encode() + b'"}'
    finally:
        server.stop()
