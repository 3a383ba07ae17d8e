"""HTTP: checks on a JSON-RPC body before the transport sees it.

* A body with a duplicate key in one object is refused (400), not read as its last value: JSON parsers differ on
  which duplicate wins, so a proxy or audit log and this server could see two different requests in one body. So
  are a batch and a request whose id is neither a string nor an integer, which the SDK would read as something
  else (answered 202 and dropped, or a page of validation errors). stdio refuses them the same way (server/stdio.py).
* A request whose id is already in progress in the same session is refused (400): the MCP SDK answers only one of
  two requests that share an id and leaves the other's connection open for good, so a client reusing ids (a bug,
  or on purpose) would hold connections until the connection cap locked everyone out.
* A body over the request limit (`ServerLimits.max_request_bytes`, the MCP SDK's own 4 MiB) is refused (413) as
  soon as its Content-Length says so, or, sent without one, as soon as that much has come: this guard reads the body
  before the SDK's own check, and read up to 8 MiB it let every connection of one key hold 24 MiB (red-team finding,
  0.7.13).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .stdio import MessageProblem, _no_duplicate_keys, shape_problem, top_level_id

INVALID_REQUEST = -32600


class JsonRpcGuard:
    """Runs after FastMCP's authentication (which puts `scope["user"]` first) but before its 401 (at the route),
    so it leaves the body of a request without a valid key unread: reading it first let a keyless client hold
    a connection by sending a body slowly, and the route refuses that request anyway."""

    def __init__(self, app: ASGIApp, max_bytes: int, not_json_rpc: str | None = None) -> None:
        self.app = app
        self._max_bytes = max_bytes
        self._not_json_rpc = not_json_rpc  # a path prefix whose POSTs are not MCP's (the memory browser's API)
        self._in_progress: set[tuple[str, str]] = set()  # (session, the id's JSON text) of requests being answered

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST" or _refused_by_auth(scope)
                or (self._not_json_rpc is not None and scope["path"].startswith(self._not_json_rpc))):
            await self.app(scope, receive, send)
            return
        if _declared_length(scope) > self._max_bytes:
            await _too_large(send)
            return
        received = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # gone before its body was in (or cut off at the body deadline): no one to answer
            received += message.get("body", b"")
            if len(received) > self._max_bytes:
                await _too_large(send)
                return
            if not message.get("more_body", False):
                break
        body = bytes(received)
        del received  # one copy of the body, handed on as one message
        messages: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
        parsed, problem = _parse(body)
        problem = problem or shape_problem(parsed)
        if problem is not None:
            await _refuse(send, top_level_id(body.decode("utf-8", errors="replace")), problem.code, str(problem))
            return
        request = _request_in_session(scope, parsed)
        if request in self._in_progress:
            await _refuse(send, parsed["id"], INVALID_REQUEST,  # type: ignore[index]
                          f"A request with id {request[1]} is already in progress in this session; give every "
                          "request its own id.")
            return
        del body, parsed  # the one copy handed on is `messages`', dropped once replayed

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        if request is not None:
            self._in_progress.add(request)
        try:
            await self.app(scope, replay, send)
        finally:
            if request is not None:
                self._in_progress.discard(request)


def _request_in_session(scope: Scope, parsed: Any) -> tuple[str, str] | None:
    """(session id, id as JSON text) for a request sent in an open session; None for anything else (a session's
    opening request, a notification or response, a batch, a body that is not JSON)."""
    session = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"mcp-session-id"), None)
    if session is None or not isinstance(parsed, dict) or "method" not in parsed or parsed.get("id") is None:
        return None
    return session, json.dumps(parsed["id"], sort_keys=True)


def _declared_length(scope: Scope) -> int:
    """The request's Content-Length (0 when it has none or an unreadable one: the body's size is then counted)."""
    value = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
    return int(value) if value.isdigit() else 0


async def _too_large(send: Send) -> None:
    """The MCP SDK's own answer to a body over its limit."""
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"22")]})
    await send({"type": "http.response.body", "body": b"Request body too large"})


def _refused_by_auth(scope: Scope) -> bool:
    """A keyed server's authentication found no valid key (a server without keys sets no user)."""
    user = scope.get("user")
    return user is not None and not user.is_authenticated


def _parse(body: bytes) -> tuple[Any, MessageProblem | None]:
    """The body's JSON (None when it is not JSON: the transport answers that itself), or its duplicate key."""
    try:
        return json.loads(body, object_pairs_hook=_no_duplicate_keys), None
    except MessageProblem as problem:
        return None, problem
    except (ValueError, RecursionError):
        return None, None


async def _refuse(send: Send, request_id: Any, code: int, message: str) -> None:
    payload = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}).encode()
    await send({
        "type": "http.response.start", "status": 400,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
    })
    await send({"type": "http.response.body", "body": payload})
