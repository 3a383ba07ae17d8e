"""The default install has no torch: the default embedder is the bundled int8 ONNX MiniLM, and nothing on the
server's start path, nor a write and a retrieve with the default settings, imports torch, transformers, lightgbm
or matplotlib (each would also cost start-up time and memory). Checked in fresh interpreters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from amfs_server.core.embedding import DEFAULT_EMBEDDER
from amfs_server.server.settings import Settings

HEAVY = ("torch", "transformers", "lightgbm", "matplotlib", "scipy")

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
    assert DEFAULT_EMBEDDER == "all-MiniLM-L6-v2-onnx-int8"
    assert Settings().embedder == DEFAULT_EMBEDDER


def test_building_the_server_and_serving_a_write_and_a_retrieve_imports_no_torch(tmp_path: Path) -> None:
    script = SERVE_ONE_WRITE.format(heavy=set(HEAVY))
    done = subprocess.run([sys.executable, "-c", script], env=child_env(tmp_path), capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["class"] == "OnnxEmbedder" and report["name"] == DEFAULT_EMBEDDER
    assert report["top"] == "retry-policy"  # real semantic search answered
    assert report["heavy"] == []


def test_importing_the_cli_loads_no_heavy_module(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import amfs_server.server.cli"],
                          env=child_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines() if "|" in line}
    assert "amfs_server" in imported  # the import-time report is what we think it is
    assert imported.isdisjoint(HEAVY), sorted(imported & set(HEAVY))
