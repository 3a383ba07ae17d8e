"""The default install has no torch: the default embedder is the bundled int8 ONNX MiniLM, and nothing on the
server's start path, nor a write and a retrieve with the default settings, imports torch, transformers, tokenizers, lightgbm
or matplotlib (each would also cost start-up time and memory). Checked in fresh interpreters.

The stdio server's cold start (spawn to the first `amfs_write` answered) also imports nothing it does not use:
no asyncpg on a SQLite store, no LM worker when none is configured, no HTTP server protocol."""

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

from amfs_server.core.embedding import DEFAULT_EMBEDDER
from amfs_server.server.settings import Settings

HEAVY = ("torch", "transformers", "lightgbm", "matplotlib", "scipy", "tokenizers", "huggingface_hub")

SERVE_ONE_WRITE = """
import asyncio, json, sys
from amfs_server import AsyncAgentMemory
from amfs_server.server.app import create_app
from amfs_server.server.cli import main  # the console script's module
from amfs_server.server.composition import build_service
from amfs_server.server.settings import load_settings

async def run():
    service = build_service(load_settings())
    create_app(service, load_settings())  # the MCP app with every tool registered
    await service.open()
    async with AsyncAgentMemory(agent_id="agent/light", service=service) as mem:
        await mem.write("svc/payments", "retry-policy", "retry the card authorisation 3 times")
        hits = await mem.retrieve("how often do we retry a card payment?")
    return type(service.embedder).__name__, service.embedder.name, hits[0].entry.key

embedder_class, embedder_name, top = asyncio.run(run())
heavy = sorted(name for name in sys.modules if name.split(".")[0] in {heavy!r})
print(json.dumps({{"class": embedder_class, "name": embedder_name, "top": top, "heavy": heavy}}))
"""


def child_env(tmp_path: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("AMFS_")}
    env["AMFS_DATA_DIR"] = str(tmp_path / "store")
    env["AMFS_ML_MODEL_DIR"] = str(tmp_path / "ml")
    return env


def test_the_default_embedder_is_the_bundled_int8_onnx_minilm() -> None:
    assert DEFAULT_EMBEDDER == "chat-mpnet-onnx-int8"
    assert Settings().embedder == DEFAULT_EMBEDDER


def test_building_the_server_and_serving_a_write_and_a_retrieve_imports_no_torch(tmp_path: Path) -> None:
    script = SERVE_ONE_WRITE.format(heavy=set(HEAVY))
    done = subprocess.run([sys.executable, "-c", script], env=child_env(tmp_path), capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    from amfs_server.adapters.embedders import resolve_query_encoder

    # the default question side depends on the CPU: a second ONNX session (the mixed side) where it lacks VNNI
    two_sided = resolve_query_encoder(DEFAULT_EMBEDDER, "auto") == "mixed"
    assert report["class"] == ("TwoSidedEmbedder" if two_sided else "OnnxEmbedder") and report["name"] == DEFAULT_EMBEDDER
    assert report["top"] == "retry-policy"  # real semantic search answered
    assert report["heavy"] == []


def test_importing_the_cli_loads_no_heavy_module(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import amfs_server.server.cli"],
                          env=child_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines() if "|" in line}
    assert "amfs_server" in imported  # the import-time report is what we think it is
    assert imported.isdisjoint(HEAVY), sorted(imported & set(HEAVY))


# Imported only by what uses them: PostgreSQL stores, a configured LM, HTTP/SSE serving, the torch runtime.
NOT_ON_STDIO_START = (
    "asyncpg", "amfs_server.adapters.postgres", "amfs_server.ml.answer", "amfs_server.tools.answer_tools",
    "amfs_server.adapters.torch_embedder", "h11", "uvicorn.protocols.http.h11_impl",
)

# The console script's entry point, with the modules it imported written out when it exits, and nothing
# importable that the default install lacks (tests/server/default_install.py).
STDIO_SERVER = """
import atexit, json, sys
atexit.register(lambda: open({path!r}, "w").write(json.dumps(sorted(sys.modules))))
sys.path.insert(0, {guard_dir!r})
from default_install import block_outside_default_install
block_outside_default_install()
from amfs_server.server.cli import main
main()
"""


def test_the_stdio_server_answers_a_write_and_a_retrieve_importing_only_what_it_uses(tmp_path: Path) -> None:
    modules_file = tmp_path / "modules.json"
    env = child_env(tmp_path)
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "amfs_write", "arguments": {
            "entity_path": "svc/payments", "key": "retry-policy", "value": "retry the card authorisation 3 times"}}},
    ]
    retrieve = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "amfs_retrieve", "arguments": {
        "query": "how often do we retry a card payment?"}}}
    with open(tmp_path / "stderr.log", "w+") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", STDIO_SERVER.format(path=str(modules_file), guard_dir=str(Path(__file__).parent))],
            env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
        )
        assert process.stdin is not None and process.stdout is not None
        replies: queue.Queue[str] = queue.Queue()
        stdout = process.stdout
        threading.Thread(target=lambda: [replies.put(line) for line in stdout], daemon=True).start()
        try:
            process.stdin.write("".join(json.dumps(request) + "\n" for request in requests))
            process.stdin.flush()
            deadline = time.monotonic() + 240
            answered: dict[int, dict[str, Any]] = {}
            while 3 not in answered:
                reply = json.loads(replies.get(timeout=max(0.1, deadline - time.monotonic())))
                answered[reply.get("id")] = reply
                if reply.get("id") == 2:  # retrieve only once the write is in
                    process.stdin.write(json.dumps(retrieve) + "\n")
                    process.stdin.flush()
            assert answered[2]["result"]["isError"] is False, answered[2]
            retrieved = answered[3]["result"]
            assert retrieved["isError"] is False, retrieved
            assert retrieved["structuredContent"]["results"][0]["entry_key"] == "svc/payments/retry-policy", retrieved
            process.stdin.close()  # only now: the server cancels calls still in progress when stdin closes
            assert process.wait(timeout=60) == 0
        finally:
            process.kill()
            process.wait()
            stderr.seek(0)
            log = stderr.read()
    assert modules_file.exists(), log
    modules = set(json.loads(modules_file.read_text()))
    assert {"amfs_server.server.stdio", "onnxruntime"} <= modules  # the real stdio path, with the real embedder
    unwanted = set(HEAVY) | set(NOT_ON_STDIO_START)
    assert sorted(name for name in modules if name in unwanted or name.split(".")[0] in HEAVY) == []


@pytest.mark.parametrize("stack", ["fastmcp", "mcp", "starlette", "uvicorn"])
def test_importing_the_cli_leaves_the_mcp_stack_to_serve(tmp_path: Path, stack: str) -> None:
    """`amfs-server memory ...` needs no MCP stack, and `serve` starts loading the embedder before importing it."""
    script = f"import sys, amfs_server.server.cli; print({stack!r} in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], env=child_env(tmp_path), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
