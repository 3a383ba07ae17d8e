"""A request id reused while the first request with it is in progress (red-team finding: the MCP SDK answers one
of the two and leaves the other's connection open for good, so one key reusing ids held connections until the
cap locked everyone out). The second is refused at once with a JSON-RPC error; an id is free again once its
request is answered."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import httpx2

from amfs_server.server.json_guard import JsonRpcGuard

from .test_auth import ADMIN, INITIALIZE, MCP_HEADERS
from .test_slow_body import serving


def _call(request_id: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                       "params": {"name": "amfs_list", "arguments": {}}}).encode()


async def test_a_request_reusing_an_id_in_progress_in_its_session_is_refused_and_the_first_is_answered() -> None:
    release = asyncio.Event()
    answered: list[bytes] = []

    async def transport(scope, receive, send) -> None:  # an MCP transport double that answers when released
        body = (await receive())["body"]
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    guard = JsonRpcGuard(transport, max_bytes=4 * 1024 * 1024)

    async def post(session: str, request_id: object) -> tuple[int, bytes]:
        sent: list[dict] = []
        body = _call(request_id)

        async def receive() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "headers": [(b"mcp-session-id", session.encode())]}
        await guard(scope, receive, send)
        answered.append(sent[-1]["body"])
        return sent[0]["status"], sent[-1]["body"]

    first = asyncio.create_task(post("s1", 7))
    await asyncio.sleep(0.01)
    status, body = await asyncio.wait_for(post("s1", 7), 5)  # refused without waiting for the first
    assert status == 400
    assert json.loads(body) == {"jsonrpc": "2.0", "id": 7, "error": {"code": -32600, "message": (
        "A request with id 7 is already in progress in this session; give every request its own id.")}}
    other_session = asyncio.create_task(post("s2", 7))  # ids belong to their session
    other_id = asyncio.create_task(post("s1", "7"))  # the string "7" is another id than the number 7
    await asyncio.sleep(0.01)
    assert not other_session.done() and not other_id.done()
    release.set()
    assert [(await task)[0] for task in (first, other_session, other_id)] == [200, 200, 200]
    assert (await post("s1", 7))[0] == 200  # answered: the id is free again


def test_concurrent_requests_sharing_an_id_are_all_answered_on_a_real_server(tmp_path: Path) -> None:
    with serving(tmp_path) as port:
        base = f"http://127.0.0.1:{port}/mcp"
        headers = {**MCP_HEADERS, "Authorization": f"Bearer {ADMIN}"}
        opened = httpx2.post(base, json=INITIALIZE, headers=headers, timeout=10)
        session = opened.headers["mcp-session-id"]
        headers["Mcp-Session-Id"] = session
        httpx2.post(base, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers, timeout=10)
        body = _call(7)
        raw = ("POST /mcp HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
               + f"Host: 127.0.0.1:{port}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        sockets = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(10)]
        for sock in sockets:
            sock.sendall(raw)
        received = [bytearray() for _ in sockets]
        deadline = time.monotonic() + 10
        for sock, buffer in zip(sockets, received):
            sock.settimeout(0.2)
            while b'"result"' not in buffer and b"already in progress" not in buffer and time.monotonic() < deadline:
                try:
                    buffer.extend(sock.recv(65536) or b"")
                except TimeoutError:
                    pass
            sock.close()
        assert all(b'"result"' in b or b"already in progress" in b for b in received), [bytes(b[:80]) for b in received]
        assert any(b'"result"' in b for b in received)
        assert httpx2.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
