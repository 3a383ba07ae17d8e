"""Slow request bodies cannot hold connections (red-team finding: keyless slow POSTs filled uvicorn's connection
cap, after which /health and keyed clients got 503). A request without a valid key is answered 401 before its body
is read, and every request's body must arrive within the body deadline (408 and closed otherwise).

A real uvicorn server (the config `serve_http` runs) on a free loopback port, driven with raw sockets; the
deadlines are shortened so that each test takes a few seconds."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import pytest
import uvicorn

from amfs_server.server.app import create_app, uvicorn_config
from amfs_server.server.auth import parse_api_keys
from amfs_server.server.composition import build_service
from amfs_server.server.h11_guard import GuardedH11Protocol
from amfs_server.server.limits import ServerLimits
from amfs_server.server.settings import Settings, load_settings

from .test_auth import ADMIN, INITIALIZE, KEYS, MCP_HEADERS

HEADER_TIMEOUT_S = 1.0


@contextmanager
def serving(tmp_path: Path, transport: str = "http", keys: str | None = KEYS) -> Iterator[int]:
    """A started server on a free port (yields the port); stopped and joined on exit."""
    settings: Settings = load_settings({}, data_dir=tmp_path / "data", embedder="none")
    app = create_app(build_service(settings), settings, api_keys=parse_api_keys(keys))
    limits = ServerLimits(header_timeout_s=HEADER_TIMEOUT_S)
    server = uvicorn.Server(uvicorn_config(app, transport, "127.0.0.1", 0, (), limits, "warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def partial_post(port: int, path: str, token: str | None) -> socket.socket:
    """Headers promising a 1000-byte body, then one byte of it, and nothing more."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\n{auth}Content-Length: 1000\r\n\r\n{{".encode()
    )
    return sock


def read_until_closed(sock: socket.socket, timeout_s: float) -> tuple[bytes, bool]:
    """What the server sent, and whether it closed the connection within `timeout_s`."""
    sock.settimeout(timeout_s)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except TimeoutError:
        return received, False
    except ConnectionResetError:
        pass
    return received, True


def assert_still_serving(port: int, keyed: bool) -> None:
    base = f"http://127.0.0.1:{port}"
    assert httpx2.get(f"{base}/health", timeout=5).status_code == 200
    headers = MCP_HEADERS | ({"Authorization": f"Bearer {ADMIN}"} if keyed else {})
    assert httpx2.post(f"{base}/mcp", json=INITIALIZE, headers=headers, timeout=10).status_code == 200


@pytest.mark.parametrize(("transport", "path"), [("http", "/mcp"), ("sse", "/messages/?session_id=0123")])
@pytest.mark.parametrize("token", [None, "wrong-key-00000000000000000"])
def test_a_post_without_a_valid_key_gets_401_before_its_body_and_its_connection_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, transport: str, path: str, token: str | None
) -> None:
    monkeypatch.setattr(GuardedH11Protocol, "body_timeout_s", 10.0)  # far off: the 401 must not wait for it
    with serving(tmp_path, transport) as port:
        sock = partial_post(port, path, token)
        started = time.monotonic()
        sock.settimeout(2)
        first = sock.recv(4096)
        answered_s = time.monotonic() - started
        assert first.startswith(b"HTTP/1.1 401 "), first
        assert answered_s < 1.0  # at once, not after a deadline
        rest, closed = read_until_closed(sock, timeout_s=HEADER_TIMEOUT_S + 2)
        assert closed and b"HTTP/1.1" not in rest  # the header deadline, re-armed by the 401, closes it
        assert time.monotonic() - started < 5
        sock.close()
        assert httpx2.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200


@pytest.mark.parametrize("keys", [KEYS, None], ids=["valid-key", "server-without-keys"])
def test_a_post_whose_body_never_completes_gets_408_at_the_body_deadline_and_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, keys: str | None
) -> None:
    monkeypatch.setattr(GuardedH11Protocol, "body_timeout_s", 1.5)
    with serving(tmp_path, keys=keys) as port:
        sock = partial_post(port, "/mcp", ADMIN if keys else None)
        started = time.monotonic()
        received, closed = read_until_closed(sock, timeout_s=6)
        waited_s = time.monotonic() - started
        sock.close()
        assert received.startswith(b"HTTP/1.1 408 "), received
        assert closed and 1.4 < waited_s < 4
        assert_still_serving(port, keyed=keys is not None)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no traceback per cut-off body


def test_the_body_deadline_spares_a_body_that_arrives_slowly_but_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(GuardedH11Protocol, "body_timeout_s", 1.0)
    with serving(tmp_path) as port:
        body = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nAuthorization: Bearer {ADMIN}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10]
        )
        time.sleep(0.5)
        sock.sendall(body[10:])  # complete, within the deadline
        time.sleep(1.0)  # past the deadline: nothing fires for a body already in
        sock.settimeout(5)
        answer = sock.recv(4096)
        sock.close()
        assert not answer.startswith(b"HTTP/1.1 408"), answer
        assert answer.startswith(b"HTTP/1.1 "), answer
        assert_still_serving(port, keyed=True)


def test_duplicate_keys_are_still_refused_for_a_valid_key_and_a_keyless_request_gets_401(tmp_path: Path) -> None:
    body = '{"jsonrpc":"2.0","id":5,"method":"ping","method":"tools/list"}'
    with serving(tmp_path) as port:
        url = f"http://127.0.0.1:{port}/mcp"
        keyed = httpx2.post(url, content=body, headers=MCP_HEADERS | {"Authorization": f"Bearer {ADMIN}"}, timeout=10)
        keyless = httpx2.post(url, content=body, headers=MCP_HEADERS, timeout=10)
    assert keyed.status_code == 400 and "duplicate key 'method'" in keyed.text
    assert keyless.status_code == 401
