"""How tools are registered: MCP annotations, who the caller is, and the one place errors become ToolError.

`ToolErrorMiddleware` (one FastMCP middleware for every tool) turns a domain error (`AmfsError`) into a
tool error carrying its actionable message; anything unexpected is logged with its traceback (stderr)
and reported as an internal error without internals.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

from fastmcp import Context, FastMCP
from fastmcp.exceptions import FastMCPError, ToolError
from fastmcp.exceptions import ValidationError as ArgumentsError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools import ToolResult
from mcp_types import ToolAnnotations
from pydantic import ValidationError as PydanticValidationError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from ..core.errors import AmfsError, ValidationError
from ..core.validation import refuse_lone_surrogates
from ..core.models import Actor

logger = logging.getLogger("amfs_server.tools")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
S = TypeVar("S")

DEFAULT_AGENT_ID = "mcp-client"


def read_only(title: str) -> ToolAnnotations:
    return ToolAnnotations(title=title, read_only_hint=True, idempotent_hint=True, open_world_hint=False)


def writes(title: str, *, destructive: bool = False, idempotent: bool = False) -> ToolAnnotations:
    return ToolAnnotations(
        title=title, read_only_hint=False, destructive_hint=destructive, idempotent_hint=idempotent,
        open_world_hint=False,
    )


class Credential(Protocol):
    """What the transport authenticated (an API key): who it is and the entity prefix it is confined to."""

    @property
    def agent_id(self) -> str: ...

    @property
    def entity_prefix(self) -> str | None: ...

    @property
    def access(self) -> str: ...


class ActorResolver:
    """Who is calling. With an API key, the key says so (its configured agent, else its id) and its prefix
    becomes the actor's scope: a client's self-declared name could otherwise read and pollute another
    user's learned preferences. Without one (stdio, a keyless loopback server): AMFS_AGENT_ID, else the
    client's name from the MCP handshake.

    session_id keys the read tracker, so it must follow one client session:
    - handshake-era connections: the MCP session (streamable HTTP's Mcp-Session-Id, or one id per
      stdio/SSE connection);
    - 2026-07-28 (sessionless) connections: on stdio and in-memory the process serves one client, so
      one id per server; over HTTP nothing ties two requests to one session (an API key is shared and
      outlives sessions), so each request is its own and amfs_commit_outcome needs causal_entry_keys.
    """

    def __init__(self, agent_id: str | None, credential: Callable[[], Credential | None] = lambda: None) -> None:
        self._agent_id = agent_id
        self._credential = credential
        self._process_session_id = f"mcp-{uuid.uuid4().hex[:16]}"

    def credential(self) -> Credential | None:
        """The API key of the current request; None without one."""
        return self._credential()

    def __call__(self, ctx: Context) -> Actor:
        session = ctx.session
        credential = self._credential()
        read_only = False
        if credential is not None:
            agent_id, scope, read_only = credential.agent_id, credential.entity_prefix, credential.access == "ro"
        else:
            params = session.client_params
            client_name = params.client_info.name if params is not None and params.client_info is not None else None
            agent_id, scope = self._agent_id or client_name or DEFAULT_AGENT_ID, None
        if session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return Actor(agent_id, ctx.session_id, scope, read_only)
        if ctx.transport in (None, "stdio"):
            return Actor(agent_id, self._process_session_id, scope, read_only)
        return Actor(agent_id, f"request-{uuid.uuid4().hex[:16]}", scope, read_only)


class ToolRegistry(Generic[S]):
    """Registers tools on `mcp` that call `service` (a MemoryService, or another service such as learning's)."""

    def __init__(self, mcp: FastMCP, service: S, actors: ActorResolver) -> None:
        self.mcp = mcp
        self.service = service
        self.actor = actors

    def has(self, method: str) -> bool:
        """Whether the service offers `method`: a tool is registered only when what it calls exists."""
        return callable(getattr(self.service, method, None))

    def tool(self, annotations: ToolAnnotations) -> Callable[[F], F]:
        """Register `fn` as the tool named after it, its docstring as the description the model reads."""

        def register(fn: F) -> F:
            description = " ".join((fn.__doc__ or "").split())  # one line: descriptions cost tokens every session
            self.mcp.tool(
                fn, name=fn.__name__, title=annotations.title, description=description, annotations=annotations
            )
            return fn

        return register


class ToolErrorMiddleware(Middleware):
    """The one place tool errors are translated, for every tool of the app.

    FastMCP catches what a tool raises and re-raises it as a ToolError whose __cause__ is the original;
    the original decides what the client reads. FastMCP's own errors (argument validation, unknown tool)
    pass through unchanged.
    """

    def __init__(self) -> None:
        _quiet_fastmcp_tool_error_log()

    async def on_call_tool(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, ToolResult]
    ) -> ToolResult:
        name = context.message.name
        server = context.fastmcp_context.fastmcp if context.fastmcp_context is not None else None
        if server is not None and await server.get_tool(name) is None:
            # A client's mistake, answered before anything runs or is recorded; the name is the caller's text,
            # so it is shown escaped and cut (a newline in it must not start a line of its own in any log).
            raise ToolError(f"Unknown tool {shown_name(name)}; call tools/list for this server's tools.",
                            log_level=logging.DEBUG)
        try:
            refuse_lone_surrogates(dict(context.message.arguments or {}), "arguments")
        except ValidationError as refused:
            raise ToolError(f"{name} refused its arguments: {refused}", log_level=logging.DEBUG) from None
        try:
            return await call_next(context)
        except Exception as error:
            cause = error.__cause__ if isinstance(error, ToolError) and error.__cause__ is not None else error
            if isinstance(cause, AmfsError):
                logger.debug("%s refused: %s", name, cause)
                raise ToolError(str(cause), log_level=logging.DEBUG) from None
            if isinstance(cause, ArgumentsError) and isinstance(cause.__cause__, PydanticValidationError):
                raise ToolError(arguments_refusal(name, cause.__cause__), log_level=logging.DEBUG) from None
            if isinstance(cause, FastMCPError):
                raise
            logger.error("Unexpected error in %s", name, exc_info=cause)
            raise ToolError(f"Internal error in {name}; see the server log.", log_level=logging.DEBUG) from None


def arguments_refusal(tool: str, error: PydanticValidationError, most: int = 5) -> str:
    """Arguments the tool's schema refuses, one clause each (pydantic's text ran over several lines with its
    internal type codes and a documentation link): "amfs_retrieve refused its arguments, nothing was done: limit:
    Input should be greater than or equal to 1 (got 0). See the tool's input schema (tools/list)."."""
    clauses = []
    for problem in error.errors(include_url=False)[:most]:
        where = ".".join(str(part) for part in problem["loc"]) or "arguments"
        given = problem.get("input")
        shown = repr(given) if len(repr(given)) <= 60 else repr(given)[:60] + "..."
        clauses.append(f"{where}: {problem['msg']}" + ("" if problem["type"].startswith("missing") else f" (got {shown})"))
    more = f" (and {error.error_count() - most} more)" if error.error_count() > most else ""
    return (f"{tool} refused its arguments, nothing was done: {'; '.join(clauses)}{more}. "
            "See the tool's input schema (tools/list).")


def shown_name(name: str, limit: int = 80) -> str:
    """A caller-given name or value as it may appear in a message or log line: quoted, escaped, at most `limit`
    characters, with the whole one's length when cut (a 200,000-character path was once echoed whole)."""
    return repr(name) if len(name) <= limit else f"{name[:limit]!r}... ({len(name):,} characters)"


def _is_fastmcp_tool_error_report(record: logging.LogRecord) -> bool:
    return record.exc_info is not None and record.getMessage().startswith("Error calling tool")


def _drop_fastmcp_tool_error_report(record: logging.LogRecord) -> bool:
    """FastMCP logs every exception a tool raises with a traceback, before ToolErrorMiddleware sees it:
    a refused input would read as a crash. ToolErrorMiddleware logs what needs logging."""
    return not _is_fastmcp_tool_error_report(record)


def _quiet_fastmcp_tool_error_log() -> None:
    server_logger = logging.getLogger("fastmcp.server.server")
    if _drop_fastmcp_tool_error_report not in server_logger.filters:
        server_logger.addFilter(_drop_fastmcp_tool_error_report)
