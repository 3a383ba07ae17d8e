"""HTTP: a JSON-RPC body with a duplicate key in one object is refused (400), not read as its last value.

JSON parsers differ on which duplicate wins, so a proxy or audit log and this server could see two
different requests in one body. The stdio transport refuses them the same way (server/stdio.py).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .stdio import MessageProblem, _no_duplicate_keys, top_level_id

MAX_CHECKED_BYTES = 8 * 1024 * 1024  # larger bodies pass unchecked to the transport, which has its own limits


class DuplicateKeyGuard:
    """Runs after FastMCP's authentication (which puts `scope["user"]` first) but before its 401 (at the route),
    so it leaves the body of a request without a valid key unread: reading it first let a keyless client hold
    a connection by sending a body slowly, and the route refuses that request anyway."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or _refused_by_auth(scope):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # gone before its body was in (or cut off at the body deadline): no one to answer
            messages.append(message)
            body += message.get("body", b"")
            if not message.get("more_body", False) or len(body) > MAX_CHECKED_BYTES:
                break
        problem = _duplicate_key_problem(body) if len(body) <= MAX_CHECKED_BYTES else None
        if problem is not None:
            await _refuse(send, body, problem)
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def _refused_by_auth(scope: Scope) -> bool:
    """A keyed server's authentication found no valid key (a server without keys sets no user)."""
    user = scope.get("user")
    return user is not None and not user.is_authenticated


def _duplicate_key_problem(body: bytes) -> MessageProblem | None:
    try:
        json.loads(body, object_pairs_hook=_no_duplicate_keys)
    except MessageProblem as problem:
        return problem
    except (ValueError, RecursionError):
        return None  # not JSON: the transport answers that itself
    return None


async def _refuse(send: Send, body: bytes, problem: MessageProblem) -> None:
    request_id: Any = top_level_id(body.decode("utf-8", errors="replace"))
    payload = json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "error": {"code": problem.code, "message": str(problem)}}
    ).encode()
    await send({
        "type": "http.response.start", "status": 400,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
    })
    await send({"type": "http.response.body", "body": payload})
