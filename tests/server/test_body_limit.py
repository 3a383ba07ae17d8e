"""A keyed request's body over the request limit is refused (413) before it is held (red-team finding, 0.7.13: the
JSON-RPC guard read every keyed body up to 8 MiB, twice over, before the MCP SDK's own 4 MiB check, so 50
connections of one read-only key took a server from 107 to 1,313 MiB). Declared too large, it is refused before any
of it is read; sent without a length, as soon as more than the limit has come. A body at the limit goes through."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from amfs_server.server.json_guard import JsonRpcGuard
from amfs_server.server.limits import ServerLimits

from .test_auth import READER
from .test_slow_body import read_until_closed, serving

LIMIT = ServerLimits().max_request_bytes


def _headers(port: int, length: str) -> bytes:
    return (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nAuthorization: Bearer {READER}\r\n{length}\r\n").encode()


def test_a_body_declared_over_the_limit_is_refused_before_any_of_it_is_read(tmp_path: Path) -> None:
    with serving(tmp_path) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_headers(port, f"Content-Length: {LIMIT + 1}\r\n"))  # and not one byte of the body
        received, _ = read_until_closed(sock, 5)
        assert received.startswith(b"HTTP/1.1 413") and b"Request body too large" in received


def test_a_chunked_body_is_refused_once_past_the_limit(tmp_path: Path) -> None:
    with serving(tmp_path) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_headers(port, "Transfer-Encoding: chunked\r\n"))
        chunk = b"x" * (256 * 1024)
        for _ in range(LIMIT // len(chunk) + 1):  # one chunk past the limit, then the body never ends
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        received, _ = read_until_closed(sock, 5)
        assert received.startswith(b"HTTP/1.1 413")


async def test_the_guard_passes_a_body_at_the_limit_on_whole_and_stops_reading_past_it() -> None:
    handed_on: list[bytes] = []

    async def transport(scope, receive, send) -> None:  # the MCP transport, as a double that keeps what it got
        handed_on.append((await receive())["body"])

    guard = JsonRpcGuard(transport, max_bytes=1000)
    request = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "pad": ""}).encode()
    at_limit = request.replace(b'"pad": ""', b'"pad": "' + b"x" * (1000 - len(request)) + b'"')
    assert len(at_limit) == 1000

    async def post(body: bytes, piece: int) -> tuple[list[dict], int]:
        pieces = [body[i:i + piece] for i in range(0, len(body), piece)]
        reads = 0

        async def receive() -> dict:
            nonlocal reads
            reads += 1
            return {"type": "http.request", "body": pieces[reads - 1], "more_body": reads < len(pieces)}

        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        await guard({"type": "http", "method": "POST", "headers": [], "path": "/mcp"}, receive, send)
        return sent, reads

    sent, _ = await post(at_limit, 100)
    assert sent == [] and handed_on == [at_limit]  # handed on whole, in one message
    sent, reads = await post(at_limit + b" " * 500, 100)
    assert sent[0]["status"] == 413 and reads == 11 and handed_on == [at_limit]  # stopped at the first 100 past it
