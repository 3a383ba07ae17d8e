"""Limits that keep one client (or one key) from starving the others over SSE and streamable HTTP.

- `SessionGuard` (ASGI, after auth): at most `sessions_per_key` open MCP sessions (streamable HTTP) or
  SSE streams per API key; a session that sent nothing after its handshake expires after
  `unused_session_expiry_s`, one that did after `session_idle_expiry_s` without a request.
- `CallLimiter`: at most `calls_per_key` tool calls in progress per key; more wait up to
  `call_queue_wait_s`, then are refused with what to do.
- `max_response_bytes`: a tool result larger than this is refused with how to ask for less.
- `GuardedH11Protocol` (server/h11_guard.py): a connection must finish sending a request's headers within
  `header_timeout_s` of opening (or of its last response), and a request's body within `BODY_TIMEOUT_S` of
  its headers (408 otherwise), so slow connections cannot pile up. `serve` and `amfs-server ui` both run it.
- `RepeatFilter`: a message repeated more than `REPEATS_PER_WINDOW` times per `REPEAT_WINDOW_S` is
  collapsed into a count, so a flood of failing connections cannot fill the disk with tracebacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:  # the web stack is imported where it is used: settings and the CLI import this module
    from starlette.responses import JSONResponse
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("amfs_server.server.limits")

MIB = 1024 * 1024


@dataclass(frozen=True)
class ServerLimits:
    sessions_per_key: int = 32
    unused_session_expiry_s: float = 30.0
    session_idle_expiry_s: float = 30 * 60.0
    calls_per_key: int = 4
    call_queue_wait_s: float = 10.0
    max_response_bytes: int = 16 * MIB
    max_request_bytes: int = 4 * MIB  # the MCP SDK's own body limit on streamable HTTP (413 above it)
    max_connections: int = 2048
    header_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_header_bytes: int = 64 * 1024
    graceful_shutdown_s: float = 10.0


def key_of(scope: Scope) -> str:
    """Whose request this is: the API key's id, or one shared bucket on a server without keys."""
    token = getattr(scope.get("user"), "access_token", None)
    return getattr(token, "client_id", None) or "anonymous"


# -- sessions ------------------------------------------------------------------------------------


class SessionGuard:
    """Per-key caps on open sessions and a short life for sessions that never did anything.

    Expiry is the MCP SDK's own idle timer (`StreamableHTTPServerTransport`'s idle scope, which
    discards the session and all it holds): a new session gets `unused_session_expiry_s`, and the
    full `session_idle_expiry_s` once it sends a second request after its opening one (the first is
    the `notifications/initialized` every client sends).
    """

    def __init__(self, app: ASGIApp, limits: ServerLimits) -> None:
        self.app = app
        self.limits = limits
        self._sessions: dict[str, set[str]] = defaultdict(set)
        self._opening: dict[str, int] = defaultdict(int)
        self._requests: dict[str, int] = {}  # requests seen per session not yet marked as used
        self._streams: dict[str, int] = defaultdict(int)
        self._manager: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = getattr(scope.get("app"), "state", None)
        path, transport = getattr(state, "path", None), getattr(state, "transport_type", None)
        if transport == "streamable-http" and scope["path"].rstrip("/") == (path or "").rstrip("/"):
            await self._streamable(scope, receive, send)
        elif transport == "sse" and scope["method"] == "GET" and scope["path"].rstrip("/") == (path or "").rstrip("/"):
            await self._sse(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def _refuse(self, what: str) -> JSONResponse:
        message = (
            f"Too many open {what} for this API key (limit {self.limits.sessions_per_key}). Close sessions you no "
            f"longer use (HTTP DELETE with their Mcp-Session-Id); unused ones expire after "
            f"{self.limits.unused_session_expiry_s:g} s."
        )
        from starlette.responses import JSONResponse

        return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}, 429)

    async def _sse(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = key_of(scope)
        if self._streams[key] >= self.limits.sessions_per_key:
            await self._refuse("SSE streams")(scope, receive, send)
            return
        self._streams[key] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._streams[key] -= 1

    async def _streamable(self, scope: Scope, receive: Receive, send: Send) -> None:
        manager = self._session_manager(scope)
        if manager is None or getattr(manager, "stateless", False):
            await self.app(scope, receive, send)
            return
        session_id = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"mcp-session-id"), None)
        if session_id is not None:
            self._note_request(manager, session_id)
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        key = key_of(scope)
        live = self._sessions[key] & manager._server_instances.keys()
        for gone in self._sessions[key] - live:  # ended or expired since: forget them here too
            self._requests.pop(gone, None)
        self._sessions[key] = live
        if len(live) + self._opening[key] >= self.limits.sessions_per_key:
            await self._refuse("sessions")(scope, receive, send)
            return
        opened: list[str] = []

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                opened.extend(v.decode("latin-1") for k, v in message.get("headers", []) if k == b"mcp-session-id")
            await send(message)

        self._opening[key] += 1
        try:
            await self.app(scope, receive, watch)
        finally:
            self._opening[key] -= 1
        for new in opened:
            if new in manager._server_instances:
                self._sessions[key].add(new)
                self._requests[new] = 0
                self._set_expiry(manager, new, self.limits.unused_session_expiry_s)

    def _note_request(self, manager: Any, session_id: str) -> None:
        if session_id not in self._requests:
            return
        self._requests[session_id] += 1
        if session_id not in manager._server_instances:
            del self._requests[session_id]
        elif self._requests[session_id] >= 2:
            del self._requests[session_id]
            self._set_expiry(manager, session_id, self.limits.session_idle_expiry_s)

    @staticmethod
    def _set_expiry(manager: Any, session_id: str, seconds: float) -> None:
        # The SDK re-arms the idle deadline from `_idle_timeout` whenever its last request in flight ends.
        transport = manager._server_instances.get(session_id)
        if transport is None or transport.idle_scope is None:
            return
        transport._idle_timeout = seconds
        if not transport._requests_in_flight:
            transport.idle_scope.deadline = anyio.current_time() + seconds

    def _session_manager(self, scope: Scope) -> Any:
        if self._manager is None:
            app = scope.get("app")
            for route in getattr(app, "routes", []):
                if getattr(route, "path", None) == app.state.path:  # type: ignore[union-attr]
                    endpoint = route.endpoint  # type: ignore[attr-defined]
                    while not hasattr(endpoint, "session_manager") and hasattr(endpoint, "app"):
                        endpoint = endpoint.app  # RequireAuthMiddleware wraps the MCP endpoint
                    self._manager = getattr(endpoint, "session_manager", None)
                    break
            if self._manager is None:
                return None
        return self._manager

    def open_sessions(self, key: str) -> int:
        """How many sessions `key` has open now (for tests and logs)."""
        if self._manager is None:
            return 0
        return len(self._sessions[key] & self._manager._server_instances.keys())


# -- calls ---------------------------------------------------------------------------------------


class CallLimiter:
    """At most `calls_per_key` tool calls in progress per key, so one key's load queues behind itself."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self._slots: dict[str, asyncio.Semaphore] = {}

    @contextlib.asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[None]:
        semaphore = self._slots.setdefault(key, asyncio.Semaphore(self.limits.calls_per_key))
        try:
            await asyncio.wait_for(semaphore.acquire(), self.limits.call_queue_wait_s)
        except TimeoutError:
            from fastmcp.exceptions import ToolError

            raise ToolError(
                f"This API key already has {self.limits.calls_per_key} calls in progress and this one waited "
                f"{self.limits.call_queue_wait_s:g} s for a turn; nothing was done. Retry, or send fewer calls at once."
            ) from None
        try:
            yield
        finally:
            semaphore.release()

    def check_response_size(self, name: str, result: Any) -> None:
        size = sum(len(getattr(block, "text", "") or "") for block in getattr(result, "content", None) or [])
        if size > self.limits.max_response_bytes:
            from fastmcp.exceptions import ToolError

            raise ToolError(
                f"{name}'s result is {size / MIB:.1f} MiB, over the server's {self.limits.max_response_bytes / MIB:g} "
                "MiB response limit. Ask for less: a smaller limit, a narrower entity_path or query."
            )


# -- connections ---------------------------------------------------------------------------------


def raise_open_file_limit() -> int:
    """Raise the soft open-file limit to the hard one (every connection is a descriptor); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# -- logs ----------------------------------------------------------------------------------------


REPEATS_PER_WINDOW = 5
REPEAT_WINDOW_S = 60.0
_MAX_TRACKED = 1024


class RepeatFilter(logging.Filter):
    """Lets a message (same logger, level, template and exception type) through `REPEATS_PER_WINDOW` times
    per `REPEAT_WINDOW_S`; the next one after the window says how many were dropped."""

    def __init__(self, name: str = "", clock: Any = time.monotonic) -> None:
        super().__init__(name)
        self._clock = clock
        self._seen: OrderedDict[tuple[Any, ...], list[float]] = OrderedDict()  # key -> [window start, count, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        exc_type = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else None
        key = (record.name, record.levelno, str(record.msg), exc_type)
        now = self._clock()
        entry = self._seen.get(key)
        if entry is None or now - entry[0] >= REPEAT_WINDOW_S:
            dropped = int(entry[2]) if entry is not None else 0
            self._seen[key] = [now, 1, 0]
            self._seen.move_to_end(key)
            while len(self._seen) > _MAX_TRACKED:
                self._seen.popitem(last=False)
            if dropped:
                record.msg = f"{record.msg} ({dropped} more like this in the last {REPEAT_WINDOW_S:g} s were not logged)"
            return True
        entry[1] += 1
        if entry[1] <= REPEATS_PER_WINDOW:
            return True
        entry[2] += 1
        return False
