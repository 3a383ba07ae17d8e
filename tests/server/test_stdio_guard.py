"""stdio: every line with an id gets an answer, even when it is not valid JSON-RPC (a real subprocess)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from amfs_server.server.stdio import MessageProblem, check_line, top_level_id
from amfs_server.session_bench.mcp_latency import server_env

DEEP = '{"jsonrpc":"2.0","id":11,"method":"tools/call","params":' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize(
    ("line", "code", "expected_id"),
    [
        ("garbage", -32700, None),
        ('{"jsonrpc":"2.0","id":7,"method":"tools/list"', -32700, 7),
        (DEEP, -32700, 11),
        ('{"jsonrpc":"2.0","id":"s-1","method":"tools/call","params":{"arguments":{"key":"\\ud800"}}}', -32700, "s-1"),
        ('{"jsonrpc":"2.0","id":8,"id":9,"method":"tools/list"}', -32600, 8),
        ('{"jsonrpc":"2.0","id":10}', -32600, 10),
        ('{"jsonrpc":"2.0","method":"tools/list","params":{"id":3}', -32700, None),  # a nested id is not the id
        # ids the SDK would read as a notification (run unanswered or dropped), and a batch: refused, id null
        ('{"jsonrpc":"2.0","id":true,"method":"tools/list"}', -32600, None),
        ('{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}', -32600, None),
        ('{"jsonrpc":"2.0","id":1e3,"method":"tools/list"}', -32600, None),
        ('{"jsonrpc":"2.0","id":null,"method":"tools/list"}', -32600, None),
        ('[{"jsonrpc":"2.0","id":4,"method":"tools/list"}]', -32600, None),
    ],
)
def test_bad_lines_are_classified_and_their_top_level_id_found(line: str, code: int, expected_id: object) -> None:
    with pytest.raises(MessageProblem) as problem:
        check_line(line)
    assert problem.value.code == code
    assert top_level_id(line) == expected_id


def test_a_valid_request_passes_the_check() -> None:
    check_line('{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"x"}}')


def test_stdio_server_answers_every_bad_request_and_keeps_serving(tmp_path: Path) -> None:
    env = server_env(tmp_path / "data", AMFS_EMBEDDER="none")
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    process = subprocess.Popen(
        [sys.executable, "-m", "amfs_server.server.cli"], env=env, text=True, encoding="utf-8",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    stdout = process.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
    sent = [
        json.dumps(initialize),
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        "garbage with no id",
        '{"jsonrpc":"2.0","id":7,"method":"tools/list"',
        DEEP,
        '{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"amfs_read","arguments":'
        '{"entity_path":"svc","key":"\\ud800"}}}',
        '{"jsonrpc":"2.0","id":13,"id":14,"method":"tools/list"}',
        '{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"amfs_write","arguments":'
        '{"entity_path":"svc","key":"k","value":1}}}',
        json.dumps({"jsonrpc": "2.0", "id": 20, "method": "tools/list"}),
    ]
    process.stdin.write("".join(line + "\n" for line in sent))
    process.stdin.flush()
    replies: dict[Any, dict[str, Any]] = {}
    deadline = time.monotonic() + 90
    try:
        while not {1, 7, 11, 12, 13, None, 20} <= set(replies):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no reply for {({1, 7, 11, 12, 13, None, 20} - set(replies))}"
            try:
                reply = json.loads(lines.get(timeout=remaining))
            except queue.Empty:
                continue
            replies[reply["id"]] = reply
    finally:
        process.stdin.close()
        process.wait(timeout=30)
    assert replies[7]["error"]["code"] == -32700
    assert replies[11]["error"]["code"] == -32700 and "deeply" in replies[11]["error"]["message"]
    assert replies[12]["error"]["code"] == -32700
    assert replies[13]["error"]["code"] == -32600 and "duplicate key 'id'" in replies[13]["error"]["message"]
    assert replies[None]["error"]["code"] == -32600 and "string or an integer" in replies[None]["error"]["message"]
    assert "result" in replies[20] and replies[20]["result"]["tools"]
    stderr = process.stderr.read() if process.stderr else ""
    assert "no request id" in stderr
