"""The MCP server: `create_app` wraps a MemoryService in a FastMCP app (tools, lifespan, key scopes);
`run_server` is the composition root behind `amfs-server serve` (stdio, SSE at /sse, streamable HTTP
at /mcp).

On stdio nothing but protocol reaches stdout: no banner, no update check, logs go to stderr.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastmcp import FastMCP
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse

from ..core.errors import AmfsError, ValidationError
from ..core.models import AMFS_VERSION
from ..core.service import MemoryService
from ..tools import ActorResolver, ToolErrorMiddleware, register_tools
from ..tools.learning_tools import register_learning_tools
from ..tools.ml_tools import register_ml_tools
from .auth import (
    ApiKey,
    ApiKeyVerifier,
    KeyScopeMiddleware,
    current_key,
    OriginGuard,
    is_loopback,
    parse_allowed_origins,
    parse_api_keys,
)
from .composition import Services, build_services
from .limits import CallLimiter, ServerLimits, SessionGuard, raise_open_file_limit
from .logs import configure_logging, log_level_number, uvicorn_log_config
from .json_guard import JsonRpcGuard
from .settings import Settings

logger = logging.getLogger("amfs_server.server")

SERVER_NAME = "amfs"
INSTRUCTIONS = (
    "Shared, versioned memory whose confidence learns from outcomes. Before a task, amfs_retrieve what is "
    "known; amfs_write what you learn; when the task's result is known, amfs_commit_outcome."
)
Transport = Literal["stdio", "sse", "http"]


def create_app(
    service: MemoryService, settings: Settings, *, api_keys: Sequence[ApiKey] | None = None,
    services: Services | None = None,
) -> FastMCP:
    """The FastMCP app over `service`; its lifespan opens and closes it and the services beside it.

    `api_keys` defaults to those in `settings.api_keys`; with keys, SSE and HTTP require a bearer token.
    `services` are the ones `build_services` made around `service` (built here when not given).
    """
    keys = parse_api_keys(settings.api_keys) if api_keys is None else list(api_keys)
    services = services or build_services(settings, memory=service, ml=True)
    learning, ml, worker = services.learning, services.ml, services.worker
    assert ml is not None, "the MCP server's services include the ML service"

    @asynccontextmanager
    async def lifespan(_: FastMCP) -> AsyncIterator[dict[str, Any]]:
        await services.open()
        warm_up = _warm_up_embedder(service)
        try:
            yield {}
        finally:
            if warm_up is not None:
                await warm_up  # never raises: warm() logs its own failure
            await services.close()
            logger.info("Stopped: the store is closed")

    mcp = FastMCP(
        SERVER_NAME,
        instructions=INSTRUCTIONS,
        version=AMFS_VERSION,
        auth=ApiKeyVerifier(keys) if keys else None,
        lifespan=lifespan,
        middleware=[ToolErrorMiddleware(), KeyScopeMiddleware(CallLimiter(settings.limits))],
        mask_error_details=True,
        strict_input_validation=True,  # "0.5" is not a number; list parameters opt into leniency (tools/_params)
        on_duplicate="error",
    )
    actors = ActorResolver(settings.agent_id, current_key)  # one resolver, so learning sees the same session ids
    register_tools(mcp, service, actors)
    add_health_route(mcp)
    register_ml_tools(mcp, ml, actors)
    if learning is not None:
        register_learning_tools(mcp, learning, actors)
    if worker is not None:
        from ..tools.answer_tools import register_answer_tools

        register_answer_tools(mcp, service, worker, actors)
    from .ui import UiServices, register_ui

    register_ui(mcp, UiServices(service, learning, ml), keys)  # the memory browser at /ui on HTTP and SSE
    return mcp


def add_health_route(mcp: FastMCP) -> None:
    """`GET /health` on HTTP and SSE: liveness and version only, for container health checks and load
    balancers. Custom routes sit outside FastMCP's bearer-token check, so it needs no key; OriginGuard
    wraps the whole ASGI app, so the Host/Origin check still applies."""

    @mcp.custom_route("/health", methods=["GET"], include_in_schema=False)
    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "version": AMFS_VERSION})


def _warm_up_embedder(service: MemoryService) -> asyncio.Task[Any] | None:
    """Load the embedding model in the background, so startup stays fast and the first write does not wait."""
    load = getattr(service.embedder, "load", None)
    if load is None:
        return None

    async def warm() -> None:
        try:
            await asyncio.to_thread(load)
        except Exception:
            logger.exception("Loading the embedder failed; writes and retrieval will report it")
        else:
            from ..adapters.embedders import question_side

            # AMFS_QUERY_ENCODER=auto picks the question side by the CPU: say which one this server asks with
            logger.info("Embedder %s loaded; questions embedded by %s", service.embedder.name, question_side(service.embedder))

    return asyncio.create_task(warm())


def http_options(host: str, allowed_origins: Sequence[str] = (), limits: ServerLimits | None = None) -> dict[str, Any]:
    """Keyword arguments for FastMCP's http_app: our Origin/Host guard in place of FastMCP's own, the JSON-RPC
    checks (duplicate keys, ids reused in flight) and the per-key session limits. FastMCP puts its
    authentication before these and its 401 after them (at the route), so JsonRpcGuard leaves a request
    without a valid key unread (server/json_guard.py)."""
    from .ui import UI_PATH

    limits = limits or ServerLimits()
    return {
        "middleware": [
            Middleware(OriginGuard, allowed_origins=allowed_origins, loopback_bind=is_loopback(host)),
            # the browser's API answers its own errors
            Middleware(JsonRpcGuard, max_bytes=limits.max_request_bytes, not_json_rpc=UI_PATH + "/"),
            Middleware(SessionGuard, limits=limits),
        ],
        "host_origin_protection": False,  # OriginGuard does this, with AMFS_ALLOWED_ORIGINS
    }


def serve_http(
    app: FastMCP, transport: Literal["sse", "http"], host: str, port: int, allowed_origins: Sequence[str],
    limits: ServerLimits, log_level: int | str = "info",
) -> None:
    """Serve over uvicorn until SIGINT/SIGTERM, then shut down gracefully: open requests get
    `graceful_shutdown_s` to finish and the lifespan's finally closes the store (index saved, WAL
    checkpointed)."""
    import uvicorn

    raise_open_file_limit()
    uvicorn.Server(uvicorn_config(app, transport, host, port, allowed_origins, limits, log_level)).run()


def uvicorn_config(
    app: FastMCP, transport: Literal["sse", "http"], host: str, port: int, allowed_origins: Sequence[str],
    limits: ServerLimits, log_level: int | str = "info",
) -> Any:
    """The uvicorn.Config that `serve_http` runs (tests start it on port 0): our middleware, and the h11
    protocol with the header and request-body deadlines (server/h11_guard.py)."""
    import uvicorn

    from .h11_guard import guarded_uvicorn_options

    asgi = app.http_app(transport=transport, session_idle_timeout=limits.session_idle_expiry_s,
                        **http_options(host, allowed_origins, limits))
    return uvicorn.Config(
        asgi, host=host, port=port, log_config=uvicorn_log_config(), log_level=log_level, lifespan="on",
        timeout_graceful_shutdown=int(limits.graceful_shutdown_s), **guarded_uvicorn_options(limits),
    )


def run_server(
    settings: Settings, transport: Transport = "stdio", host: str = "127.0.0.1", port: int = 8000,
    log_level: int | str = logging.INFO,
) -> None:
    """Serve until stopped. Refuses (SystemExit with the reason) to bind beyond loopback without API keys."""
    try:
        level = log_level_number(log_level)
        configure_logging(level)
        keys = parse_api_keys(settings.api_keys)
        origins = parse_allowed_origins(settings.allowed_origins)
    except ValidationError as error:
        raise SystemExit(f"amfs-server: {error}") from None
    logger.debug(
        "amfs-server %s: transport=%s host=%s port=%s store=%s embedder=%s api_keys=%d", AMFS_VERSION, transport,
        host, port, "postgresql" if settings.postgres_dsn else settings.sqlite_path, settings.embedder, len(keys),
    )
    if transport != "stdio" and not is_loopback(host) and not keys:
        raise SystemExit(
            f"amfs-server: refusing to serve {transport} on {host}: binding beyond loopback requires bearer-token "
            "auth. Set AMFS_API_KEYS (e.g. AMFS_API_KEYS=<32 random chars>), or bind to --host 127.0.0.1."
        )
    try:
        services = build_services(settings, ml=True)
    except AmfsError as error:  # an embedder that cannot load, a learning store the settings cannot have
        raise SystemExit(f"amfs-server: {error}") from None
    app = create_app(services.memory, settings, api_keys=keys, services=services)
    try:
        if transport == "stdio":
            from .stdio import checked_stdio

            with checked_stdio():  # a malformed line gets a JSON-RPC error, not silence
                app.run("stdio", show_banner=False)
        else:
            if not is_loopback(host):
                logger.warning("Serving %s on %s: bearer-token auth is on (%d keys)", transport, host, len(keys))
            serve_http(app, "sse" if transport == "sse" else "http", host, port, origins, settings.limits, level)
    except KeyboardInterrupt:
        pass
