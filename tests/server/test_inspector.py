"""The real MCP Inspector CLI (0.15.0, the last release that runs on Node 20) lists and calls the tools
over stdio. It exits 0 even when a tool fails, so the JSON it prints is what is checked."""

from __future__ import annotations

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

INSPECTOR = "@modelcontextprotocol/inspector@0.15.0"

pytestmark = pytest.mark.skipif(shutil.which("npx") is None, reason="npx (Node.js) is not installed")


@pytest.fixture
def inspect(tmp_path: Path, stdio_command: Any) -> Any:
    """`inspect(store, *inspector_args)`: the Inspector CLI's JSON, the server on store `tmp_path/store`."""
    # A wrapper script: the Inspector would read `python -c ...` as its own options.
    script = tmp_path / "amfs-server.sh"
    args = " ".join(f"'{arg}'" for arg in stdio_command.args)
    script.write_text(f'#!/bin/sh\nexec "{stdio_command.command}" {args} "$@"\n')
    script.chmod(0o755)

    def run(store: str, *method_args: str) -> dict[str, Any]:
        env_flags = ["-e", f"AMFS_DATA_DIR={tmp_path / store}", "-e", "AMFS_EMBEDDER=none"]
        completed = subprocess.run(
            ["npx", "-y", INSPECTOR, "--cli", *env_flags, str(script), *method_args],
            env=stdio_command.env, capture_output=True, text=True, timeout=240,
        )
        assert completed.returncode == 0, completed.stderr[-2000:]
        assert (tmp_path / store / "amfs.db").exists()  # the server ran on the test's store
        return json.loads(completed.stdout)

    return run


def test_inspector_lists_and_calls_the_tools_over_stdio(inspect: Any) -> None:
    invocations = {
        "list": ("--method", "tools/list"),
        "write": ("--method", "tools/call", "--tool-name", "amfs_write", "--tool-arg", "entity_path=svc",
                  "--tool-arg", "key=retry", "--tool-arg", "value=exponential backoff"),
        "missing": ("--method", "tools/call", "--tool-name", "amfs_read", "--tool-arg", "entity_path=svc",
                    "--tool-arg", "key=missing"),
    }
    with ThreadPoolExecutor(max_workers=len(invocations)) as pool:  # independent: each starts its own server and store
        futures = {name: pool.submit(inspect, name, *args) for name, args in invocations.items()}
        listed, written, missing = (futures[name].result() for name in invocations)

    names = {tool["name"] for tool in listed["tools"]}
    assert {"amfs_write", "amfs_read", "amfs_list", "amfs_commit_outcome", "amfs_forget"} <= names
    write = next(tool for tool in listed["tools"] if tool["name"] == "amfs_write")
    assert write["annotations"]["readOnlyHint"] is False and "outputSchema" in write

    assert written["isError"] is False
    assert written["structuredContent"]["entry_key"] == "svc/retry"

    assert missing["isError"] is True
    assert "amfs_retrieve" in missing["content"][0]["text"]
