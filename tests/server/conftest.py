"""Fixtures for the MCP server tests: an app over a temporary SQLite store (no embedder) and clients.

Real servers are started the way the latency benchmark starts them (`session_bench.mcp_latency`):
on port 0, reading the bound port from the log, so there are no port races and every wait is bounded.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastmcp import Client, FastMCP

from amfs_server.server.app import create_app
from amfs_server.server.composition import build_service
from amfs_server.server.settings import Settings, load_settings
from amfs_server.session_bench.mcp_latency import HttpServer, server_env, spawn_http_server

# `amfs-server` with nothing importable outside the default install (see default_install.py).
SERVER_COMMAND = [sys.executable, str(Path(__file__).with_name("default_install.py"))]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings({}, data_dir=tmp_path, embedder="none")


@pytest.fixture
def app(settings: Settings) -> FastMCP:
    return create_app(build_service(settings), settings)


@pytest.fixture
async def client(app: FastMCP) -> AsyncIterator[Client]:
    async with Client(app) as connected:
        yield connected


@pytest.fixture(scope="session")
def launch_server() -> Callable[..., HttpServer]:
    """`launch_server(transport, data_dir, **env)`: a started `amfs-server serve`; the caller stops it."""

    def launch(transport: str, data_dir: Path, **env: str) -> HttpServer:
        return spawn_http_server(transport, server_env(data_dir, AMFS_EMBEDDER="none", **env), timeout_s=60,
                                 program=SERVER_COMMAND)

    return launch


@dataclass(frozen=True)
class StdioCommand:
    command: str
    args: list[str]
    env: dict[str, str]


@pytest.fixture
def stdio_command(tmp_path: Path) -> StdioCommand:
    """How to start `amfs-server` (no arguments: stdio) on a temporary store."""
    env = server_env(tmp_path / "stdio-data", AMFS_EMBEDDER="none")
    return StdioCommand(SERVER_COMMAND[0], SERVER_COMMAND[1:], env)
