"""How tools are registered: MCP annotations, who the caller is, and the one place errors become ToolError.

Every tool goes through `ToolRegistry.tool`, which wraps it so that a domain error (`AmfsError`)
reaches the client as a tool error carrying its actionable message, and anything unexpected is
logged with its traceback (stderr) and reported as an internal error without internals.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from mcp_types import ToolAnnotations
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from ..core.errors import AmfsError
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
        if credential is not None:
            agent_id, scope = credential.agent_id, credential.entity_prefix
        else:
            params = session.client_params
            client_name = params.client_info.name if params is not None and params.client_info is not None else None
            agent_id, scope = self._agent_id or client_name or DEFAULT_AGENT_ID, None
        if session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return Actor(agent_id, ctx.session_id, scope)
        if ctx.transport in (None, "stdio"):
            return Actor(agent_id, self._process_session_id, scope)
        return Actor(agent_id, f"request-{uuid.uuid4().hex[:16]}", scope)


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
            name = fn.__name__

            @functools.wraps(fn)
            async def call(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await fn(*args, **kwargs)
                except ToolError:
                    raise
                except AmfsError as error:
                    raise ToolError(str(error), log_level=logging.DEBUG) from None
                except Exception:
                    logger.exception("Unexpected error in %s", name)
                    raise ToolError(f"Internal error in {name}; see the server log.", log_level=logging.DEBUG) from None

            description = " ".join((fn.__doc__ or "").split())  # one line: descriptions cost tokens every session
            self.mcp.tool(call, name=name, title=annotations.title, description=description, annotations=annotations)
            return fn

        return register
