"""stdio transport guard: every line that is not a valid JSON-RPC message still gets an answer.

The MCP SDK's stdio reader hands a line it cannot parse to the session as an exception, which is
logged at debug level and never answered: a client that sent garbage, a request nested 100k deep or
a lone surrogate waits forever. `checked_stdio_server` wraps the SDK's `stdio_server`: each line is
checked first; a bad one is answered with a JSON-RPC parse error (-32700) or invalid-request error
(-32600) carrying the request's id, or logged when no id can be found. Duplicate keys in an object
are refused too (JSON parsers differ on which one wins).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp.server import stdio as sdk_stdio
from mcp.shared.message import SessionMessage

logger = logging.getLogger("amfs_server.server.stdio")

_ID_VALUE = re.compile(r'\s*:\s*(-?\d{1,18}(?![\d.eE])|"(?:[^"\\]|\\.){0,200}")')  # 1.5 and 1e3 are not ids


class MessageProblem(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise MessageProblem(types.INVALID_REQUEST, f"Invalid request: duplicate key {key[:40]!r} in one object")
        result[key] = value
    return result


def shape_problem(message: Any) -> MessageProblem | None:
    """What the SDK would read as something else: a batch (answered by nobody) or a request whose id is not a
    string or an integer (read as a notification: run unanswered, or dropped)."""
    if isinstance(message, list):
        return MessageProblem(types.INVALID_REQUEST, "Invalid request: batches are not supported; send one message at a time")
    if isinstance(message, dict) and "method" in message and "id" in message:
        request_id = message["id"]
        if isinstance(request_id, bool) or not isinstance(request_id, (int, str)):
            return MessageProblem(types.INVALID_REQUEST, "Invalid request: id must be a string or an integer")
    return None


def check_line(line: str) -> None:
    """Raise MessageProblem when `line` is not one valid JSON-RPC message the SDK will accept."""
    try:
        message = json.loads(line, object_pairs_hook=_no_duplicate_keys)
    except RecursionError:
        raise MessageProblem(types.PARSE_ERROR, "Parse error: JSON nested too deeply") from None
    except ValueError as error:
        raise MessageProblem(types.PARSE_ERROR, f"Parse error: {str(error)[:200]}") from None
    problem = shape_problem(message)
    if problem is not None:
        raise problem
    try:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except Exception as error:  # the SDK's own parse: surrogates, missing fields, wrong shapes
        first = error.errors()[0] if hasattr(error, "errors") else {"msg": str(error)}
        code = types.PARSE_ERROR if first.get("type") == "json_invalid" else types.INVALID_REQUEST
        kind = "Parse error" if code == types.PARSE_ERROR else "Invalid request"
        raise MessageProblem(code, f"{kind}: {str(first.get('msg'))[:200]}") from None


def top_level_id(line: str) -> int | str | None:
    """The "id" member of the outermost object, found without parsing (the line may not parse)."""
    depth = 0
    in_string = False
    position = 0
    end = len(line)
    while position < end:
        char = line[position]
        if in_string:
            if char == "\\":
                position += 1
            elif char == '"':
                in_string = False
        elif char == '"':
            if depth == 1 and line.startswith('"id"', position):
                match = _ID_VALUE.match(line, position + 4)
                if match:
                    try:
                        found = json.loads(match.group(1))
                    except ValueError:
                        return None
                    return found if isinstance(found, (int, str)) else None
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        position += 1
    return None


class CheckedLines:
    """stdin lines for the SDK reader: valid messages pass through, bad ones are answered here."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self._replies: Any = None
        self._attached = anyio.Event()

    def attach(self, write_stream: Any) -> None:
        """Answers go out on the SDK's write stream, so they never interleave with its own output."""
        self._replies = write_stream
        self._attached.set()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        async for line in self._source:
            if not line.strip():
                continue
            try:
                check_line(line)
            except MessageProblem as problem:
                await self._answer(line, problem)
                continue
            yield line

    async def _answer(self, line: str, problem: MessageProblem) -> None:
        request_id = top_level_id(line)
        if request_id is None and problem.code != types.INVALID_REQUEST:
            logger.warning("Ignored a stdin line with no request id (%s): %.120r", problem, line)
            return
        # An invalid request whose id cannot be read is answered with id null, as JSON-RPC 2.0 says.
        logger.warning("Refused request %r: %s", request_id, problem)
        await self._attached.wait()
        error = types.JSONRPCError(
            jsonrpc="2.0", id=request_id, error=types.ErrorData(code=problem.code, message=str(problem))
        )
        await self._replies.send(SessionMessage(error))


@asynccontextmanager
async def checked_stdio_server() -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's stdio_server over a checked stdin (fd 0 claimed the way the SDK claims it)."""
    buffer, release = sdk_stdio._claim_fd(0, sys.stdin, "rb", sdk_stdio._open_stdin_diversion)
    lines = CheckedLines(anyio.wrap_file(sdk_stdio._UnownedTextWrapper(buffer, encoding="utf-8", errors="replace")))
    try:
        async with _sdk_stdio_server(stdin=lines) as (read_stream, write_stream):  # type: ignore[arg-type]
            lines.attach(write_stream)
            yield read_stream, write_stream
    finally:
        if release is not None:
            release()


_sdk_stdio_server = sdk_stdio.stdio_server


@contextmanager
def checked_stdio() -> Iterator[None]:
    """While inside, FastMCP's stdio transport serves through `checked_stdio_server`."""
    from fastmcp.server.mixins import transport

    if getattr(transport, "stdio_server", None) is not _sdk_stdio_server:
        raise RuntimeError("fastmcp's stdio transport no longer uses mcp.server.stdio.stdio_server; update server/stdio.py")
    transport.stdio_server = checked_stdio_server  # type: ignore[assignment]
    try:
        yield
    finally:
        transport.stdio_server = _sdk_stdio_server  # type: ignore[assignment]
